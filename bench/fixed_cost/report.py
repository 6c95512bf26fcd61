"""Figures and goals of the fixed-cost benchmark from its rows (bench/fixed_cost/__init__.py)."""
from __future__ import annotations

import statistics

__all__ = ["summarize", "markdown", "one_line", "ONE_RANK_GOAL", "ADDED_TIME_GOAL"]

ONE_RANK_GOAL = 0.03   # tnt x1 at most 3% above keras x1
ADDED_TIME_GOAL = 1.5  # tnt x2 - keras_each x2 at most 1.5 x the engine's allreduce of the gradient bytes
LABELS = {("keras", 1): "keras_x1", ("tnt", 1): "tnt_x1", ("keras", 2): "keras_each_x2", ("tnt", 2): "tnt_x2",
          ("tnt_metrics_after", 2): "tnt_metrics_after_x2"}
COLLECTIVE_FIGURES = ("engine_allreduce_s", "mpi_allreduce_s", "reducer_step_s", "memcpy_s", "barrier_s")


def _run_step(row) -> float:
    """A run's step time: the median of every rank's timed steps pooled (ranks of a tnt run are in
    step; plain Keras ranks run free, so this is their typical step)."""
    return statistics.median(t for times in row["rank_step_times_s"] for t in times)


def _ratio(a, b):
    return a / b if a is not None and b else None


def _pairs(rows) -> dict[tuple[str, int], list[dict[str, float]]]:
    """{(model:micro-batch, ranks): [{"keras": s, "tnt": s, "lockstep": s} per pair of every paired run]}, each
    the mean over ranks of that rank's median step in the pair's fit (lockstep: runs from before it was
    measured lack it)."""
    pairs: dict[tuple[str, int], list[dict[str, float]]] = {}
    for row in rows:
        if row["mode"] != "paired":
            continue
        per_rank = row["rank_pairs"]
        for index in range(len(per_rank[0])):
            fits = [fit for fit in ("keras", "tnt", "lockstep") if fit in per_rank[0][index]]
            pair = {fit: statistics.mean(rank[index][fit] for rank in per_rank) for fit in fits}
            pairs.setdefault((f"{row['model']}:{row['micro_batch']}", row["ranks"]), []).append(pair)
    return pairs


def _paired_figures(pairs) -> dict:
    """Medians over pairs: Keras's step, tnt's step, tnt / Keras - 1 and tnt - Keras; where measured, the
    lockstep Keras fit's step and what it adds over Keras (the cost of running in lockstep alone)."""
    if not pairs:
        return {}
    figures = {"pairs": len(pairs), "keras_s": statistics.median(p["keras"] for p in pairs),
               "tnt_s": statistics.median(p["tnt"] for p in pairs),
               "overhead": statistics.median(p["tnt"] / p["keras"] - 1 for p in pairs),
               "added_s": statistics.median(p["tnt"] - p["keras"] for p in pairs)}
    locked = [p for p in pairs if "lockstep" in p]
    if locked:
        figures.update(lockstep_s=statistics.median(p["lockstep"] for p in locked),
                       lockstep_added_s=statistics.median(p["lockstep"] - p["keras"] for p in locked))
    return figures


def _exchange_floor(allreduce_s, lockstep_added_s, barrier_s):
    """The least a synchronous gradient exchange can add to a step at 2 ranks: the wait for the slower rank
    that running in lockstep costs (the lockstep fit's added time without its barrier's own latency), and at
    least the allreduce itself, though not both: the allreduce may run while a rank would wait. None where
    not measured."""
    if allreduce_s is None or lockstep_added_s is None or barrier_s is None:
        return None
    return max(allreduce_s, lockstep_added_s - barrier_s)


