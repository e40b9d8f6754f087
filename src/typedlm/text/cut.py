"""Where a document's prompts are cut: the ids before the cut are the document's own, and the text after it (a
piece of the prefix's close, then a question) is the same for every document, so its ids are remembered.

    cutter = CutTokenizer(tokenizer, documents, prefix_close, specials)
    cut = cutter.cut(prefix, first_suffix)               # a Cut: the prefix's ids split, and the text after
    ids = cutter.tail_ids([cut.tail + suffix for suffix in suffixes], cut.anchored)

Contract:
- `cut` gives a `Cut` whose head ids + tail ids are the prefix's own ids; its `tail` is None where no cut holds
  (then every whole prompt is tokenized whole). A cut is checked on the prefix's last `TAIL_TOKENS` tokens with
  the first question, tokenized plainly or behind the anchor (a special token of one id), whichever held last
  tried first.
- `tail_ids` gives each text's ids (tokenized behind the anchor where `anchored`), remembered per text in a cache
  bounded in bytes (`TAIL_CACHE_BYTES`) that the threads tokenizing share.
- `common_prefix_length` is how many leading ids sequences share, compared a chunk at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from typedlm.core.bounded import BoundedCache, ids_bytes, text_bytes
from typedlm.text.pieces import PieceTokenizer

TAIL_TOKENS = 48  # the prefix's last tokens, re-tokenized with the first question to check the cut
TAIL_CACHE_BYTES = 32 << 20  # suffixes whose ids after the cut are remembered (texts and ids)
PREFIX_CHUNK = 256  # token ids compared at a time by common_prefix_length


def common_prefix_length(first: Sequence[int], *others: Sequence[int]) -> int:
    """How many leading token ids `first` shares with every one of `others`."""
    n = len(first)
    for other in others:
        n = min(n, len(other))
        # chunks compared as tuples (at C speed); only a chunk that differs is walked id by id
        for start in range(0, n, PREFIX_CHUNK):
            end = min(start + PREFIX_CHUNK, n)
            mine, theirs = tuple(first[start:end]), tuple(other[start:end])
            if mine != theirs:
                n = start + next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
                break
    return n


@dataclass(frozen=True)
class Cut:
    """A document's prefix ids split where its prompts are cut: `head_ids` + `tail_ids` == ids of the prefix.

    `tail` is the prefix's text from the cut on (a piece of its close), None where no cut holds; `anchored`: the
    text after the cut is tokenized behind the anchor (`CutTokenizer`).
    """

    head_ids: tuple[int, ...]
    tail_ids: tuple[int, ...]
    tail: str | None
    anchored: bool = False

    @cached_property
    def array(self) -> np.ndarray:
        """The prefix's ids (head and tail) as a read-only int64 array."""
        array = np.array(self.head_ids + self.tail_ids, dtype=np.int64)
        array.setflags(write=False)
        return array

    @property
    def nbytes(self) -> int:
        """What the cut keeps alive: its ids (as Python ints and as the array) and its tail's text."""
        n = len(self.head_ids) + len(self.tail_ids)
        return ids_bytes(n) + 8 * n + (text_bytes(self.tail) if self.tail else 0)


class CutTokenizer:
    """The token ids of a document's prompts, cut after the document (see the module)."""

    def __init__(self, tokenizer, documents: PieceTokenizer, prefix_close: str, specials: list[str]):
        self._tokenizer = tokenizer
        self.documents = documents  # a new document's ids: pieces tokenized side by side
        self.prefix_close = prefix_close  # the prefix after the state: the document close, the question opening
        # (anchored, close piece + suffix) -> ids, remembered across requests, bounded in bytes
        self.tails: BoundedCache[tuple[bool, str], tuple[int, ...]] = BoundedCache("tails", TAIL_CACHE_BYTES)
        self._anchor = self._find_anchor(specials)
        self._anchored_first = False  # the way the last document's cut held, tried first on the next one

    def encode_batch(self, texts: list[str], anchored: bool = False) -> list[tuple[int, ...]]:
        """The ids of each text; `anchored`: of the text tokenized behind the anchor, the anchor's id taken off."""
        if not anchored:
            return self.documents.ids_batch(texts)
        anchor, anchor_id = self._anchor
        encoded = self.documents.ids_batch([anchor + text for text in texts])
        return [ids[1:] if ids[:1] == (anchor_id,) else (anchor_id, *ids) for ids in encoded]  # else: no match

    def _find_anchor(self, specials: list[str]) -> tuple[str, int] | None:
        """A special token to tokenize text behind: one id, after which the text's ids are its ids in the middle of
        a prompt. SentencePiece-style tokenizers mark a text's start (`▁` before its first word, Llama-2's and
        Mistral's); after a special token they do not, so the text after a cut can still be tokenized alone."""
        for special in specials:
            ids = list(self._tokenizer(special, add_special_tokens=False)["input_ids"])
            if len(ids) == 1:
                return special, ids[0]
        return None

    def cut(self, prefix: str, first_suffix: str) -> Cut:
        """Where to cut this document's prompts: at the first token of `prefix` that starts in its close.

        Tokenizers split text into short pieces before merging (whitespace, punctuation), so the ids before a
        token boundary of the prefix stay the same whatever follows it. The text after the cut is then a
        piece of the fixed close, the same for every document, and its tokenization with each
        suffix is cached (`tail_ids`). The cut is checked once per document, on the prefix's last `TAIL_TOKENS`
        tokens tokenized alone and with the first question: they must give the prefix's own ids, then the cut's
        (for the same reason, the ids before those tokens cannot change either, so the document is not
        tokenized again with the question). Where that fails, the same check is made with the texts tokenized
        behind the anchor (`_find_anchor`); the way that held last is tried first. A tokenizer for which both fail
        gets every prompt tokenized whole.
        """
        encoded = self.documents.encode(prefix)
        alone, spans = encoded.ids, encoded.has_spans
        close, k = len(prefix) - len(self.prefix_close), len(alone) if spans else 0
        while k and encoded.start(k - 1) >= close:
            k -= 1
        if spans and k < len(alone):
            tail, j = prefix[encoded.start(k) :], max(k - TAIL_TOKENS, 0)
            window = prefix[encoded.start(j) :]
            first = self._anchored_first
            for anchored in (first, not first) if self._anchor else (False,):
                window_alone, window_whole = self.encode_batch([window, window + first_suffix], anchored)
                if (
                    window_alone == alone[j:]
                    and window_whole == alone[j:k] + self.tail_ids([tail + first_suffix], anchored)[0]
                ):
                    self._anchored_first = anchored
                    return Cut(alone[:k], alone[k:], tail, anchored)
        return Cut((), alone, None)

    def tail_ids(self, texts: list[str], anchored: bool = False) -> list[tuple[int, ...]]:
        """The ids of each text (a piece of the prefix's close + a suffix), remembered per text (and whether it was
        tokenized behind the anchor)."""
        keys = [(anchored, text) for text in texts]
        known = {key: ids for key in dict.fromkeys(keys) if (ids := self.tails.get(key)) is not None}
        missing = [key for key in dict.fromkeys(keys) if key not in known]
        if missing:
            for key, ids in zip(missing, self.encode_batch([text for _, text in missing], anchored)):
                known[key] = self.tails.put(key, ids, text_bytes(key[1]) + ids_bytes(ids))
        return [known[key] for key in keys]
