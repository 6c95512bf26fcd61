"""Derived figures, the CSV/JSON files and the plots of an allreduce run."""
from __future__ import annotations

import json
import os

import pandas as pd

MIB = 1 << 20


def derive(rows: list[dict]) -> pd.DataFrame:
    """Add bandwidths and the ratio to MPI_Allreduce at the same size and rank count.

    algbw = bytes / time; busbw = algbw * 2 (p-1) / p (the bytes each rank must
    move in a bandwidth-optimal allreduce, as NCCL reports it).
    """
    frame = pd.DataFrame(rows)
    frame["algbw_gbps"] = frame["bytes"] / frame["median_s"] / 1e9
    frame["busbw_gbps"] = frame["algbw_gbps"] * 2 * (frame["ranks"] - 1) / frame["ranks"]
    reference = frame[frame["implementation"] == "mpi4py_MPI_Allreduce"].set_index(["ranks", "bytes"])["median_s"]
    frame["speedup_vs_mpi"] = [reference[(r, b)] / t for r, b, t in zip(frame["ranks"], frame["bytes"],
                                                                         frame["median_s"])]
    # The memory bound of a 2-rank allreduce of private buffers: copy in,
    # reduce and copy out move about three buffers' worth per rank, at the
    # rate one memcpy reaches while every rank copies at once.
    frame["memory_bound_gbps"] = frame["bytes"] / (3 * frame["concurrent_memcpy_s"]) / 1e9
    frame["fraction_of_memory_bound"] = frame["algbw_gbps"] / frame["memory_bound_gbps"]
    return frame


def write(frame: pd.DataFrame, meta: dict, directory: str) -> list[str]:
    os.makedirs(directory, exist_ok=True)
    csv_path = os.path.join(directory, "allreduce.csv")
    frame.to_csv(csv_path, index=False)
    auto = frame[frame["implementation"] == "tnt_auto"]
    summary = {
        **meta,
        "auto_vs_mpi": [{"ranks": int(r.ranks), "bytes": int(r.bytes), "speedup": round(float(r.speedup_vs_mpi), 3),
                         "algorithm": r.auto_choice, "algbw_gbps": round(float(r.algbw_gbps), 3),
                         "fraction_of_memory_bound": (None if pd.isna(r.fraction_of_memory_bound)
                                                      else round(float(r.fraction_of_memory_bound), 3))}
                        for r in auto.itertuples()],
    }
    json_path = os.path.join(directory, "summary.json")
    with open(json_path, "w") as handle:
        json.dump(summary, handle, indent=2)
    return [csv_path, json_path] + plot(frame, directory)


def plot(frame: pd.DataFrame, directory: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for ranks, group in frame.groupby("ranks"):
        figure, (latency, bandwidth) = plt.subplots(1, 2, figsize=(12, 4.5))
        for name, rows in group.groupby("implementation"):
            style = dict(marker="o", linewidth=2.5 if name in ("tnt_auto", "mpi4py_MPI_Allreduce") else 1,
                         linestyle="-" if name.startswith("tnt") else "--")
            latency.plot(rows["bytes"], rows["median_s"] * 1e6, label=name, **style)
            bandwidth.plot(rows["bytes"], rows["algbw_gbps"], label=name, **style)
        for axis, label in ((latency, "median time per allreduce [us]"), (bandwidth, "algorithm bandwidth [GB/s]")):
            axis.set_xscale("log", base=2)
            axis.set_xlabel("message size [bytes]")
            axis.set_ylabel(label)
            axis.grid(True, which="both", alpha=0.3)
        latency.set_yscale("log")
        bandwidth.legend(fontsize=8)
        figure.suptitle(f"allreduce of float32, {ranks} ranks (tarantella engine vs MPI_Allreduce via mpi4py)")
        figure.tight_layout()
        for extension in ("png", "svg"):
            path = os.path.join(directory, f"allreduce_{ranks}ranks.{extension}")
            figure.savefig(path, dpi=110)
            paths.append(path)
        plt.close(figure)
    return paths
