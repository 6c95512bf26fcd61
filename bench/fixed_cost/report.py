"""Figures and goals of the fixed-cost benchmark from its rows (bench/fixed_cost/__init__.py)."""
from __future__ import annotations

import statistics

__all__ = ["summarize", "markdown", "one_line", "ONE_RANK_GOAL", "ADDED_TIME_GOAL"]

ONE_RANK_GOAL = 0.03   # tnt x1 at most 3% above keras x1
ADDED_TIME_GOAL = 1.5  # tnt x2 - keras_each x2 at most 1.5 x the engine's allreduce of the gradient bytes
LABELS = {("keras", 1): "keras_x1", ("tnt", 1): "tnt_x1", ("keras", 2): "keras_each_x2", ("tnt", 2): "tnt_x2",
          ("tnt_metrics_after", 2): "tnt_metrics_after_x2"}
COLLECTIVE_FIGURES = ("engine_allreduce_s", "mpi_allreduce_s", "reducer_step_s", "memcpy_s")


def _run_step(row) -> float:
    """A run's step time: the median of every rank's timed steps pooled (ranks of a tnt run are in
    step; plain Keras ranks run free, so this is their typical step)."""
    return statistics.median(t for times in row["rank_step_times_s"] for t in times)


def _ratio(a, b):
    return a / b if a is not None and b else None


def summarize(rows) -> dict:
    """{"step_time": per model:micro-batch and configuration the median over runs (and the best run),
    "collectives": per model the median figures over runs, "goals": per model:micro-batch the two goals}."""
    per_run: dict[tuple, list[float]] = {}
    tails: dict[str, list[tuple[float, float]]] = {}  # tnt x2: (tail, busy) of each run's last step
    for row in rows:
        if row["mode"] == "collectives":
            continue
        key = (f"{row['model']}:{row['micro_batch']}", LABELS[(row["mode"], row["ranks"])])
        per_run.setdefault(key, []).append(_run_step(row))
        measured = [r for r in row.get("reducer_last_step") or [] if r]
        if (row["mode"], row["ranks"]) == ("tnt", 2) and measured:
            tails.setdefault(key[0], []).append((statistics.mean(r["tail_s"] for r in measured),
                                                 statistics.mean(r["busy_s"] for r in measured)))
    step_time = {}
    for (model, label), values in per_run.items():
        step_time.setdefault(model, {})[label] = {"median_s": statistics.median(values), "best_run_s": min(values),
                                                  "runs": len(values)}
    collectives: dict[str, dict] = {}
    for row in rows:
        if row["mode"] != "collectives":
            continue
        for entry in row["rows"]:
            into = collectives.setdefault(entry["model"], {"gradient_bytes": entry["gradient_bytes"],
                                                           "buckets": entry["buckets"],
                                                           "buckets_in_shared_memory": entry.get(
                                                               "buckets_in_shared_memory"),
                                                           "reducer_copies_per_byte": entry.get(
                                                               "reducer_copies_per_byte"),
                                                           "runs": []})
            into["runs"].append({key: entry[key] for key in COLLECTIVE_FIGURES})
    for model, into in collectives.items():
        for key in COLLECTIVE_FIGURES:
            into[key] = statistics.median(run[key] for run in into["runs"])
        into["reducer_throughput_gb_s"] = into["gradient_bytes"] / into["reducer_step_s"] / 1e9
        into["memcpy_throughput_gb_s"] = into["gradient_bytes"] / into["memcpy_s"] / 1e9
        # The reducer's step in units of one memcpy of the same bytes (both ranks copying at once).
        into["reducer_vs_memcpy"] = into["reducer_step_s"] / into["memcpy_s"]
    goals = {}
    for model, figures in step_time.items():
        value = lambda label: figures.get(label, {}).get("median_s")  # noqa: E731
        name = model.split(":")[0]
        allreduce = collectives.get(name, {}).get("engine_allreduce_s")
        overhead = _ratio(value("tnt_x1"), value("keras_x1"))
        added = (value("tnt_x2") - value("keras_each_x2")
                 if value("tnt_x2") is not None and value("keras_each_x2") is not None else None)
        goals[model] = {
            "one_rank_overhead": overhead - 1 if overhead is not None else None,
            "one_rank_goal_met": (overhead - 1 <= ONE_RANK_GOAL) if overhead is not None else None,
            "added_over_no_exchange_s": added,
            "engine_allreduce_s": allreduce,
            "added_vs_engine_allreduce": _ratio(added, allreduce),
            "two_rank_goal_met": (added <= ADDED_TIME_GOAL * allreduce) if added is not None and allreduce else None,
            "metric_fusion_saves_s": (value("tnt_metrics_after_x2") - value("tnt_x2")
                                      if value("tnt_metrics_after_x2") and value("tnt_x2") else None),
            # tnt x2's last timed step: reduction after the last hand-over (not hidden by backprop), and busy time
            "reduction_tail_s": statistics.median(t for t, _ in tails[model]) if tails.get(model) else None,
            "reduction_busy_s": statistics.median(b for _, b in tails[model]) if tails.get(model) else None,
        }
    return {"step_time": step_time, "collectives": collectives, "goals": goals,
            "goal_definitions": {"one_rank": f"tnt_x1 / keras_x1 - 1 <= {ONE_RANK_GOAL}",
                                 "two_ranks": f"tnt_x2 - keras_each_x2 <= {ADDED_TIME_GOAL} x engine_allreduce_s "
                                              f"(tnt.allreduce of the model's gradient bytes)"}}


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def _bytes(value) -> str:
    return f"{value / 1e6:.1f} MB" if value >= 1e5 else f"{value / 1e3:.1f} kB"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _verdict(met) -> str:
    return "-" if met is None else ("met" if met else "NOT met")


