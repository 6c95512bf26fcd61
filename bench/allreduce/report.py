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
    if "layout" not in frame:
        frame["layout"] = frame["ranks"].astype(str)
    frame["layout"] = frame["layout"].astype(str)
    frame["algbw_gbps"] = frame["bytes"] / frame["median_s"] / 1e9
    frame["busbw_gbps"] = frame["algbw_gbps"] * 2 * (frame["ranks"] - 1) / frame["ranks"]
    reference = frame[frame["implementation"] == "mpi4py_MPI_Allreduce"].set_index(["layout", "bytes"])["median_s"]
    frame["speedup_vs_mpi"] = [reference[(lay, b)] / t for lay, b, t in zip(frame["layout"], frame["bytes"],
                                                                           frame["median_s"])]
    # Bytes the busiest host sent over its link per allreduce, against the
    # bandwidth-optimal 2(H-1)/H x size (namespace-cluster runs only).
    if "link_bytes_minimum" in frame:
        frame["link_bytes_vs_minimum"] = frame["link_bytes_max_host"] / frame["link_bytes_minimum"]
    # Packets the busiest host sent per allreduce against MPI_Allreduce's: the
    # per-message cost, which (unlike the times) the machine's load hardly
    # changes below 1 MiB (larger messages' TCP segments vary with timing).
    if "link_packets_max_host" in frame:
        packets = frame[frame["implementation"] == "mpi4py_MPI_Allreduce"].set_index(
            ["layout", "bytes"])["link_packets_max_host"]
        frame["link_packets_vs_mpi"] = [t / packets[(lay, b)] if packets[(lay, b)] > 0 else float("nan")
                                        for lay, b, t in zip(frame["layout"], frame["bytes"],
                                                             frame["link_packets_max_host"])]
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
    fastest = _fastest_engine_algorithms(frame)
    summary = {
        **meta,
        "auto_vs_mpi": [{"layout": r.layout, "ranks": int(r.ranks), "bytes": int(r.bytes),
                         "speedup": round(float(r.speedup_vs_mpi), 3),
                         "algorithm": r.auto_choice, "algbw_gbps": round(float(r.algbw_gbps), 3),
                         "fraction_of_memory_bound": (None if pd.isna(r.fraction_of_memory_bound)
                                                      else round(float(r.fraction_of_memory_bound), 3)),
                         "link_bytes_vs_minimum": _rounded(getattr(r, "link_bytes_vs_minimum", None)),
                         "link_packets_vs_mpi": _rounded(getattr(r, "link_packets_vs_mpi", None)),
                         "load_average_1min": _rounded(getattr(r, "load_average_1min", None)),
                         # Is `auto`'s table right here? The fastest algorithm asked for by name, and
                         # how much faster it was than auto (1.0: auto picked it or ran as fast).
                         **fastest.get((r.layout, int(r.bytes)), {})}
                        for r in auto.itertuples()],
        # The goals, from 64 KiB up: auto at least as fast as MPI_Allreduce; link bytes within 10 %.
        "goals_from_64KiB": _goals(auto[auto["bytes"] >= 64 << 10]),
    }
    json_path = os.path.join(directory, "summary.json")
    with open(json_path, "w") as handle:
        json.dump(summary, handle, indent=2)
    return [csv_path, json_path] + plot(frame, directory)


def _fastest_engine_algorithms(frame: pd.DataFrame) -> dict:
    """(layout, bytes) -> the fastest engine algorithm asked for by name and its speed-up over auto."""
    named = frame[frame["implementation"].str.startswith("tnt_") & (frame["implementation"] != "tnt_auto")]
    auto = frame[frame["implementation"] == "tnt_auto"].set_index(["layout", "bytes"])["median_s"]
    fastest = {}
    for (layout, nbytes), group in named.groupby(["layout", "bytes"]):
        best = group.loc[group["median_s"].idxmin()]
        entry = {"fastest_algorithm": best["implementation"][len("tnt_"):]}
        if (layout, nbytes) in auto.index:
            entry["fastest_vs_auto"] = _rounded(auto[(layout, nbytes)] / best["median_s"])
        fastest[(layout, int(nbytes))] = entry
    return fastest


def _rounded(value, digits=3):
    return None if value is None or pd.isna(value) else round(float(value), digits)


def _goals(rows: pd.DataFrame) -> dict:
    goals = {}
    for layout, group in rows.groupby("layout"):
        entry = {"auto_at_least_as_fast_as_mpi": bool((group["speedup_vs_mpi"] >= 1.0).all()),
                 "slowest_speedup": _rounded(group["speedup_vs_mpi"].min())}
        if "link_bytes_vs_minimum" in group and group["link_bytes_vs_minimum"].notna().any():
            entry["link_bytes_within_10_percent"] = bool((group["link_bytes_vs_minimum"] <= 1.10).all())
            entry["worst_link_bytes_vs_minimum"] = _rounded(group["link_bytes_vs_minimum"].max())
        goals[str(layout)] = entry
    return goals


def plot(frame: pd.DataFrame, directory: str) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for layout, group in frame.groupby("layout"):
        ranks = int(group["ranks"].iloc[0])
        link = "link_bytes_vs_minimum" in group and group["link_bytes_vs_minimum"].notna().any()
        figure, axes = plt.subplots(1, 3 if link else 2, figsize=(18 if link else 12, 4.5))
        latency, bandwidth = axes[0], axes[1]
        for name, rows in group.groupby("implementation"):
            style = dict(marker="o", linewidth=2.5 if name in ("tnt_auto", "mpi4py_MPI_Allreduce") else 1,
                         linestyle="-" if name.startswith("tnt") else "--")
            latency.plot(rows["bytes"], rows["median_s"] * 1e6, label=name, **style)
            bandwidth.plot(rows["bytes"], rows["algbw_gbps"], label=name, **style)
            if link:
                axes[2].plot(rows["bytes"], rows["link_bytes_vs_minimum"], label=name, **style)
        labelled = [(latency, "median time per allreduce [us]"), (bandwidth, "algorithm bandwidth [GB/s]")]
        if link:
            axes[2].axhline(1.1, color="grey", linestyle=":", label="goal: 1.1 x minimum")
            labelled.append((axes[2], "bytes the busiest host sent / 2(H-1)/H x size"))
        for axis, label in labelled:
            axis.set_xscale("log", base=2)
            axis.set_xlabel("message size [bytes]")
            axis.set_ylabel(label)
            axis.grid(True, which="both", alpha=0.3)
        latency.set_yscale("log")
        bandwidth.legend(fontsize=8)
        where = f"{layout} (hosts x ranks)" if "x" in str(layout) else f"{ranks} ranks"
        figure.suptitle(f"allreduce of float32, {where} (tarantella engine vs MPI_Allreduce via mpi4py)")
        figure.tight_layout()
        for extension in ("png", "svg"):
            name = f"allreduce_{layout}.{extension}" if "x" in str(layout) else f"allreduce_{ranks}ranks.{extension}"
            path = os.path.join(directory, name)
            figure.savefig(path, dpi=110)
            paths.append(path)
        plt.close(figure)
    return paths