def summarize(rows) -> dict:
    """{"step_time": per model:micro-batch and configuration the median over runs (and the best run),
    "collectives": per model the median figures over runs, "goals": per model:micro-batch the two goals}."""
    per_run: dict[tuple, list[float]] = {}
    tails: dict[str, list[tuple[float, float]]] = {}  # tnt x2: (tail, busy) of each run's last step
    paired = _pairs(rows)
    for row in rows:
        if row["mode"] in ("collectives", "paired"):
            continue
        key = (f"{row['model']}:{row['micro_batch']}", LABELS[(row["mode"], row["ranks"])])
        per_run.setdefault(key, []).append(_run_step(row))
        measured = [r for r in row.get("reducer_last_step") or [] if r]
        if (row["mode"], row["ranks"]) == ("tnt", 2) and measured:
            tails.setdefault(key[0], []).append((statistics.mean(r["tail_s"] for r in measured),
                                                 statistics.mean(r["busy_s"] for r in measured)))
    for row in rows:
        measured = [r for r in row.get("reducer_last_step") or [] if r]
        if (row["mode"], row["ranks"]) == ("paired", 2) and measured:
            tails.setdefault(f"{row['model']}:{row['micro_batch']}", []).append(
                (statistics.mean(r["tail_s"] for r in measured), statistics.mean(r["busy_s"] for r in measured)))
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
            into["runs"].append({key: entry[key] for key in COLLECTIVE_FIGURES if key in entry})
    for model, into in collectives.items():
        for key in COLLECTIVE_FIGURES:
            measured = [run[key] for run in into["runs"] if key in run]
            into[key] = statistics.median(measured) if measured else None
        into["reducer_throughput_gb_s"] = into["gradient_bytes"] / into["reducer_step_s"] / 1e9
        into["memcpy_throughput_gb_s"] = into["gradient_bytes"] / into["memcpy_s"] / 1e9
        # The reducer's step in units of one memcpy of the same bytes (both ranks copying at once).
        into["reducer_vs_memcpy"] = into["reducer_step_s"] / into["memcpy_s"]
    goals = {}
    for model in list(step_time) + [m for m, _ in paired if m not in step_time]:
        figures = step_time.get(model, {})
        value = lambda label: figures.get(label, {}).get("median_s")  # noqa: E731
        name = model.split(":")[0]
        allreduce = collectives.get(name, {}).get("engine_allreduce_s")
        one_paired, two_paired = _paired_figures(paired.get((model, 1))), _paired_figures(paired.get((model, 2)))
        ratio = _ratio(value("tnt_x1"), value("keras_x1"))
        separate_overhead = ratio - 1 if ratio is not None else None
        separate_added = (value("tnt_x2") - value("keras_each_x2")
                          if value("tnt_x2") is not None and value("keras_each_x2") is not None else None)
        # The goals take the paired figures where measured (side by side in one process), else separate launches.
        overhead = one_paired.get("overhead", separate_overhead)
        added = two_paired.get("added_s", separate_added)
        floor = _exchange_floor(allreduce, two_paired.get("lockstep_added_s"),
                                collectives.get(name, {}).get("barrier_s"))
        goals[model] = {
            "measured_by": {"one_rank": "paired" if one_paired else "separate launches",
                            "two_ranks": "paired" if two_paired else "separate launches"},
            "one_rank_overhead": overhead,
            "one_rank_goal_met": (overhead <= ONE_RANK_GOAL) if overhead is not None else None,
            "added_over_no_exchange_s": added,
            "separate_launches": {"one_rank_overhead": separate_overhead, "added_over_no_exchange_s": separate_added},
            "paired": {"one_rank": one_paired, "two_ranks": two_paired},
            "engine_allreduce_s": allreduce,
            "added_vs_engine_allreduce": _ratio(added, allreduce),
            "two_rank_goal_met": (added <= ADDED_TIME_GOAL * allreduce) if added is not None and allreduce else None,
            "lockstep_added_s": two_paired.get("lockstep_added_s"),
            "lockstep_call_s": one_paired.get("lockstep_added_s"),
            "exchange_floor_s": floor,
            "floor_vs_engine_allreduce": _ratio(floor, allreduce),
            "metric_fusion_saves_s": (value("tnt_metrics_after_x2") - value("tnt_x2")
                                      if value("tnt_metrics_after_x2") and value("tnt_x2") else None),
            # tnt x2's last timed step: reduction after the last hand-over (not hidden by backprop), and busy time
            "reduction_tail_s": statistics.median(t for t, _ in tails[model]) if tails.get(model) else None,
            "reduction_busy_s": statistics.median(b for _, b in tails[model]) if tails.get(model) else None,
        }
    return {"step_time": step_time, "collectives": collectives, "goals": goals,
            "goal_definitions": {"one_rank": f"tnt_x1 / keras_x1 - 1 <= {ONE_RANK_GOAL}",
                                 "two_ranks": f"tnt_x2 - keras_each_x2 <= {ADDED_TIME_GOAL} x engine_allreduce_s "
                                              f"(tnt.allreduce of the model's gradient bytes)",
                                 "measured_by": "the median over pairs of paired launches (Keras and tnt "
                                                "alternating in one process) where run, else the medians of "
                                                "separate launches"}}


def _ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} ms"


def _signed_ms(value) -> str:
    return "-" if value is None else f"{value * 1e3:+.2f} ms"


def _signed_us(value) -> str:
    return "-" if value is None else f"{value * 1e6:+.0f} us"


def _us(value) -> str:
    return "-" if value is None else f"{value * 1e6:.0f} us"


def _bytes(value) -> str:
    return f"{value / 1e6:.1f} MB" if value >= 1e5 else f"{value / 1e3:.1f} kB"


def _pct(value) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _verdict(met) -> str:
    return "-" if met is None else ("met" if met else "NOT met")


def _by(goal, which: str) -> str:
    return " (paired)" if goal.get("measured_by", {}).get(which) == "paired" else ""