def markdown(summary) -> str:
    lines = ["Fixed per-step cost (median step time over runs; 1 thread per rank)", "",
             "| model:micro-batch | keras x1 | tnt x1 | 1-rank overhead (goal <= 3%) | keras each x2 | tnt x2 "
             "| added | engine allreduce | added / allreduce (goal <= 1.5) | reduction tail | metrics after x2 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, figures in summary["step_time"].items():
        value = lambda label: figures.get(label, {}).get("median_s")  # noqa: E731
        goal = summary["goals"][model]
        ratio = goal["added_vs_engine_allreduce"]
        lines.append(f"| {model} | {_ms(value('keras_x1'))} | {_ms(value('tnt_x1'))} | "
                     f"{_pct(goal['one_rank_overhead'])} {_verdict(goal['one_rank_goal_met'])} | "
                     f"{_ms(value('keras_each_x2'))} | {_ms(value('tnt_x2'))} | "
                     f"{_ms(goal['added_over_no_exchange_s'])} | {_ms(goal['engine_allreduce_s'])} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} {_verdict(goal['two_rank_goal_met'])} | "
                     f"{_ms(goal['reduction_tail_s'])} | {_ms(value('tnt_metrics_after_x2'))} |")
    lines += ["", "reduction tail: in tnt x2's last timed step (mean over ranks, median over runs), the time from the "
              "last hand-over to the reducer (last gradient or metric state) to the last reduced bucket: the "
              "reduction backprop did not hide; the rest of `added` is spent elsewhere (copies, waits, Python).",
              "", "Collectives at 2 ranks for each model's gradient bytes (float32; the slowest rank's median)", "",
              "| model | bytes | buckets | tnt.allreduce | MPI_Allreduce (mpi4py) | fused reducer step "
              "| memcpy | reducer GB/s | reducer / memcpy | copies per byte |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for model, c in summary["collectives"].items():
        copies = c.get("reducer_copies_per_byte")
        lines.append(f"| {model} | {_bytes(c['gradient_bytes'])} | {c['buckets']} | "
                     f"{_ms(c['engine_allreduce_s'])} | {_ms(c['mpi_allreduce_s'])} | {_ms(c['reducer_step_s'])} | "
                     f"{_ms(c['memcpy_s'])} | {c['reducer_throughput_gb_s']:.2f} | {c['reducer_vs_memcpy']:.2f} | "
                     f"{'-' if copies is None else f'{copies:.2f}'} |")
    lines += ["", "reducer / memcpy: the fused reducer's step (hand in and collect every gradient) in units of one "
              "memcpy of the same bytes, both ranks at once; its floor is the two copies of each byte plus the "
              "reduction (Note [Two copies per gradient byte] in csrc/engine/fused_reducer.hpp)."]
    return "\n".join(lines) + "\n"


def one_line(row) -> str:
    """A progress line per launch."""
    if row["mode"] == "collectives":
        parts = [f"{r['model']} allreduce {_ms(r['engine_allreduce_s'])} mpi {_ms(r['mpi_allreduce_s'])} "
                 f"reducer {_ms(r['reducer_step_s'])} memcpy {_ms(r['memcpy_s'])}" for r in row["rows"]]
        return f"collectives x{row['ranks']}: " + "; ".join(parts) + f" ({row['seconds']} s)"
    return (f"{row['model']}:{row['micro_batch']} {row['mode']} x{row['ranks']}: "
            f"median step {_ms(_run_step(row))} ({row['seconds']} s, load {row['load_average_1m']})")
