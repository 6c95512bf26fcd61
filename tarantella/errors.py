"""The errors tarantella raises on purpose (all ranks raise alike)."""
from tarantella._engine import (EngineError, MpiError, MismatchError, CollectiveTimeoutError,
                                UsageError)

__all__ = ["EngineError", "MpiError", "MismatchError", "CollectiveTimeoutError", "UsageError"]
