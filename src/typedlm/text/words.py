"""A byte-level BPE tokenizer's ids of a text, from its words' ids remembered across texts.

A fast tokenizer spends most of a new document's time splitting the text into words (its regular expression) and
building spans, not merging bytes: words repeat, and it remembers each word's merges. Here the text is split by
the same regular expression (the `regex` module, from Python) and each word's ids are looked up in a table of
words seen before; a word not seen yet is merged by the tokenizer's own BPE model (`tokenizers`), so every id
still comes from the tokenizer itself. One call per document, two to three times faster than the tokenizer's own
(2.4× on news articles whose words are partly new, 3.3× on a thread whose words are all known: docs/performance.md),
where nothing but the split could differ:

- only tokenizers whose pipeline is exactly "special tokens, then the regular expression, then byte-level BPE"
  (GPT-2's, SmolLM's, Qwen's, Llama-3's shape: no normalizer but Unicode's forms, which leave ASCII as it is; no
  dropout, no byte fallback, special tokens matched as written) are taken (`WordTokenizer.of`);
- only texts of admitted characters: ASCII, on which a regular expression's character classes (`\\p{L}`,
  `\\p{N}`, `\\s`) are the same in any two engines, and those of `EXTRA_CANDIDATES` (Latin-1's letters and signs,
  typographic quotes and dashes, the euro) that the tokenizer's normalizer leaves as they are and that pass a
  probe of their own; not every Unicode version's letters;
- once per tokenizer, a probe of every ASCII character next to every kind of neighbour, and random ASCII texts,
  must give the tokenizer's own ids and spans, else the tokenizer is not taken; each extra character is admitted
  only where its own probe (next to every kind of neighbour) holds, and all of them only where random texts mixing
  them with ASCII hold too;
- a text whose tokens start inside a character (a character's bytes split between tokens) is not taken.

Any other text goes to `fallback` (pieces side by side, `typedlm.text.pieces`).
"""

from __future__ import annotations

import json
import random
import re
import string
import unicodedata
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
# characters beyond ASCII that documents carry often (a pound or euro sign, an accented name, a typographic quote
# or dash), each admitted where the tokenizer's normalizer leaves it as it is and its probe holds
EXTRA_CANDIDATES = (
    "".join(chr(c) for c in range(0xA0, 0x100)) + "\u2013\u2014\u2018\u2019\u201c\u201d\u2022\u2026\u20ac"
)
EXTRA_NEIGHBOURS = ["a", "Z", "7", " ", "  ", "\n", ".", "'"]  # an extra character's neighbours in its probe


@dataclass
class WordEncoded:
    """A text's ids and the character where each token starts (where the bytes of the tokens before it end, read
    as characters)."""

    ids: tuple[int, ...]
    starts: np.ndarray
    has_spans = True

    def start(self, i: int) -> int:
        return int(self.starts[i])


