"""exporter/parse/tokenjson.py: token ids back to text from a tokenizer.json, as the tokenizers package decodes them."""
from __future__ import annotations

import json

import pytest

from exporter.parse.tokenjson import TokenText

TEXTS = ["Current date and time: 2026-12-07 17:42:13.123456\nYou are a helpful assistant.",
         "Ünïcödé, emoji ✓ and tabs\tin one line", "  leading spaces and trailing  "]


@pytest.mark.parametrize("text", TEXTS)
def test_byte_level_bpe_decodes_as_the_tokenizers_package_does(tiny_tokenizer, text):
    from tokenizers import Tokenizer

    hf = Tokenizer.from_file(str(tiny_tokenizer))
    ids = hf.encode(text).ids
    assert TokenText(json.loads(tiny_tokenizer.read_text())).decode(ids) == hf.decode(ids, skip_special_tokens=False)


def test_a_sentencepiece_vocabulary_turns_its_space_marks_and_byte_pieces_back():
    spec = {"model": {"type": "BPE", "vocab": {"▁Current": 0, "▁date": 1, ":": 2, "<0x0A>": 3, "<0xE2>": 4, "<0x9C>": 5,
                                                 "<0x93>": 6}},
            "decoder": {"type": "Sequence", "decoders": [{"type": "Replace"}, {"type": "ByteFallback"}, {"type": "Fuse"}]}}
    assert TokenText(spec).decode([0, 1, 2, 3, 4, 5, 6]) == " Current date:\n✓"


def test_wordpiece_joins_its_continuations():
    spec = {"model": {"type": "WordPiece", "vocab": {"time": 0, "##stamp": 1, "now": 2}}, "decoder": {"type": "WordPiece"}}
    assert TokenText(spec).decode([2, 0, 1]) == "now timestamp"


def test_special_tokens_and_unknown_ids_read_plainly_never_raise(tiny_tokenizer):
    text = TokenText(json.loads(tiny_tokenizer.read_text()))
    assert text.decode([0, 10 ** 9]).startswith("<s><id 1000000000>")
    assert text.decode([0], skip_special=True) == ""


def test_a_file_without_a_vocabulary_is_refused():
    with pytest.raises(ValueError, match="no model.vocab"):
        TokenText({"model": {"type": "BPE"}})
