"""The harnesses retry a launch that started no rank (Note [A launch that started no rank is retried
once] in tarantella/launcher/launch_check.py): the pattern must match the launcher's own message for that
case, and only that case."""
from tarantella.launcher.launch_check import LaunchProgress, no_rank_started


def test_the_retry_pattern_matches_a_launch_that_started_no_rank_only():
    nobody = LaunchProgress(2, (("h0", 1), ("h1", 1)), "/bin/agent")
    assert no_rank_started(2, nobody.failure(213))
    assert not no_rank_started(1, nobody.failure(213))  # the launcher reports it with exit code 2
    one_started = LaunchProgress(2, (("h0", 1), ("h1", 1)), "/bin/agent")
    one_started.rank_started({"rank": 0, "host": "h0"})
    assert not no_rank_started(2, one_started.failure(213))
    assert not no_rank_started(2, nobody.failure(None, timeout=30))  # a launch that hung is not retried
