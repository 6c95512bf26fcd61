"""Elastic training: the commits an elastic job's ranks write, and what a new generation restores
(tarantella --elastic; Note [Elastic generations] in tarantella/launcher/elastic.py).

The names the launcher and the ranks share live here, so that neither imports the other's machinery.
tnt.Model.fit commits by itself (fit_commits.py); a custom loop commits with tnt.elastic.State (loop_state.py).
"""
COMMIT_DIR_VARIABLE = "TNT_ELASTIC_DIR"          # where the ranks keep their commits
GENERATION_VARIABLE = "TNT_ELASTIC_GENERATION"   # 1, 2, ...: which generation of the job a rank belongs to
COMMIT_EVERY_VARIABLE = "TNT_ELASTIC_COMMIT_EVERY"  # a commit every N steps (and at every epoch's end)
RESIZE_SIGNAL_NAME = "SIGUSR1"                   # the launcher asks the ranks to leave at the next step's end
RESIZE_EXIT_CODE = 75                            # ... and they exit so, committed (EX_TEMPFAIL)


def __getattr__(name):
    if name == "State":   # imports TensorFlow's collectives: only when asked for
        from tarantella.elastic.loop_state import State
        return State
    raise AttributeError(f"module 'tarantella.elastic' has no attribute {name!r}")


__all__ = ["State", "COMMIT_DIR_VARIABLE", "GENERATION_VARIABLE", "COMMIT_EVERY_VARIABLE", "RESIZE_SIGNAL_NAME",
           "RESIZE_EXIT_CODE"]
