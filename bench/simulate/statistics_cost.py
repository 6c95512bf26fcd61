"""What BatchNormalization over the global batch costs at scale, simulated: the step with global and with
local statistics (bench/simulate/step_model.py's `statistics` term) for a measured 1-device profile.

    python -m bench.simulate.statistics_cost PROFILE --model resnet50 --cluster supermuc_ng --devices 2,8,32,96

A profile measured before profiles listed their BatchNormalization layers gets them from the model itself
(built, not trained). Prints a markdown table.
"""
from __future__ import annotations

import argparse

from bench.simulate.cluster_profile import load_cluster_profile
from bench.simulate.model_profile import batch_norm_layers, load_profile
from bench.simulate.step_model import predict_step

__all__ = ["table"]


def table(profile: dict, cluster_name: str, device_counts: list[int]) -> str:
    cluster = load_cluster_profile(cluster_name)
    micro = int(profile["micro_batch"])
    lines = ["| devices | local (s/step) | global (s/step) | global / local | statistics allreduces "
             "| their time (s) |",
             "|---|---|---|---|---|---|"]
    for devices in device_counts:
        local = predict_step(profile, cluster, micro, devices, global_batch_norm=False)
        global_ = predict_step(profile, cluster, micro, devices)
        lines.append(f"| {devices} | {local.step_s:.4f} | {global_.step_s:.4f} | {global_.step_s / local.step_s:.3f} "
                     f"| {global_.statistics_allreduces} | {global_.statistics_s:.5f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--model", required=True, help="tnt-bench's name of the profiled model")
    parser.add_argument("--cluster", required=True)
    parser.add_argument("--devices", default="2,8,32,96")
    args = parser.parse_args(argv)
    profile = load_profile(args.profile)
    if "batch_norm" not in profile:
        from bench.models.registry import get_model_entry
        profile["batch_norm"] = batch_norm_layers(get_model_entry(args.model).build())
    print(f"{args.model} ({len(profile['batch_norm'])} BatchNormalization calls), micro-batch "
          f"{profile['micro_batch']}, cluster {args.cluster}")
    print(table(profile, args.cluster, [int(d) for d in args.devices.split(",")]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
