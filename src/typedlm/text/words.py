"""A byte-level BPE tokenizer's ids of a plain-ASCII text, from its words' ids remembered across texts.

A fast tokenizer spends most of a new document's time splitting the text into words (its regular expression) and
building spans, not merging bytes: words repeat, and it remembers each word's merges. Here the text is split by
the same regular expression (the `regex` module, from Python) and each word's ids are looked up in a table of
words seen before; a word not seen yet is merged by the tokenizer's own BPE model (`tokenizers`), so every id
still comes from the tokenizer itself. One call per document, about three times faster than the tokenizer's own
(docs/performance.md), where nothing but the split could differ:

- only tokenizers whose pipeline is exactly "special tokens, then the regular expression, then byte-level BPE"
  (GPT-2's, SmolLM's, Qwen's, Llama-3's shape: no normalizer but Unicode's forms, which leave ASCII as it is; no
  dropout, no byte fallback, special tokens matched as written) are taken (`WordTokenizer.of`);
- only ASCII texts: a regular expression's character classes (`\\p{L}`, `\\p{N}`, `\\s`) are the same in any two
  engines on ASCII, not on every Unicode version's letters;
- once per tokenizer, a probe of every ASCII character next to every kind of neighbour, and random ASCII texts,
  must give the tokenizer's own ids and spans, else the tokenizer is not taken.

Any other text goes to `fallback` (pieces side by side, `typedlm.text.pieces`).
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass

import numpy as np
import regex
import tokenizers

from typedlm.text.pieces import PROBE, Encoded, PieceTokenizer

GPT2_SPLIT = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
MAX_WORDS = 1 << 15  # words remembered (then forgotten all at once): a few MB
MAX_WORD_CHARS = 48  # a longer word is merged each time, not remembered
ASCII_INVARIANT = {"NFC", "NFD", "NFKC", "NFKD"}  # normalizers that leave ASCII text as it is
PROBE_TEXTS = 64  # random ASCII texts in the probe


@dataclass
class WordEncoded:
    """A text's ids and where each token starts (an ASCII text: bytes are characters, so a token starts where
    the bytes of the tokens before it end)."""

    ids: tuple[int, ...]
    starts: np.ndarray
    has_spans = True

    def start(self, i: int) -> int:
        return int(self.starts[i])


class WordTokenizer:
    """A text's ids: an ASCII one from its words (see the module's docstring), any other from `fallback`.
    Safe to call from several threads (the table of words is only read and added to)."""

    def __init__(self, tokenizer, fallback: PieceTokenizer, split: str, specials: dict[str, int]):
        self._tokenizer = tokenizer
        self.fallback = fallback
        self._model = tokenizer.backend_tokenizer.model
        self._split = regex.compile(split)
        self._specials = specials
        self._special_split = (
            regex.compile("(" + "|".join(regex.escape(s) for s in sorted(specials, key=len, reverse=True)) + ")")
            if specials
            else None
        )
        self._ascii_to_byte_chars = str.maketrans(_ascii_byte_chars())
        self._words: dict[str, tuple[int, ...]] = {}
        vocab = tokenizer.backend_tokenizer.get_vocab(with_added_tokens=True)
        self.lengths = np.zeros(max(vocab.values()) + 1, dtype=np.int64)  # a byte-level token: a character a byte
        for token, i in vocab.items():
            self.lengths[i] = len(token)
        self.words_texts = 0  # texts tokenized from their words (the rest went to `fallback`)

    @classmethod
    def of(cls, tokenizer, fallback: PieceTokenizer) -> WordTokenizer | None:
        """The word tokenizer for `tokenizer` where its pipeline is the one this reproduces and the probe holds,
        else None."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        split = _split_of(backend)
        if split is None:
            return None
        specials = {}
        for i, added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
            if added.lstrip or added.rstrip or added.single_word or not added.content:
                return None
            specials[added.content] = i
        words = cls(tokenizer, fallback, split, specials)
        with_specials = "\n".join(f"x{special} {special}y" for special in specials if special.isascii())
        return words if words.holds([*probe_texts(), with_specials]) else None

    def forget(self) -> None:
        """Forget every word's ids (as a new server starts)."""
        self._words.clear()

    def holds(self, texts: list[str]) -> bool:
        """Whether every text's ids and spans are the tokenizer's own."""
        for text in texts:
            encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            got = self._encode_ascii(text) if text.isascii() else None
            got = got or self.fallback.encode(text)
            if got.ids != tuple(encoded["input_ids"]):
                return False
            if [got.start(i) for i in range(len(got.ids))] != [a for a, _ in encoded["offset_mapping"]]:
                return False
        return True

    def encode(self, text: str) -> Encoded | WordEncoded:
        encoded = self._encode_ascii(text) if text.isascii() else None
        if encoded is None:
            return self.fallback.encode(text)
        self.words_texts += 1
        return encoded

    def ids_batch(self, texts: list[str]) -> list[tuple[int, ...]]:
        """The ids of each (short) text: an ASCII one from its words, the others in one call of `fallback`."""
        got = [self._encode_ascii(text) if text.isascii() else None for text in texts]
        rest = [text for text, encoded in zip(texts, got) if encoded is None]
        others = iter(self.fallback.ids_batch(rest) if rest else [])
        return [encoded.ids if encoded is not None else next(others) for encoded in got]

    def _encode_ascii(self, text: str) -> WordEncoded | None:
        """The text's ids from its words; None where the tokens do not spell the text byte for byte (a byte the
        vocabulary lacks is dropped by BPE without a fallback, and its spans would move)."""
        parts = self._special_split.split(text) if self._special_split is not None else [text]
        ids: list[int] = []
        for j, part in enumerate(parts):
            if j % 2:  # a special token, as written
                ids.append(self._specials[part])
            elif part:
                ids += self._word_ids(part)
        ends = np.cumsum(self.lengths[np.asarray(ids, dtype=np.int64)])
        if len(ends) and ends[-1] != len(text):
            return None
        return WordEncoded(tuple(ids), np.concatenate(([0], ends[:-1])))

    def _word_ids(self, text: str) -> list[int]:
        words = self._split.findall(text)
        known = list(map(self._words.get, words))
        if None in known:
            for k, word in enumerate(words):
                if known[k] is None:
                    known[k] = self._merge(word)
        return [i for word_ids in known for i in word_ids]

    def _merge(self, word: str) -> tuple[int, ...]:
        ids = tuple(token.id for token in self._model.tokenize(word.translate(self._ascii_to_byte_chars)))
        if len(word) <= MAX_WORD_CHARS:
            if len(self._words) >= MAX_WORDS:
                self._words.clear()
            self._words[word] = ids
        return ids