def markdown(summary) -> str:
    lines = ["Fixed per-step cost (median step time over runs; 1 thread per rank). The goal columns take the "
             "paired figures (Keras and tnt.Model alternating in one process, table below) where measured, "
             "marked (paired); the step-time columns are separate launches.", "",
             "| model:micro-batch | keras x1 | tnt x1 | 1-rank overhead (goal <= 3%) | keras each x2 | tnt x2 "
             "| added | engine allreduce | added / allreduce (goal <= 1.5) | reduction tail | metrics after x2 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for model, goal in summary["goals"].items():
        figures = summary["step_time"].get(model, {})
        value = lambda label: figures.get(label, {}).get("median_s")  # noqa: E731
        ratio = goal["added_vs_engine_allreduce"]
        lines.append(f"| {model} | {_ms(value('keras_x1'))} | {_ms(value('tnt_x1'))} | "
                     f"{_pct(goal['one_rank_overhead'])} {_verdict(goal['one_rank_goal_met'])}{_by(goal, 'one_rank')} | "
                     f"{_ms(value('keras_each_x2'))} | {_ms(value('tnt_x2'))} | "
                     f"{_ms(goal['added_over_no_exchange_s'])}{_by(goal, 'two_ranks')} | "
                     f"{_ms(goal['engine_allreduce_s'])} | "
                     f"{'-' if ratio is None else f'{ratio:.2f}'} {_verdict(goal['two_rank_goal_met'])} | "
                     f"{_ms(goal['reduction_tail_s'])} | {_ms(value('tnt_metrics_after_x2'))} |")
    paired_rows = [(model, goal["paired"]) for model, goal in summary["goals"].items()
                   if goal.get("paired", {}).get("one_rank") or goal.get("paired", {}).get("two_ranks")]
    if paired_rows:
        lines += ["", "Paired: Keras and tnt.Model in one process per rank, fits alternating (medians over pairs; "
                  "overhead and added are per pair, then the median)", "",
                  "| model:micro-batch | pairs x1 | keras x1 | tnt x1 | 1-rank overhead | pairs x2 | keras each x2 "
                  "| tnt x2 | added |", "|---|---|---|---|---|---|---|---|---|"]
        for model, paired in paired_rows:
            one, two = paired.get("one_rank") or {}, paired.get("two_ranks") or {}
            lines.append(f"| {model} | {one.get('pairs', '-')} | {_ms(one.get('keras_s'))} | {_ms(one.get('tnt_s'))} "
                         f"| {_pct(one.get('overhead'))} | {two.get('pairs', '-')} | {_ms(two.get('keras_s'))} | "
                         f"{_ms(two.get('tnt_s'))} | {_ms(two.get('added_s'))} |")
    floor_rows = [(model, goal) for model, goal in summary["goals"].items() if goal.get("lockstep_added_s") is not None]
    if floor_rows:
        lines += ["", "Lockstep: the Keras fit of the paired runs with a barrier after every step (no data moved), "
                  "against the same fit running free; medians over pairs. A synchronous exchange, however fast, "
                  "makes every step wait for the slower rank (lockstep x2's added time less the barrier's own "
                  "latency) and costs at least its allreduce, which may run while a rank would wait: the floor is "
                  "the larger of the two. Lockstep x1 is the callback's own cost at one rank.", "",
                  "| model:micro-batch | lockstep x1 added | lockstep x2 added | barrier | engine allreduce "
                  "| floor | floor / allreduce | tnt added | tnt added / allreduce |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for model, goal in floor_rows:
            barrier = summary["collectives"].get(model.split(":")[0], {}).get("barrier_s")
            floor_ratio, ratio = goal["floor_vs_engine_allreduce"], goal["added_vs_engine_allreduce"]
            lines.append(f"| {model} | {_us(goal['lockstep_call_s'])} | {_us(goal['lockstep_added_s'])} | "
                         f"{_us(barrier)} | {_us(goal['engine_allreduce_s'])} | {_us(goal['exchange_floor_s'])} | "
                         f"{'-' if floor_ratio is None else f'{floor_ratio:.2f}'} | "
                         f"{_us(goal['added_over_no_exchange_s'])} | {'-' if ratio is None else f'{ratio:.2f}'} |")
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
    if row["mode"] == "paired":
        figures = _paired_figures(_pairs([row]).popitem()[1])
        return (f"{row['model']}:{row['micro_batch']} paired x{row['ranks']}: keras {_ms(figures['keras_s'])} "
                f"tnt {_ms(figures['tnt_s'])} ({_pct(figures['overhead'])}, {_signed_ms(figures['added_s'])}) "
                f"lockstep {_signed_us(figures.get('lockstep_added_s'))} "
                f"({row['seconds']} s, load {row['load_average_1m']})")
    if row["mode"] == "collectives":
        parts = [f"{r['model']} allreduce {_ms(r['engine_allreduce_s'])} mpi {_ms(r['mpi_allreduce_s'])} "
                 f"reducer {_ms(r['reducer_step_s'])} memcpy {_ms(r['memcpy_s'])}" for r in row["rows"]]
        return f"collectives x{row['ranks']}: " + "; ".join(parts) + f" ({row['seconds']} s)"
    return (f"{row['model']}:{row['micro_batch']} {row['mode']} x{row['ranks']}: "
            f"median step {_ms(_run_step(row))} ({row['seconds']} s, load {row['load_average_1m']})")
