"""What exact mode costs: step times of the same runs in two `tnt-repro check` reports.

    python -m repro.exact_cost results/repro/mlp_numpy-tolerance/report.json \\
                               results/repro/mlp_numpy-exact/report.json [--out cost.json]

For every run present in both reports (serial, N devices), the median step time
(the recorder's wall time of each step after the first, which traces) in normal
and in exact mode, and their ratio. The JSON names both reports, so it can be
traced back to the machine and commit they describe.
"""
from __future__ import annotations

import argparse
import json
import sys

__all__ = ["compare_reports", "main"]


def _runs(report: dict) -> dict[str, dict]:
    return {run["name"]: run for run in report["runs"]
            if run["role"] in ("reference", "distributed") and run["median_step_seconds"]}


def compare_reports(normal: dict, exact: dict) -> list[dict]:
    rows = []
    exact_runs = _runs(exact)
    for name, run in _runs(normal).items():
        if name in exact_runs:
            a, b = run["median_step_seconds"], exact_runs[name]["median_step_seconds"]
            rows.append({"run": name, "devices": run["devices"], "normal_median_step_ms": round(a * 1e3, 3),
                         "exact_median_step_ms": round(b * 1e3, 3), "slowdown": round(b / a, 2)})
    return sorted(rows, key=lambda row: (row["run"] != "serial", row["devices"]))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m repro.exact_cost", description=__doc__.splitlines()[0])
    parser.add_argument("normal_report")
    parser.add_argument("exact_report")
    parser.add_argument("--out")
    args = parser.parse_args(argv)
    with open(args.normal_report) as a, open(args.exact_report) as b:
        normal, exact = json.load(a), json.load(b)
    if exact["options"]["mode"] != "exact" or normal["options"]["mode"] != "tolerance":
        print("python -m repro.exact_cost: error: expected a tolerance-mode report, then an exact-mode one",
              file=sys.stderr)
        return 2
    rows = compare_reports(normal, exact)
    for row in rows:
        print(f"{row['run']:<12} normal {row['normal_median_step_ms']:8.2f} ms  exact "
              f"{row['exact_median_step_ms']:8.2f} ms  x{row['slowdown']:.2f}")
    if args.out:
        document = {"normal_report": args.normal_report, "exact_report": args.exact_report,
                    "virtual_batches": exact["options"]["virtual_batches"], "script": exact["options"]["script"],
                    "machine": exact.get("machine"), "source": exact.get("source"), "rows": rows}
        with open(args.out, "w") as handle:
            json.dump(document, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
