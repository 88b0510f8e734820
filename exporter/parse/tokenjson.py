"""Token ids back to text with a Hugging Face `tokenizer.json`, decoding only. Pure.

An alert that says "token 13 changes on every request" is read by a person: the text
around it is what they search their prompt template for. Decoding needs the vocabulary
and the decoder pipeline, not the `tokenizers` package: byte-level BPE (GPT-2, Llama 3,
Qwen) maps bytes to printable characters, SentencePiece-style vocabularies (Llama 2,
Mistral) mark spaces with U+2581 and spell rare bytes as <0xNN>, WordPiece prefixes
continuations with ##. An unknown id reads as <id N>, never raises.
"""
from __future__ import annotations

import re

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_table() -> dict[str, int]:
    """GPT-2's printable character for each byte, reversed."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


_BYTES_OF = _byte_level_table()


class TokenText:
    """Decodes ids with one tokenizer.json (its parsed JSON)."""

    def __init__(self, spec: dict):
        model = spec.get("model") if isinstance(spec, dict) else None
        vocab = model.get("vocab") if isinstance(model, dict) else None
        if isinstance(vocab, list):  # Unigram: [[piece, score], ...]
            vocab = {entry[0]: i for i, entry in enumerate(vocab) if isinstance(entry, list) and entry}
        if not isinstance(vocab, dict) or not vocab:
            raise ValueError("tokenizer.json has no model.vocab")
        self.pieces = {i: piece for piece, i in vocab.items() if isinstance(i, int) and isinstance(piece, str)}
        self.special = set()
        for added in spec.get("added_tokens") or ():
            if isinstance(added, dict) and isinstance(added.get("id"), int) and isinstance(added.get("content"), str):
                self.pieces[added["id"]] = added["content"]
                if added.get("special"):
                    self.special.add(added["id"])
        kinds = _decoder_kinds(spec.get("decoder"))
        self.byte_level = "ByteLevel" in kinds
        self.metaspace = "Metaspace" in kinds or ("Replace" in kinds and "ByteFallback" in kinds)
        self.wordpiece = "WordPiece" in kinds

    def decode(self, ids, skip_special: bool = False) -> str:
        out = bytearray()
        for n, i in enumerate(ids):
            piece = self.pieces.get(i)
            if piece is None:
                out += f"<id {i}>".encode()
            elif i in self.special:
                if not skip_special:
                    out += piece.encode()
            elif self.byte_level:
                out += bytes(_BYTES_OF.get(c, 0x3F) for c in piece) if all(c in _BYTES_OF for c in piece) else piece.encode()
            elif self.metaspace:
                fallback = _BYTE_FALLBACK.match(piece)
                out += bytes([int(fallback.group(1), 16)]) if fallback else piece.replace("\u2581", " ").encode()
            elif self.wordpiece:
                out += (piece[2:] if piece.startswith("##") else (" " if n else "") + piece).encode()
            else:
                out += piece.encode()
        return out.decode("utf-8", errors="replace")


def _decoder_kinds(decoder) -> set[str]:
    if not isinstance(decoder, dict):
        return set()
    kinds = {decoder.get("type")}
    for inner in decoder.get("decoders") or ():
        kinds |= _decoder_kinds(inner)
    return {k for k in kinds if isinstance(k, str)}
