"""shard="optimizer" and "gradients" (ZeRO stages 1 and 2, issue 21): bitwise unsharded training and serial's
within 1e-6 for six optimizer set-ups, owned state only, save and resume (tests/keras/programs/sharded_optimizer.py)."""
import os

import pytest

from tests.launches import TRAINING

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "sharded_optimizer.py")
SET_UPS = ["SGD with momentum", "AdamW excluding biases from decay", "Adam with global_clipnorm",
           "RMSprop with a schedule and EMA", "SGD accumulating 2 steps, clipnorm",
           "LossScaleOptimizer(Adam, global_clipnorm)"]
CHECKS = ["the optimizer state of each rank is its owned variables'",
          "save writes the whole optimizer state, equal to unsharded training's",
          "a saved sharded model resumes as the unsharded one does",
          "a checkpoint of one rank resumes sharded on N as unsharded", "ModelCheckpoint writes the whole optimizer state",
          "a model's own train_step trains sharded as unsharded",
          "a model's own train_step saves sharded as unsharded; load_model and load_weights resume it", "a custom loop with tnt.shard_optimizer trains as unsharded",
          "sparse gradients (Embedding) train sharded as unsharded",
          "mixed_float16, op determinism and dict inputs train sharded as unsharded",
          "done"]


def assert_trained_as_unsharded(result, ranks: int) -> None:
    for rank in range(ranks):
        lines = result.rank_stdout.get(rank, "")
        for set_up in SET_UPS:
            for mode in ("optimizer", "gradients"):
                assert f"OK {set_up}: bitwise unsharded ({mode})" in lines, \
                    f"rank {rank} missed {set_up!r} ({mode})\n{result.describe()}"
    result.assert_printed(CHECKS, range(ranks))


@TRAINING.test("sharded_optimizer")
# 3 ranks: across hosts, tests/cluster/test_sharding_across_hosts.py. 1 and 4 ranks and that test: the extended
# tier (Note [The suite's two tiers] in tests/conftest.py)
@pytest.mark.parametrize("ranks", [2, *(pytest.param(n, marks=pytest.mark.extended) for n in (1, 4))])
def test_sharded_optimizer_state_trains_as_unsharded(ranks):
    assert_trained_as_unsharded(TRAINING.run("sharded_optimizer", ranks).check(), ranks)
