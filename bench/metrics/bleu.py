"""The translation benchmark's quality metric: corpus BLEU computed by sacrebleu, uncased (MLPerf
reports uncased BLEU) with sacrebleu's standard 13a tokenisation, in percent."""
from __future__ import annotations

__all__ = ["corpus_bleu"]


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """BLEU of `hypotheses` against one reference each."""
    import sacrebleu

    return float(sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True).score)
