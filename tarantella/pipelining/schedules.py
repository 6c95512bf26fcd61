"""Pipeline schedules: per stage, the order of forward and backward passes
over the micro-batches of one global batch.

Both are synchronous (one weight version per step, gradients accumulated over
all micro-batches, one update after the flush), so they give the same update;
they differ in idle time and memory:
- GPipe: all forwards, then all backwards. Every stage holds the activations
  of all M micro-batches at the turn.
- 1F1B (PipeDream-flush): stage s runs S-1-s forwards to fill the pipe, then
  alternates one forward and one backward, then drains. Stage s holds at most
  S-s micro-batches' activations (with deferred weight gradients it holds
  their layer inputs anyway, and runs one more forward ahead: Note [One more
  forward ahead when the weight gradients wait for the step's end]); the
  bubble is the same as GPipe's,
  (S-1)/(M+S-1) of the step for equal stage times.
Backwards run in the order of their forwards, so each stage adds micro-batch
gradients in the same order under both schedules.

With deferred weight gradients (Note [Deferred weight gradients] in
weight_gradients.py) a backward pass computes only the input gradients, and
weight passes (WEIGHT) compute the weight gradients of the micro-batches
whose backward ran since the previous weight pass (`with_weight_passes`);
the first stage places them where it would otherwise wait (Note [The first
stage's weight passes]).

Note [The first stage's weight passes]
The first stage's backwards send nothing upstream, so nobody waits for them
and its weight passes can go anywhere after their backwards; its idle time is
where it waits for the next stage's gradients (`deferred_schedule`):
- 1F1B: its last backward waits for the drain (S = 2: the last stage's last
  forward and backward). A weight pass of the earlier micro-batches runs right
  before it (`with_weight_passes(fill_drain=True)`). Measured (2 pinned stages,
  8 x Dense(512), batch 1024, M = 8, A/B alternating): bubble 0.125/0.126 ->
  0.104/0.104, step 37.4-38.3 -> 36.3 ms. Not where the stage's updates
  run layer by layer in its last weight pass (Note [Updates in the weight
  pass] in updates_in_weight_pass.py): the earlier pass would hold every
  weight gradient of the stage over the wait.
- GPipe: its first backward waits for the last stage's last forward and first
  backward (nothing deferred exists yet then), and each later one for the
  next stage's backward, which is longer (the first stage computes no input
  gradient for its first layer): ~0.3 ms idle before each. A weight pass after
  the first half of its backwards lets the second half's gradients arrive
  meanwhile; its second half then runs without waiting and it mostly
  finishes before the last stage (whose weight pass is as long) instead of
  0.4-1 ms after it. Measured as above, 6 pairs: bubble 0.117-0.130 ->
  0.097-0.107; samples/s -3%..+4% per pair (median +1%, within the noise).
  A weight pass right before the last backward (1F1B's fill) gave bubble
  0.117-0.121 and no shorter step: the wait it fills is only ~0.3 ms, and
  the lower bubble came from the first stage's longer busy time.
Splitting a weight pass adds one product per layer and changes only the order
of additions. (These figures count the optimizer update inside the last pass;
since the update runs after it (pipelined_model.py), one run each gave bubble
0.111 for GPipe and 0.105 for 1F1B deferred.)

Note [One more forward ahead when the weight gradients wait for the step's end]
In 1F1B a stage s < S-1 runs S-1-s forwards ahead, so at S = 2 the first
stage, after each forward, needs the gradient of the micro-batch before: the
next stage's forward and backward of it plus a transfer each way, while the
first stage computes one forward only. Every transfer's latency (posting,
arrival, TensorFlow's scheduling of the pass that consumes it: 0.1-0.6 ms on
the 2-core machine) then stands in the way once per micro-batch, which at
small micro-batches is a good part of a pass (8 x Dense(512), batch 128,
M = 8: passes of 0.4-0.6 ms). One more forward ahead gives each gradient one
more forward's time to arrive. It costs the activations of one more
micro-batch, so it is taken only where a stage holds the layer inputs of
every micro-batch until the step's end anyway: deferred weight gradients with
one weight pass per step (1F1B's default at small batches, where latency
weighs most: weight_gradients.defer_by_default). Backwards keep their order,
so the sums, and the update, are the same. Measured (2 stages, M = 8,
8 x Dense(512), batch 128, deferred, `tarantella -n 2` defaults, 4 A/B pairs
alternating): +3 % to +5 % samples/s in every pair (6287 -> 6476,
6426 -> 6759, 6382 -> 6502, 6311 -> 6698).
"""
from __future__ import annotations

from typing import NamedTuple

__all__ = ["Pass", "FORWARD", "BACKWARD", "gpipe", "one_f_one_b", "schedule", "SCHEDULES", "ideal_bubble_fraction",
           "max_live_micro_batches", "check_micro_batches", "WEIGHT", "with_weight_passes", "deferred_schedule"]

FORWARD = "forward"
BACKWARD = "backward"
WEIGHT = "weight"      # the weight gradients of the backwards since the previous weight pass


class Pass(NamedTuple):
    kind: str          # FORWARD, BACKWARD or WEIGHT
    micro_batch: int   # WEIGHT: the last micro-batch whose weight gradients it computes


