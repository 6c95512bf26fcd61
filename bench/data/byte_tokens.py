"""Byte-level tokens for translation text: invertible, needs no vocabulary file.

Ids: 0 padding, 1 start, 2 end, 3 + byte. A model whose vocabulary is smaller than
259 gets the bytes folded into its range (lossy; only the tiny test models do).
The reference Transformer uses a 32k subword vocabulary; building one is left to the
user's data preparation.
"""
from __future__ import annotations

__all__ = ["PAD", "START", "END", "encode", "decode", "BYTE_VOCAB_SIZE"]

PAD, START, END = 0, 1, 2
_OFFSET = 3
BYTE_VOCAB_SIZE = 256 + _OFFSET


def encode(text: bytes | str, vocab_size: int = BYTE_VOCAB_SIZE) -> list[int]:
    data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
    span = vocab_size - _OFFSET
    return [_OFFSET + (byte % span) for byte in data]


def decode(ids) -> str:
    data = bytes(int(i) - _OFFSET for i in ids if _OFFSET <= int(i) < BYTE_VOCAB_SIZE)
    return data.decode("utf-8", errors="replace")