def _split_of(backend) -> str | None:
    """The regular expression splitting text into words, where the pipeline (a `tokenizers.Tokenizer`) is special
    tokens, that expression and byte-level BPE alone; else None."""
    model = backend.model
    if not isinstance(model, tokenizers.models.BPE) or model.dropout or model.byte_fallback:
        return None
    if model.continuing_subword_prefix or model.end_of_word_suffix:
        return None
    normalizer = backend.normalizer
    if normalizer is not None and json.loads(normalizer.__getstate__()).get("type") not in ASCII_INVARIANT:
        return None
    pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
    if pre.get("type") == "ByteLevel":
        return GPT2_SPLIT if pre.get("use_regex", True) and not pre.get("add_prefix_space") else None
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else []
    if len(steps) != 2:
        return None
    split, byte_level = steps
    pattern = (split.get("pattern") or {}).get("Regex")
    if split.get("type") != "Split" or pattern is None or split.get("behavior") != "Isolated" or split.get("invert"):
        return None
    if byte_level.get("type") != "ByteLevel" or byte_level.get("use_regex") or byte_level.get("add_prefix_space"):
        return None
    return pattern


def _ascii_byte_chars() -> dict[str, str]:
    """The character byte-level BPE writes for each ASCII byte (GPT-2's table: a printable byte as itself, the
    others moved past 255 in order: bytes 0-32 to 256-288, 127 to 289)."""
    return {chr(b): chr(b) if 33 <= b <= 126 else chr(256 + b if b < 33 else 289) for b in range(128)}


def probe_texts(seed: int = 0) -> list[str]:
    """Every ASCII character next to every kind of neighbour (letters, digits, spaces, line breaks, punctuation,
    apostrophes), the pieces' probe's ASCII part, and random ASCII texts (fixed seed)."""
    ascii_chars = [chr(c) for c in range(128)]
    neighbours = ["a", "Z", "7", " ", "  ", "\n", "\r\n", "\t", "'", ".", "'s", "'ll", "x "]
    texts = ["".join(f"{left}{c}{right}" for c in ascii_chars) for left in neighbours for right in neighbours]
    texts.append(PROBE.encode("ascii", "ignore").decode())
    rng = random.Random(seed)
    alphabet = string.printable + "\x00\x01\x0b\x0c\x1c\x1f\x7f" + "'" * 8 + " " * 16
    words = ["the", "Parcel", "refund", "it's", "I'LL", "we've", "1042", "3.14", "snake_case", "<b>", "--", "..."]
    for _ in range(PROBE_TEXTS):
        parts = [rng.choice(words) if rng.random() < 0.5 else rng.choice(alphabet) * rng.randint(1, 3)]
        parts += [rng.choice(words) if rng.random() < 0.5 else rng.choice(alphabet) for _ in range(rng.randint(0, 200))]
        texts.append("".join(parts))
    return texts
