"""Tokenizer: special-token strings are text, per-call statistics (unknown words, truncation), model-bound lookup."""
import pytest
import torch

import mdc
from mdc.tokenizer import Tokenizer, TextStats
from conftest import VOCAB


def test_special_token_strings_are_plain_text():
    tok = Tokenizer(context_length=32)
    for text in ("a red <end_of_text> circle", "<start_of_text> a square", "a <END_OF_TEXT> b"):
        row = tok([text])[0].tolist()
        assert row[0] == tok.sot_id
        assert row.count(tok.sot_id) == 1 and row.count(tok.eot_id) == 1, text  # no control id from the text
        assert "of _ text" in tok.decode(row)  # CLIP's decoder spaces the pieces: "< end _ of _ text >"


def test_encoding_matches_clip_bpe_on_ordinary_text():
    tok = Tokenizer()
    for text in ("A photo of a dog's ball, 3 cats & 12 mice!", "naïve café — 東京", "  spaced   out  "):
        assert tok.encode(text) == tok.bpe.encode(text)


def test_tokenize_reports_unknown_words_and_truncation_per_call():
    tok = Tokenizer(context_length=6, vocab=VOCAB)
    tokens, stats = tok.tokenize(["a red circle", "a zebra circle", "a red circle left of a blue square"])
    assert tokens.shape == (3, 6)
    assert isinstance(stats, TextStats)
    assert (stats.captions, stats.unknown, stats.truncated) == (3, 1, 1)
    assert stats.tokens == 3 + 3 + 8 and stats.unknown_rate == pytest.approx(1 / 14)
    assert tok.stats.captions == 0  # tokenize() reports; only __call__ keeps running totals
    tok(["a zebra"])
    assert tok.unknown_count == 1 and tok.stats.captions == 1
    merged = TextStats().merge(stats).merge(stats.as_dict())
    assert merged.unknown == 2 and merged.captions == 6


def test_get_tokenizer_by_model_name():
    tiny = mdc.get_tokenizer("tiny")
    model = mdc.create_model("tiny")
    assert tiny.vocab == model.tokenizer.vocab and tiny.context_length == model.config.context_length
    assert torch.equal(tiny(["a red circle"]), model.tokenizer(["a red circle"]))
    full = mdc.get_tokenizer("vit-b-32")
    assert (full.vocab_size, full.context_length) == (49409, 77)
    assert mdc.get_tokenizer(context_length=8).context_length == 8
    with pytest.raises(ValueError, match="vit-z"):
        mdc.get_tokenizer("vit-z")
