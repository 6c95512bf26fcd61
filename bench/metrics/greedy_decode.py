"""Greedy decoding of a translation model, for BLEU on the evaluation split."""
from __future__ import annotations

import numpy as np

from bench.data import byte_tokens

__all__ = ["greedy_translate"]


def greedy_translate(model, source: np.ndarray, length: int) -> list[list[int]]:
    """Target token ids for each row of `source` (int32[batch, length]), END excluded."""
    batch = source.shape[0]
    target = np.zeros((batch, length), dtype=np.int32)
    target[:, 0] = byte_tokens.START
    finished = np.zeros(batch, dtype=bool)
    for position in range(length - 1):
        logits = np.asarray(model({"source": source, "target_in": target}, training=False))
        choice = logits[:, position].argmax(-1).astype(np.int32)
        choice[finished] = byte_tokens.PAD
        target[:, position + 1] = choice
        finished |= choice == byte_tokens.END
        if finished.all():
            break
    return [[int(t) for t in row[1:] if t not in (byte_tokens.PAD, byte_tokens.END)] for row in target]
