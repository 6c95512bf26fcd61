"""A 2-host data-parallel job killed in epoch 2 and started again with the same command
(keras.callbacks.BackupAndRestore) ends with the weights of an uninterrupted run, bit
for bit."""
from __future__ import annotations

import os

import pytest

from tests.cluster.results import rank_results
from tests.multirank import run_ranks

PROGRAM = os.path.join(os.path.dirname(os.path.abspath(__file__)), "programs",
                       "resume_training.py")
ENV = {"TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1"}


@pytest.mark.multirank
@pytest.mark.extended   # on one host: tests/keras/test_own_training_logic.py (tests/conftest.py: the tiers)
@pytest.mark.timeout(600)
def test_a_killed_two_host_job_resumes_to_the_uninterrupted_weights(netns_cluster, tmp_path):
    cluster = netns_cluster(hosts=2, slots=1)
    args = cluster.launcher_args()
    (tmp_path / "reference").mkdir()
    reference = run_ranks(2, PROGRAM, args=[str(tmp_path / "reference"), "uninterrupted"],
                          launcher_args=args, env=ENV, timeout=180).check()
    state = tmp_path / "resumed"
    state.mkdir()
    first = run_ranks(2, PROGRAM, args=[str(state)], launcher_args=args, env=ENV, timeout=180)
    assert first.returncode == 137, first.describe()     # rank 1 killed in epoch 2
    assert "rank 1 of 2 failed first: it was killed by SIGKILL" in first.stderr
    assert cluster.wait_until_clean(10) == {}
    again = run_ranks(2, PROGRAM, args=[str(state)], launcher_args=args, env=ENV,
                      timeout=180).check()
    expected, resumed = rank_results(reference.stdout), rank_results(again.stdout)
    assert sorted(resumed) == [0, 1], again.describe()
    for rank in (0, 1):
        assert resumed[rank]["epochs_run"] == [1, 2], resumed   # epoch 2 again, then 3
        assert resumed[rank]["weights_sha256"] == expected[0]["weights_sha256"], \
            (resumed, expected)
    assert expected[0]["weights_sha256"] == expected[1]["weights_sha256"]
