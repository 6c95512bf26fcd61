"""Corpus BLEU-4 (Papineni et al. 2002) with the brevity penalty, on whitespace tokens, in
percent: the translation benchmark's metric (MLPerf reports uncased BLEU)."""
from __future__ import annotations

import collections
import math

__all__ = ["corpus_bleu"]


def _ngrams(tokens, n):
    return collections.Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def corpus_bleu(hypotheses: list[str], references: list[str], max_n: int = 4) -> float:
    matches = [0] * max_n
    totals = [0] * max_n
    hyp_length = ref_length = 0
    for hypothesis, reference in zip(hypotheses, references):
        hyp, ref = hypothesis.lower().split(), reference.lower().split()
        hyp_length += len(hyp)
        ref_length += len(ref)
        for n in range(1, max_n + 1):
            counts, ref_counts = _ngrams(hyp, n), _ngrams(ref, n)
            matches[n - 1] += sum(min(c, ref_counts[g]) for g, c in counts.items())
            totals[n - 1] += max(len(hyp) - n + 1, 0)
    if hyp_length == 0 or min(matches) == 0:
        return 0.0
    log_precision = sum(math.log(m / t) for m, t in zip(matches, totals)) / max_n
    brevity = 1.0 if hyp_length > ref_length else math.exp(1 - ref_length / hyp_length)
    return 100.0 * brevity * math.exp(log_precision)
