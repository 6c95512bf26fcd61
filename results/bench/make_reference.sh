#!/usr/bin/env bash
# The commands that made the reference results in this directory (run from the repo root).
# Simulated: 1..96 devices on the seeds' clusters, from 1-device profiles measured here.
# Measured: this machine, 1 and 2 ranks, and 4 ranks oversubscribed (2 cores), 10 timed
# steps after 2 warm-up steps; each measured sweep is also predicted with the
# this_machine profile, giving validation.csv. runs.csv records the load average of the
# machine after each run: other work on it slows the measured steps.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=results/bench
run() { echo "+ tnt-bench $*" >&2; python -m bench "$@"; }

# 1-device profiles of the full-size models (10 steps, so that a profile carries its own step-time
# spread; the HPC-DA and SuperMUC-NG profiles state the 10-step spread of resnet50_small_tnt).
run scaling --model resnet50 --devices 1 --micro-batch 8 --steps 10 --warmup-steps 1 --no-plots \
    --out $out/resnet50_profile
run scaling --model transformer --devices 1 --micro-batch 8 --steps 10 --warmup-steps 1 --no-plots \
    --out $out/transformer_profile
# Micro-batches as in the seeds: 64 per GPU, 256 per CPU process.
for cluster in hpc_da supermuc_ng; do
  micro=64; [ $cluster = supermuc_ng ] && micro=256
  run scaling --model resnet50 --devices 1..96 --simulate --cluster $cluster --micro-batch $micro \
      --model-profile $out/resnet50_profile/profile.json --out $out/resnet50_${cluster}_simulated
  run scaling --model transformer --devices 1..96 --simulate --cluster $cluster \
      --model-profile $out/transformer_profile/profile.json --out $out/transformer_${cluster}_simulated
done
run plot $out/resnet50_hpc_da_simulated $out/resnet50_supermuc_ng_simulated --out $out/resnet50_clusters
run plot $out/transformer_hpc_da_simulated $out/transformer_supermuc_ng_simulated --out $out/transformer_clusters

run scaling --model resnet50_small --micro-batch 32 --devices 1,2,4 --oversubscribe --steps 10 \
    --warmup-steps 2 --cluster this_machine --out $out/resnet50_small_tnt
# Out of sample: predicted from the 1-rank data only (results/validation/README.md).
run validate $out/resnet50_small_tnt --cluster this_machine
run scaling --model transformer_small --devices 1,2,4 --oversubscribe --steps 10 --warmup-steps 2 \
    --cluster this_machine --out $out/transformer_small_tnt
run scaling --model resnet50_small --micro-batch 32 --framework keras --devices 1,2 --steps 10 \
    --warmup-steps 2 --out $out/resnet50_small_keras
run plot $out/resnet50_small_tnt $out/resnet50_small_keras --out $out/resnet50_small_tnt_vs_keras

# Time to accuracy of the mini benchmark (tnt.Model), MLPerf style.
run train --benchmark mini_digits -n 1 --out $out/train_mini_digits_1dev
run train --benchmark mini_digits -n 2 --out $out/train_mini_digits_2dev

# Published results of another system (no runs): Horovod's benchmark efficiencies.
run validate --published horovod --out results/validation/horovod
