"""shard="weights" (ZeRO stage 3, issue 21): bitwise unsharded training at 1-4 ranks for four optimizer set-ups,
a Transformer block, an Embedding, an activity regularizer, mixed precision; each rank holds its own weights
only (also when built in tnt.deferred_weights()); save, load and resume; refusals
(tests/keras/programs/sharded_weights.py)."""
import json
import os
import re

import pytest

from tests.launches import TRAINING

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "sharded_weights.py")
SET_UPS = ["SGD with momentum", "AdamW excluding biases from decay", "Adam with global_clipnorm",
           "RMSprop with a schedule and EMA"]
CHECKS = ["evaluate and predict give unsharded's results",
          "a Transformer block (MultiHeadAttention with dropout) trains as unsharded",
          "an Embedding-fed causal attention block (weights sent by rendezvous) trains as unsharded",
          "an activity regularizer trains as unsharded",
          "a model built in deferred_weights() holds its share only, starts and trains as serial",
          "save writes one plain .keras file, equal to unsharded training's",
          "a saved model loads sharded and resumes as unsharded",
          "a custom loop with tnt.shard_weights and tnt.gathered_gradients trains as unsharded",
          "a model's own train_step trains, saves and resumes sharded 'weights' as unsharded",
          "unsupported uses are refused with one line",
          "mixed_float16 with a LossScaleOptimizer and op determinism train as unsharded", "done"]


def assert_trained_as_unsharded(result, ranks: int) -> None:
    for rank in range(ranks):
        for set_up in SET_UPS:
            assert f"OK {set_up}: bitwise unsharded (weights)" in result.rank_stdout.get(rank, ""), \
                f"rank {rank} missed {set_up!r}\n{result.describe()}"
    result.assert_printed(CHECKS, range(ranks))


@TRAINING.test("sharded_weights")
# 3 ranks: across hosts, tests/cluster/test_sharding_across_hosts.py. 1 and 4 ranks and that test: the extended
# tier (Note [The suite's two tiers] in tests/conftest.py)
@pytest.mark.parametrize("ranks", [2, *(pytest.param(n, marks=pytest.mark.extended) for n in (1, 4))])
def test_sharded_weights_train_as_unsharded(ranks):
    assert_trained_as_unsharded(TRAINING.run("sharded_weights", ranks).check(), ranks)


@TRAINING.test("stage3_arithmetic")
def test_stage3_is_stage1_bitwise_where_grappler_keeps_the_arithmetic_as_written():
    """The README's statement (issue 44 §4): with Grappler's arithmetic optimizer off, bitwise; with TensorFlow's
    default, a relu MLP still bitwise, a gelu MLP within 1e-4 relative (tests/keras/programs/stage3_arithmetic.py)."""
    run = TRAINING.run("stage3_arithmetic", 2).check()
    results = [json.loads(line) for line in re.findall(r"RESULT (\{.*\})", run.stdout)]
    assert len(results) == 2 * 2 * 2, run.describe()
    for result in results:
        bitwise = not result["arithmetic_optimization"] or result["activation"] == "relu"
        assert result["relative"] == 0.0 if bitwise else result["relative"] < 1e-4, result
