"""An op failing anywhere in a pipelined (or data-parallel) training step ends the job within seconds, with
the engine's default timeout (300 s) in force, and the report names the rank, the stage and the error
(issue 20 §2; Note [A waiting op finishes once: by the engine or by cancellation] in csrc/tf/pending_op.h).
Before that, a failure that left a transfer or a gradient allreduce pending held the job until the timeout.
The failure comes in the second step (tests/pipeline/programs/fail_in_step.py), after one clean step."""
import os
import re

import pytest

from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(__file__), "programs", "fail_in_step.py")
# The run's hard timeout, seconds from launch: start-up and the first step's tracing included, well inside
# the engine's 300 s; a job still running then is killed and the test fails (RanksTimedOut).
ENDS_WITHIN = 90
ENV = {"TNT_TIMEOUT_SECONDS": None}  # the default timeout, as users run

SCENARIOS = [
    # ranks, program arguments, failing rank, the stage its message names (None: data parallelism)
    (2, ["before_send", "first"], 0, "pipeline stage 0 of 2"),
    (2, ["between_send_and_receive", "last", "--schedule", "gpipe"], 1, "pipeline stage 1 of 2"),
    (2, ["optimizer_update", "last"], 1, "pipeline stage 1 of 2"),
    (2, ["data_parallel_backward", "first"], 1, None),
    (4, ["optimizer_update", "first", "--replicas", "2"], 2, "pipeline stage 0 of 2, replica 1 of 2"),
]
# Further failure points, stages and replicas: the extended tier (Note [The suite's two tiers] in tests/conftest.py)
EXTENDED = [
    (2, ["weight_pass", "first", "--schedule", "gpipe"], 0, "pipeline stage 0 of 2"),
    (2, ["pass_clock", "first"], 0, "pipeline stage 0 of 2"),
    (4, ["between_send_and_receive", "middle", "--stages", "4"], 2, "pipeline stage 2 of 4"),
    (4, ["before_send", "last", "--stages", "4", "--schedule", "gpipe"], 3, "pipeline stage 3 of 4"),
    (4, ["pass_clock", "last", "--replicas", "2", "--schedule", "gpipe"], 3, "pipeline stage 1 of 2, replica 1 of 2"),
]


def _id(scenario):
    ranks, args = scenario[:2]
    return "-".join([str(ranks)] + [a for a in args if not a.startswith("--")])


@pytest.mark.multirank
@pytest.mark.timeout(150)
@pytest.mark.parametrize("ranks,args,failing_rank,stage",
                         [pytest.param(*s, id=_id(s)) for s in SCENARIOS]
                         + [pytest.param(*s, id=_id(s), marks=pytest.mark.extended) for s in EXTENDED])
def test_a_failing_op_ends_the_job_at_once(ranks, args, failing_rank, stage):
    result = run_ranks(ranks, PROGRAM, args=args, timeout=ENDS_WITHIN, env=ENV)
    assert result.returncode != 0, result.describe()
    result.assert_printed(["trained step 1"], range(ranks))  # it failed in the second step, not before
    report = re.search(r"^tarantella: error: rank (\d+) of \d+ failed first: .* on host \S+: (.*)$", result.stderr,
                       re.MULTILINE)
    assert report, result.describe()
    assert int(report.group(1)) == failing_rank, result.describe()
    assert "injected failure" in result.stderr, result.describe()
    if stage is not None:
        assert f"in {stage}: " in result.rank_stderr.get(failing_rank, ""), result.describe()