def gpipe(num_micro_batches: int, num_stages: int, stage: int) -> list[Pass]:
    return ([Pass(FORWARD, m) for m in range(num_micro_batches)]
            + [Pass(BACKWARD, m) for m in range(num_micro_batches)])


def one_f_one_b(num_micro_batches: int, num_stages: int, stage: int, extra_warm_up: int = 0) -> list[Pass]:
    """extra_warm_up: forwards run ahead beyond the S-1-s that fill the pipe, on every stage but the last
    (Note [One more forward ahead when the weight gradients wait for the step's end])."""
    ahead = num_stages - 1 - stage
    warm_up = min(ahead + (extra_warm_up if ahead else 0), num_micro_batches)
    passes = [Pass(FORWARD, m) for m in range(warm_up)]
    forward, backward = warm_up, 0
    while forward < num_micro_batches:
        passes += [Pass(FORWARD, forward), Pass(BACKWARD, backward)]
        forward, backward = forward + 1, backward + 1
    passes += [Pass(BACKWARD, m) for m in range(backward, num_micro_batches)]
    return passes


SCHEDULES = {"gpipe": gpipe, "1f1b": one_f_one_b}


def schedule(name: str, num_micro_batches: int, num_stages: int, stage: int) -> list[Pass]:
    if name not in SCHEDULES:
        raise ValueError(f"tarantella: unknown pipeline schedule {name!r}; choose one of {sorted(SCHEDULES)}")
    if num_micro_batches < 1:
        raise ValueError(f"tarantella: num_micro_batches must be at least 1, got {num_micro_batches}")
    return SCHEDULES[name](num_micro_batches, num_stages, stage)


def with_weight_passes(passes: list[Pass], every: int, fill_drain: bool = False) -> list[Pass]:
    """`passes` with a weight pass after every `every`-th backward and after the last one.

    fill_drain: also a weight pass right before the last backward (of the backwards since the previous
    one), for a stage that would idle there and whose backwards nobody waits for: 1F1B's first stage, whose
    last backward waits for the drain of the stages after it (S = 2: the last stage's last forward and
    backward) and sends nothing upstream. It then computes its earlier micro-batches' weight gradients in
    that wait instead of after it, as zero-bubble schedules fill the drain with W passes (Qi et al. 2023)."""
    result, backwards = [], 0
    last = max(i for i, p in enumerate(passes) if p.kind == BACKWARD) if passes else -1
    for i, p in enumerate(passes):
        if fill_drain and i == last and backwards % every:   # backwards since the previous weight pass
            result.append(Pass(WEIGHT, _last_backward(result)))
        result.append(p)
        if p.kind == BACKWARD:
            backwards += 1
            if backwards % every == 0 or i == last:
                result.append(Pass(WEIGHT, p.micro_batch))
    return result


def deferred_schedule(name: str, num_micro_batches: int, num_stages: int, stage: int, every: int,
                      fill_drain: bool = True) -> list[Pass]:
    """A stage's passes with deferred weight gradients: a weight pass after every `every`-th backward and
    after the last (Note [The first stage's weight passes]). fill_drain=False: no weight pass before 1F1B's
    last backward on the first stage (Note [Updates in the weight pass] in updates_in_weight_pass.py)."""
    if name == "1f1b" and every >= num_micro_batches:
        # Note [One more forward ahead when the weight gradients wait for the step's end]
        passes = one_f_one_b(num_micro_batches, num_stages, stage, extra_warm_up=1)
    else:
        passes = schedule(name, num_micro_batches, num_stages, stage)
    if stage != 0 or num_stages == 1:
        return with_weight_passes(passes, every)
    if name == "gpipe":
        return with_weight_passes(passes, min(every, (num_micro_batches + 1) // 2))
    return with_weight_passes(passes, every, fill_drain=fill_drain)


def _last_backward(passes: list[Pass]) -> int:
    return next(p.micro_batch for p in reversed(passes) if p.kind == BACKWARD)


def ideal_bubble_fraction(num_micro_batches: int, num_stages: int) -> float:
    return (num_stages - 1) / (num_micro_batches + num_stages - 1)


def max_live_micro_batches(passes: list[Pass]) -> int:
    """Most micro-batches whose forward is done and backward (with weight passes: weight pass) is not,
    at any point."""
    deferred = any(kind == WEIGHT for kind, _ in passes)
    live = peak = waiting = 0
    for kind, _ in passes:
        if kind == FORWARD:
            live += 1
        elif kind == BACKWARD and not deferred:
            live -= 1
        elif kind == BACKWARD:
            waiting += 1
        else:
            live, waiting = live - waiting, 0
        peak = max(peak, live)
    return peak


def check_micro_batches(batch: int, num_replicas: int, num_micro_batches: int) -> None:
    """Every replica's part of a global batch must split into equal micro-batches."""
    parts = num_replicas * num_micro_batches
    if batch % parts:
        split = f"{num_replicas} replicas x {num_micro_batches}" if num_replicas > 1 else f"{num_micro_batches}"
        raise ValueError(f"tarantella: a global batch of {batch} samples does not split into {split} micro-batches "
                         f"of equal size; use a batch size (and, for the last batch, a sample count) divisible by "
                         f"{parts}, or a num_micro_batches that divides the batch")
