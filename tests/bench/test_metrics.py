import pytest

from bench.data import byte_tokens
from bench.metrics.bleu import corpus_bleu

pytestmark = pytest.mark.timeout(10)


def test_bleu():
    assert corpus_bleu(["the cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)
    assert corpus_bleu(["a b c d"], ["e f g h"]) == 0.0
    partial = corpus_bleu(["the cat sat on the mat today"], ["the cat sat on the mat"])
    assert 0 < partial < 100
    assert corpus_bleu(["The Cat sat on the mat"], ["the cat sat on the mat"]) == pytest.approx(100.0)  # uncased


def test_byte_tokens_round_trip():
    text = "Grüße aus Kaiserslautern"
    assert byte_tokens.decode(byte_tokens.encode(text)) == text
    assert max(byte_tokens.encode(text, vocab_size=128)) < 128
