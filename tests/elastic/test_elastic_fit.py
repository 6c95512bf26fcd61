"""`tarantella --elastic` on this host: a job that loses ranks goes on with the others and ends with the
weights of an uninterrupted run (exact mode: bit for bit; tolerance mode: within float rounding)."""
from __future__ import annotations

import functools
import json
import os
import re

import numpy as np
import pytest

from tarantella.timeline import names, trace_file
from tests.multirank import REPO_ROOT, run_ranks

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs", "elastic_fit.py")
EXACT = {"TNT_EXACT_VIRTUAL_BATCHES": "2"}
EXACT_ARGS = ["--allreduce-algorithm", "recursive_doubling"]


def _lines(result, kind: str) -> list[dict]:
    return [json.loads(line.split(f"{kind} ", 1)[1]) for line in result.stdout.splitlines()
            if f"] {kind} " in line or line.startswith(f"{kind} ")]


def _run(ranks, *args, launcher_args=(), env=None, timeout=150):
    return run_ranks(ranks, PROGRAM, args=list(args), launcher_args=list(launcher_args),
                     env={"TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})}, timeout=timeout)


@functools.lru_cache(maxsize=None)
def _exact_reference(data: str, env: tuple = tuple(EXACT.items()), policy: str | None = None) -> dict:
    """The uninterrupted 1-rank exact-mode result, one run per input kind (and dtype policy) for the tests that
    compare with it."""
    return _lines(_run(1, "--data", data, *(["--policy", policy] if policy else []), launcher_args=EXACT_ARGS,
                       env=dict(env)).check(), "RESULT")[0]


@functools.lru_cache(maxsize=None)
def _tolerance_reference() -> dict:
    """The uninterrupted 2-rank run in tolerance mode, for the tests that compare within float rounding."""
    return _lines(_run(2).check(), "RESULT")[0]


def _commit_dirs() -> set[str]:
    return {name for name in os.listdir("/dev/shm") if name.startswith("tnt-elastic-")}


EXTENDED = pytest.mark.extended


@pytest.mark.multirank
@pytest.mark.timeout(300)
@pytest.mark.parametrize("data, fault, shard, policy", [
    ("dataset", "1:1:11:kill", None, None),               # mid-epoch
    # EXTENDED: the extended tier (Note [The suite's two tiers] in tests/conftest.py), other inputs and moments
    pytest.param("arrays", "1:0:17:kill", None, None, marks=EXTENDED),         # the master, at an epoch's start
    pytest.param("repeat", "1:1:19:kill", None, None, marks=EXTENDED),         # steps_per_epoch, epoch 3
    pytest.param("dataset", "1:0:9:commitkill", None, None, marks=EXTENDED),   # in the middle of its commit
    ("dataset", "1:1:9:commitkill", "optimizer", None),   # ZeRO stage 1, in the middle of its commit of its share
    # ZeRO stage 1 under mixed precision: the loss scale's state is committed with the optimizer's
    pytest.param("dataset", "1:1:11:kill", "optimizer", "mixed_float16", marks=EXTENDED),
    # ZeRO stage 1 on numpy arrays in a dict without targets (the model adds its own loss)
    ("dict", "1:1:11:kill", "optimizer", None)])
def test_a_lost_rank_leaves_the_weights_of_the_uninterrupted_run_bit_for_bit(data, fault, shard, policy):
    before = _commit_dirs()
    expected = _exact_reference(data, policy=policy)
    resized = _run(2, "--data", data, "--fault", fault, *(["--shard", shard] if shard else []),
                   *(["--policy", policy] if policy else []), launcher_args=["--elastic", *EXACT_ARGS],
                   env=EXACT).check()
    [result] = _lines(resized, "RESULT")
    [fault_line], [resumed] = _lines(resized, "FAULT"), _lines(resized, "RESUMED")
    assert result["generation"] == 2 and result["size"] == 1, resized.describe()
    assert result["weights_sha256"] == expected["weights_sha256"], resized.describe()
    assert result["steps"] == expected["steps"]
    assert policy or result["steps"] == 24   # float16's loss scale skips the steps whose gradients overflowed
    assert re.search(r"tarantella: elastic: lost rank \d \(host \S+\) was killed by SIGKILL .*; generation 2 "
                     r"goes on with 1 rank\(s\)", resized.stderr), resized.describe()
    restored = re.search(r"go on from the commit of epoch \d+, batch \d+ \(step (\d+),", resized.stdout)
    if "commitkill" in fault:   # the commit it was writing is not taken: the one before is
        assert int(restored.group(1)) == fault_line["step"] - 1, resized.describe()
    # The committed logs of the dropped batches and the restored metric state give serial's epoch logs; the
    # History, EarlyStopping and ReduceLROnPlateau go on with their committed state.
    assert result["history"].keys() == expected["history"].keys()
    for key, values in expected["history"].items():
        assert np.allclose(result["history"][key], values, rtol=1e-6), (result["history"], expected["history"])
    for key, values in expected["callbacks"].items():   # counts equal, values within the logs' rounding
        assert np.allclose(result["callbacks"][key], values, rtol=1e-6, atol=0), (key, result["callbacks"])
    print(f"recovery {resumed['time'] - fault_line['time']:.1f} s, "
          f"steps lost {fault_line['step'] - resumed['from_step']}")
    assert _commit_dirs() == before   # removed at the end


@pytest.mark.multirank
@pytest.mark.timeout(420)
def test_four_then_three_then_four_ranks_train_the_uninterrupted_weights_bit_for_bit(tmp_path):
    """Issue 42's resize, in exact mode with 4 virtual micro-batches: rank 3 is killed at step 5 (epoch 1), the 3
    survivors hold 1, 1 and 2 of them (Note [Exact mode's blocks]); at step 12 (epoch 2, batch 4) the hostfile
    lists the host with a slot more and the job grows back to 4 ranks (--max-ranks 4) at a step's end. The
    weights are the uninterrupted 1-rank run's bit for bit."""
    virtual = {"TNT_EXACT_VIRTUAL_BATCHES": "4"}
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost slots=4\n")
    (tmp_path / "hosts.next").write_text("localhost slots=5\n")
    expected = _exact_reference("dataset", tuple(virtual.items()))
    resized = _run(4, "--fault", "1:3:5:kill", "--fault", "2:0:12:hosts", "--hostfile", str(hostfile),
                   launcher_args=["--elastic", "--hostfile", str(hostfile), "--max-ranks", "4",
                                  "--discovery-interval", "1", *EXACT_ARGS], env=virtual, timeout=400).check()
    [result] = _lines(resized, "RESULT")
    sizes = [line["size"] for line in _lines(resized, "RESUMED")]
    assert (result["generation"], result["size"], sizes) == (3, 4, [3, 4]), resized.describe()
    assert result["weights_sha256"] == expected["weights_sha256"], resized.describe()
    assert result["steps"] == expected["steps"] == 24
    assert re.search(r"lost rank 3 \(host \S+\) was killed by SIGKILL .*; generation 2 goes on with 3 rank\(s\)",
                     resized.stderr), resized.describe()
    assert re.search(r"the job's hosts changed; generation 3 goes on with 4 rank\(s\)", resized.stderr), \
        resized.describe()


@pytest.mark.multirank
@pytest.mark.extended   # two losses in a row across hosts: tests/cluster/test_elastic_hosts.py
@pytest.mark.timeout(300)
def test_two_losses_in_a_row_train_as_the_uninterrupted_run(tmp_path):
    """3 -> 2 -> 1 ranks; the timeline holds every generation and shows the resizes between them."""
    trace_path = tmp_path / "trace.json"
    resized = _run(3, "--fault", "1:2:5:kill", "--fault", "2:1:13:kill",
                   launcher_args=["--elastic", "--timeline", str(trace_path)]).check()
    expected, [result] = _tolerance_reference(), _lines(resized, "RESULT")
    assert result["generation"] == 3 and result["size"] == 1, resized.describe()
    assert len(re.findall(r"tarantella: elastic: lost rank", resized.stderr)) == 2
    for mine, theirs in zip(result["weights"], expected["weights"]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    trace = trace_file.read_trace(str(trace_path))
    assert sorted(tmp_path.iterdir()) == [trace_path]   # every generation's rank files merged and removed
    resizes = sorted(((span["args"]["generation"], span["pid"], span["args"]["world_size_before"],
                       span["args"]["world_size"]) for span in trace_file.spans(trace, names.ELASTIC_RESIZE)))
    assert resizes == [(2, 0, 3, 2), (2, 1, 3, 2), (3, 0, 2, 1)], resizes
    steps = trace_file.spans(trace, names.STEP)
    assert {span["pid"] for span in steps} == {0, 1, 2}
    first_resize = min(trace_file.spans(trace, names.ELASTIC_RESIZE), key=lambda span: span["ts"])
    # Generation 1 trained before the resize, on the common time axis.
    assert any(span["pid"] == 2 and span["ts"] < first_resize["ts"] + first_resize["dur"] for span in steps)
    assert len(trace_file.spans(trace, names.ELASTIC_COMMIT)) >= 24


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_a_master_lost_with_its_sharded_weights_leaves_its_share_to_the_survivor():
    """ZeRO stage 3 (shard="weights"): each rank commits its own weights and optimizer slots beside the replicated
    rest (Note [A commit by name]); the master is killed at step 13 and the survivor, alone, takes its share from
    the commit. Tolerance mode (exact mode does not run stage 3): the uninterrupted run's weights within float
    rounding."""
    resized = _run(2, "--shard", "weights", "--fault", "1:0:13:kill", launcher_args=["--elastic"]).check()
    expected, [result] = _tolerance_reference(), _lines(resized, "RESULT")
    assert (result["generation"], result["size"], result["steps"]) == (2, 1, 24), resized.describe()
    assert re.search(r"go on from the commit of epoch 2, batch 4 \(step 12, made by 2 ranks\)", resized.stdout), \
        resized.describe()
    for mine, theirs in zip(result["weights"], expected["weights"]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_a_hung_rank_is_dropped_after_the_timeout():
    resized = _run(2, "--fault", "1:1:6:stop", launcher_args=["--elastic", "--timeout", "5"]).check()
    [result] = _lines(resized, "RESULT")
    assert result["generation"] == 2 and result["steps"] == 24, resized.describe()
    assert re.search(r"lost rank 1 \(host \S+\) (was stopped \(SIGSTOP\) for [\d.]+ s and hung|its peers timed out)",
                     resized.stderr), resized.describe()


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_below_min_ranks_and_failing_programs_end_the_job():
    before = _commit_dirs()
    ended = _run(2, "--fault", "1:1:3:kill", launcher_args=["--elastic", "--min-ranks", "2"])
    assert ended.returncode == 137, ended.describe()
    assert re.search(r"tarantella: error: elastic job: lost rank 1 \(host \S+\) was killed by SIGKILL .*; 1 "
                     r"rank\(s\) left, fewer than --min-ranks 2; the job ends", ended.stderr), ended.describe()
    failing = _run(2, "--fault", "1:1:3:raise", launcher_args=["--elastic"])
    assert failing.returncode == 1, failing.describe()
    assert "ValueError: rank 1 fails on its own at step 3" in failing.stderr
    assert "generation 2" not in failing.stderr and not _lines(failing, "RESULT")
    unsupported = _run(1, "--data", "steps", launcher_args=["--elastic"])
    assert unsupported.returncode == 1 and "ValueError: tarantella --elastic: fit(steps_per_epoch=...) is supported " \
        "for a dataset that repeats forever" in unsupported.stderr, unsupported.describe()
    pipelined = run_ranks(2, os.path.join(REPO_ROOT, "tests", "pipeline", "programs", "fail_in_step.py"),
                          args=["before_send", "first", "--stages", "2"], launcher_args=["--elastic"],
                          env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150)
    assert pipelined.returncode == 1 and "ValueError: tarantella --elastic: a pipelined model (SplitLayer, more " \
        "than one rank) is not committed yet" in pipelined.stderr, pipelined.describe()
    assert "generation 2" not in pipelined.stderr and "OK trained step" not in pipelined.stdout
    assert _commit_dirs() == before


@pytest.mark.multirank
@pytest.mark.timeout(300)
def test_a_custom_loop_committing_with_elastic_state_goes_on_after_a_loss():
    loop = os.path.join(os.path.dirname(PROGRAM), "elastic_loop.py")
    reference = run_ranks(2, loop, env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150).check()
    resized = run_ranks(2, loop, args=["--kill", "1:1:7"], launcher_args=["--elastic"],
                        env={"TF_CPP_MIN_LOG_LEVEL": "2"}, timeout=150).check()
    expected, [result] = _lines(reference, "RESULT")[0], _lines(resized, "RESULT")
    assert result["generation"] == 2 and result["iterations"] == expected["iterations"] == 24, resized.describe()
    assert _lines(resized, "RESET") == [{"size": 1, "epoch": 0, "batch": 7}], resized.describe()
    for mine, theirs in zip(result["weights"], expected["weights"]):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
