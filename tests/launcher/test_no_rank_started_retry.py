"""run_ranks retries a launch that started no rank (Note [A launch that started no rank is retried
once] in tests/multirank.py): its pattern must match the launcher's own message for that case, and
only that case."""
from tarantella.launcher.launch_check import LaunchProgress
from tests.multirank import _NO_RANK_STARTED


def test_the_retry_pattern_matches_a_launch_that_started_no_rank_only():
    nobody = LaunchProgress(2, (("h0", 1), ("h1", 1)), "/bin/agent")
    assert _NO_RANK_STARTED.search(nobody.failure(213))
    one_started = LaunchProgress(2, (("h0", 1), ("h1", 1)), "/bin/agent")
    one_started.rank_started({"rank": 0, "host": "h0"})
    assert not _NO_RANK_STARTED.search(one_started.failure(213))
    assert not _NO_RANK_STARTED.search(nobody.failure(None, timeout=30))  # a launch that hung is not retried