class WordTokenizer:
    """A text's ids: one of admitted characters from its words (see the module's docstring), any other from
    `fallback`. Safe to call from several threads (the table of words is only read and added to)."""

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
        self._to_byte_chars = str.maketrans(_byte_chars())  # from a word's bytes read as Latin-1
        self._admit("")
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
        if not words.holds([*probe_texts(), with_specials]):
            return None
        form = _normal_form(backend)
        admitted = []
        for char in EXTRA_CANDIDATES:
            if unicodedata.combining(char) or (form is not None and not unicodedata.is_normalized(form, char)):
                continue
            words._admit(char)
            if words.holds([extra_probe_text(char)], from_words=True):
                admitted.append(char)
        words._admit("".join(admitted))
        if not words.holds(mixed_probe_texts(admitted)):
            words._admit("")
        return words

    @property
    def extra_chars(self) -> str:
        """The characters beyond ASCII a text may hold and still be tokenized from its words."""
        return self._extra

    def _admit(self, extra: str) -> None:
        self._extra = extra
        self._outside = re.compile("[^\\x00-\\x7f" + "".join(re.escape(c) for c in extra) + "]")

    def admits(self, text: str) -> bool:
        """Whether `text` holds admitted characters alone (its ids can come from its words)."""
        return text.isascii() or self._outside.search(text) is None

    def forget(self) -> None:
        """Forget every word's ids (as a new server starts)."""
        self._words.clear()

    def holds(self, texts: list[str], *, from_words: bool = False) -> bool:
        """Whether every text's ids and spans are the tokenizer's own; `from_words`: and each is read from its words
        (not sent to `fallback`)."""
        for text in texts:
            encoded = self._tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            got = self._encode_words(text)
            if got is None and from_words:
                return False
            got = got or self.fallback.encode(text)
            if got.ids != tuple(encoded["input_ids"]):
                return False
            if [got.start(i) for i in range(len(got.ids))] != [a for a, _ in encoded["offset_mapping"]]:
                return False
        return True

    def encode(self, text: str) -> Encoded | WordEncoded:
        encoded = self._encode_words(text)
        if encoded is None:
            return self.fallback.encode(text)
        self.words_texts += 1
        return encoded

    def ids_batch(self, texts: list[str]) -> list[tuple[int, ...]]:
        """The ids of each (short) text: one of admitted characters from its words, the others in one call of
        `fallback`."""
        got = [self._encode_words(text) for text in texts]
        rest = [text for text, encoded in zip(texts, got) if encoded is None]
        others = iter(self.fallback.ids_batch(rest) if rest else [])
        return [encoded.ids if encoded is not None else next(others) for encoded in got]

    def _encode_words(self, text: str) -> WordEncoded | None:
        """The text's ids from its words; None where it holds a character not admitted, where the tokens do not
        spell the text byte for byte (a byte the vocabulary lacks is dropped by BPE without a fallback, and its
        spans would move) or where a token starts inside a character."""
        if not self.admits(text):
            return None
        parts = self._special_split.split(text) if self._special_split is not None else [text]
        ids: list[int] = []
        for j, part in enumerate(parts):
            if j % 2:  # a special token, as written
                ids.append(self._specials[part])
            elif part:
                ids += self._word_ids(part)
        ends = np.cumsum(self.lengths[np.asarray(ids, dtype=np.int64)])  # in bytes
        starts = np.concatenate(([0], ends[:-1])).astype(np.int64)
        if text.isascii():  # a byte a character
            return WordEncoded(tuple(ids), starts) if not len(ends) or ends[-1] == len(text) else None
        utf8 = np.frombuffer(text.encode(), dtype=np.uint8)
        if not len(ends) or ends[-1] != len(utf8):
            return None
        opens = (utf8 & 0xC0) != 0x80  # the first byte of a character
        if not opens[starts].all():
            return None
        char_of_byte = np.cumsum(opens) - 1
        return WordEncoded(tuple(ids), char_of_byte[starts])

    def _word_ids(self, text: str) -> list[int]:
        words = self._split.findall(text)
        known = list(map(self._words.get, words))
        if None in known:
            for k, word in enumerate(words):
                if known[k] is None:
                    known[k] = self._merge(word)
        return [i for word_ids in known for i in word_ids]

    def _merge(self, word: str) -> tuple[int, ...]:
        byte_chars = word.encode().decode("latin-1").translate(self._to_byte_chars)
        ids = tuple(token.id for token in self._model.tokenize(byte_chars))
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
    if backend.normalizer is not None and _normal_form(backend) not in ASCII_INVARIANT:
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


def _normal_form(backend) -> str | None:
    """The type of the pipeline's normalizer (NFC, Lowercase, ...); None where it has none."""
    return json.loads(backend.normalizer.__getstate__()).get("type") if backend.normalizer is not None else None


def _byte_chars() -> dict[str, str]:
    """The character byte-level BPE writes for each byte, keyed by the byte read as Latin-1 (GPT-2's table: a
    printable byte, 33-126, 161-172 and 174-255, as itself; the others moved past 255 in order)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    moved = [b for b in range(256) if b not in printable]
    table = {chr(b): chr(b) for b in printable}
    table.update({chr(b): chr(256 + n) for n, b in enumerate(moved)})
    return table


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


def extra_probe_text(char: str) -> str:
    """`char` next to every kind of neighbour (letters, digits, spaces, a line break, punctuation, an apostrophe),
    alone and doubled; nothing else beyond ASCII, so the text is read from its words once `char` is admitted."""
    pairs = [(left, right) for left in EXTRA_NEIGHBOURS for right in EXTRA_NEIGHBOURS]
    return "|".join(f"{left}{char}{right}{char}{char}{right}" for left, right in pairs)


def mixed_probe_texts(extra: list[str], seed: int = 0) -> list[str]:
    """Random texts of ASCII words and signs mixed with the `extra` characters and words written with them (fixed
    seed); every character ASCII or in `extra`, so each text is read from its words."""
    if not extra:
        return []
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " " * 12 + "\n" * 3 + "".join(extra) * 2
    words = ["the", "café", "Zoë", "£5", "it’s", "€10", "—", "“quoted”", "naïve", "1042", "'s", "São Paulo"]
    words = [word for word in words if all(c.isascii() or c in extra for c in word)]
    texts = []
    for _ in range(PROBE_TEXTS):
        parts = [rng.choice(words) if rng.random() < 0.5 else rng.choice(alphabet) for _ in range(rng.randint(1, 200))]
        texts.append("".join(parts))
    return texts
