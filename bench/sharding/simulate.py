"""Issue 21 §3: how each ZeRO stage's step grows with N, in the simulator (Note [Simulated sharded step] in
bench/simulate/sharding_cost.py), and the simulator against the measured steps of bench.sharding.memory.

    python -m bench.sharding.simulate --measured results/sharding/mlp-8x4096 [--clusters supermuc_ng,hpc_da]
                                      [--devices 2,4,8,16,32,64,96]

The model of the measured run (its runs.jsonl names model, width, depth and global batch) is profiled in this
process on one intra-op thread, as each of 2 ranks computes here (bench/simulate/model_profile.py: forward and
backward measured at the global batch, the gradients in backprop's order; Adam's update timed alone). Writes
<measured>/simulated/: profile.json; validation.md, the predicted step of every stage at the measured rank counts
on this machine (bench/profiles/this_machine.toml, the global batch split as it was run) against the measured one;
<cluster>.md, each stage's predicted step at a fixed micro-batch (the measured run's per-rank batch at 2 ranks) on
the named cluster profiles, as a ratio to unsharded data parallelism.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics

from bench.machine import describe_machine, describe_source
from bench.simulate.cluster_profile import load_cluster_profile
from bench.simulate.model_profile import (fixed_and_per_example, gradient_timeline, measure_phases, median_time,
                                          save_profile)
from bench.simulate.sharding_cost import MODES, SPREAD_BYTES, predict_sharded_step
from bench.simulate.step_model import predict_step

STAGES = ("off",) + MODES


def measured_steps(directory: str) -> tuple[dict, dict]:
    """(the runs' model options, {(ranks, shard): median of the largest rank's step})."""
    with open(os.path.join(directory, "runs.jsonl"), encoding="utf-8") as handle:
        runs = [json.loads(line) for line in handle if line.strip()]
    steps = {}
    for run in runs:
        steps.setdefault((run["ranks"], run["shard"]), []).append(max(rank["step_s"] for rank in run["per_rank"]))
    first = runs[0]
    options = {key: first[key] for key in ("model", "width", "depth", "global_batch")}
    return options, {key: statistics.median(values) for key, values in steps.items()}


def profile_model(options: dict) -> dict:
    """The model's profile on one core, as each of 2 ranks on this machine computes (one intra-op thread): forward,
    backward, Adam's update (timed alone) and the gradients in backprop's order."""
    import keras
    import tensorflow as tf
    from bench.sharding import models
    tf.config.threading.set_intra_op_parallelism_threads(1)
    keras.utils.set_random_seed(1)
    model = models.build(options["model"], options["width"], options["depth"])
    batch = options["global_batch"]
    inputs, labels = models.random_data(options["model"], options["width"], batch)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    phases = measure_phases(model, loss, inputs, labels)
    optimizer = keras.optimizers.Adam(1e-4)
    optimizer.build(model.trainable_variables)
    gradients = [tf.ones_like(v) * 1e-6 for v in model.trainable_variables]
    update = tf.function(lambda: optimizer.apply(gradients, model.trainable_variables))
    update_s = median_time(lambda: (update(), optimizer.iterations.numpy()), 3)
    step_s = phases["forward_backward_s"] + update_s
    fixed_s, per_example_s = fixed_and_per_example(phases, batch, step_s)
    return {"model": f"sharding-{options['model']}", "precision": "float32", "micro_batch": batch,
            "step_s": step_s, "forward_s": phases["forward_s"], "backward_s": phases["backward_s"],
            "update_s": update_s, "per_example_s": per_example_s,
            "fixed_s": fixed_s, "phases": phases, "step_times_s": [],
            "gradients": gradient_timeline(model, inputs[:1]), "batch_norm": [],
            "threads": 1, "host": socket.gethostname()}


def predicted(profile: dict, cluster, micro_batch: int, devices: int, shard: str,
              spread_bytes: int = SPREAD_BYTES) -> float:
    if shard == "off":
        return predict_step(profile, cluster, micro_batch, devices).step_s
    return predict_sharded_step(profile, cluster, micro_batch, devices, shard, spread_bytes=spread_bytes).step_s


def validation_table(profile: dict, steps: dict, batch: int) -> str:
    cluster = load_cluster_profile("this_machine")
    lines = ["| ranks | shard | measured step (s) | predicted (s) | predicted / measured | measured of unsharded | "
             "predicted of unsharded |", "|---|---|---|---|---|---|---|"]
    for ranks in sorted({r for r, _ in steps if r > 1}):
        base_measured = steps.get((ranks, "off"))
        base_predicted = predicted(profile, cluster, batch // ranks, ranks, "off")
        for shard in STAGES:
            if (ranks, shard) not in steps:
                continue
            measured = steps[(ranks, shard)]
            guess = predicted(profile, cluster, batch // ranks, ranks, shard)
            lines.append(f"| {ranks} | {shard} | {measured:.3f} | {guess:.3f} | {guess / measured:.2f} | "
                         f"{measured / base_measured:.2f} | {guess / base_predicted:.2f} |")
    return "\n".join(lines) + "\n"


def growth_table(profile: dict, cluster_name: str, devices: list[int], micro_batch: int) -> str:
    """Each stage's step as run (large variables spread, Note [Spread transfers]) and with every variable whole."""
    cluster = load_cluster_profile(cluster_name)
    lines = [f"Cluster profile {cluster.name} ({cluster.description}); micro-batch {micro_batch} per rank. "
             f"Each stage: step (s), of unsharded, and of unsharded with every variable sent whole "
             f"(--shard-spread above the largest variable).", "",
             "| devices | unsharded step (s) | " + " | ".join(f"{s} (s) | of unsharded | whole" for s in MODES) + " |",
             "|---|---|" + "---|---|---|" * len(MODES)]
    for count in [d for d in devices if d <= cluster.max_devices]:
        base = predicted(profile, cluster, micro_batch, count, "off")
        cells = []
        for shard in MODES:
            step = predicted(profile, cluster, micro_batch, count, shard)
            whole = predicted(profile, cluster, micro_batch, count, shard, spread_bytes=2 ** 62)
            cells.append(f"{step:.3f} | {step / base:.2f} | {whole / base:.2f}")
        lines.append(f"| {count} | {base:.3f} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--measured", required=True, help="a folder bench.sharding.memory wrote (runs.jsonl)")
    parser.add_argument("--clusters", default="supermuc_ng,hpc_da")
    parser.add_argument("--devices", default="2,4,8,16,32,64,96")
    options = parser.parse_args()
    model_options, steps = measured_steps(options.measured)
    out = os.path.join(options.measured, "simulated")
    os.makedirs(out, exist_ok=True)
    profile = profile_model(model_options)
    save_profile(profile, os.path.join(out, "profile.json"))
    context = (f"Machine: {json.dumps(describe_machine())}\n\nSource: {json.dumps(describe_source())}\n\n"
               f"Profile: {json.dumps({k: v for k, v in profile.items() if k != 'gradients'})}\n\n")
    batch = model_options["global_batch"]
    with open(os.path.join(out, "validation.md"), "w", encoding="utf-8") as handle:
        handle.write("# Predicted against measured steps, this machine\n\n" + context
                     + validation_table(profile, steps, batch))
    devices = [int(d) for d in options.devices.split(",")]
    for name in options.clusters.split(","):
        with open(os.path.join(out, f"{name}.md"), "w", encoding="utf-8") as handle:
            handle.write(f"# Predicted step per stage, {name}\n\n" + context
                         + growth_table(profile, name, devices, max(batch // 2, 1)))
    print(open(os.path.join(out, "validation.md"), encoding="utf-8").read().split("\n\n")[-1])
    for name in options.clusters.split(","):
        print(open(os.path.join(out, f"{name}.md"), encoding="utf-8").read().split("\n\n", 4)[-1])


if __name__ == "__main__":
    main()
