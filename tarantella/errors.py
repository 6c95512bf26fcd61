"""The errors tarantella raises on purpose (all ranks raise alike).

GroupFailedError: a collective of the group timed out or failed in MPI earlier,
so every later one is refused at once (Note [A failed group stays failed] in
csrc/engine/process_group.hpp).
"""
from tarantella._engine import (EngineError, MpiError, MismatchError, CollectiveTimeoutError,
                                UsageError, GroupFailedError)

__all__ = ["EngineError", "MpiError", "MismatchError", "CollectiveTimeoutError", "UsageError", "GroupFailedError"]
