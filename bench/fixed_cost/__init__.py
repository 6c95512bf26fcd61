"""Fixed per-step cost of tnt.Model, every configuration side by side in one run (issue 10 §3):

    python -m bench.fixed_cost [--models mlp8x512:128 mlp8x512:32 digits_mlp:32 resnet50_small:16]
                               [--repeats 3] [--pairs 4] [--steps N] [--warmup-steps N]
                               [--configs MODE:RANKS ...] [--out results/fixed_cost]

Configurations per model and micro-batch (one intra-op and one inter-op thread per rank, the same
micro-batch on every rank, the runs interleaved and repeated):
  keras x1         plain Keras 3 fit on one rank: the baseline
  tnt x1           tnt.Model on one rank                      -> goal: within 3% of keras x1
  keras_each x2    plain Keras on both ranks at once, no gradient exchange: the fair baseline
                   on a shared node (both ranks compete for cores and memory bandwidth)
  tnt x2           tnt.Model on two ranks                     -> goal: tnt x2 - keras_each x2 at most
                                                                 1.5 x the engine's allreduce time
  paired x1, paired x2
                   plain Keras and tnt.Model in ONE process per rank, their fits alternating --pairs
                   times (at 2 ranks both ranks' Keras fits run at once, no exchange; Keras fits the
                   tnt.Model's wrapped model, so both update the same variables and optimizer state:
                   two separately built copies of a model differ by up to 4% in step time): per pair
                   tnt / Keras - 1 and tnt - Keras. Separate launches of
                   one configuration differ by several % from launch to launch on the small models
                   (memory layout, which core, the moment), which the difference of two launches keeps;
                   a pair sees the same process and moment. The goals take the median over pairs where
                   these ran (marked "(paired)" in summary.md), else the separate launches' medians.
                   A third fit per pair, lockstep, is the Keras fit with a barrier after every step
                   (no data moved): what it adds at 2 ranks is the wait for the slower rank that any
                   synchronous exchange pays, however fast; the larger of that wait and the engine's
                   allreduce (which may run while a rank would wait) is the floor of the added time
                   (the "Lockstep" table; at 1 rank, the callback's cost)
  tnt_metrics_after x2
                   tnt.Model with the metric state reduced after the gradients, as before
                   Note [Metric state rides with the gradients] (only with --configs)
  collectives x2   for each model's gradient bytes (float32): the engine's allreduce (tnt.allreduce,
                   auto algorithm), MPI_Allreduce through mpi4py, one step of the fused reducer on the
                   model's own gradient set (its tensors, the default 32 KiB buckets, marked ready and
                   collected from numpy) and one memcpy of the same bytes on both ranks at once (the
                   memory-copy bound); the reducer's throughput against that bound is reported for
                   every model (for ResNet-50: its ~100 MB gradient set, issue 10 §3's last point); and
                   the engine's barrier (the lockstep fit's own rendezvous)
Each tnt x2 run also records its last timed step's reduction from the engine's bucket times (read
after the fit): the "reduction tail" from the last hand-over to the last result is the part of the
added time that backprop did not hide; what remains of it went to copies, waits and Python.
Every model is compiled with SGD(momentum) and the accuracy metric (so there is metric state to
reduce). Steps are timed between the ends of consecutive train batches (StepTimer), after warm-up
steps and a barrier that starts both ranks' timed steps together.

Output in --out: runs.jsonl (one row per launch: every rank's step times, model, mode, ranks,
command, load average), summary.json (medians, the two goals and their verdicts, machine, commit,
versions) and summary.md (the table). A full run with the defaults takes about 20 minutes on
a quiet 2-core machine (9.5 minutes before the paired launches were added; `--configs paired:1
paired:2 collectives:2 --repeats 2`, the goals' figures alone, about 10 minutes); the smallest smoke run (`--models digits_mlp:32 --repeats 1 --steps 5
--warmup-steps 2`) about 2 minutes.
"""
