"""A long text's token ids from its pieces, tokenized side by side.

A new document is most of a request's host work before the model runs (about 1 ms for 1,300 tokens), and a fast
tokenizer spends it on one core. Its batch call spreads several texts over its threads, so a long text is cut into
pieces, the pieces are tokenized in one batch call and their ids joined. That gives the whole text's ids wherever
no token crosses a seam: seams are put before a word (a space after a non-space, then a letter), where the usual
tokenizers split text into words before merging characters (byte-level BPE's pre-tokenizers: GPT-2's, Qwen's,
Llama-3's, SmolLM's; SentencePiece-style ones mark the space before a word, `▁`, as part of it).

That is checked, never assumed:
- once per tokenizer, on a probe text cut before every word (`PieceTokenizer.joins`): the pieces' ids, joined,
  must be the whole text's ids, else the tokenizer's texts are never cut;
- at every seam of every text: the tokens around it (`SEAM_TOKENS` on each side) are tokenized again as one text
  and must be the joined ids there. Where one is not, the text is tokenized whole.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from itertools import pairwise

PIECE_CHARS = 1024  # a long text is cut about every this many characters (0: never)
SEAM_TOKENS = 8  # the tokens on each side of a seam tokenized again to check it
PROBE = (
    'The parcel came late, and the box was broken.\nOrder 1042 (express): refund it?\n  Then: \'twas "fine"; '
    "naïve café, 東京 and emoji 🙂 too.\tTabs, CAPITALS, MixedCase and snake_case words end it."
)


@dataclass
class Encoded:
    """A text's token ids, and where each token starts in it (`start`): read from its pieces' encodings only
    where asked, since a caller needs a few tokens' spans, not every token's. `encodings` is None where the
    tokenizer gives no spans (a tokenizer written in Python)."""

    ids: tuple[int, ...]
    firsts: list[int]  # each piece's first token
    offsets: list[int]  # each piece's first character in the text
    encodings: list | None  # each piece's `tokenizers.Encoding`
    _spans: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # a piece's spans, once read

    @property
    def has_spans(self) -> bool:
        return self.encodings is not None

    def start(self, i: int) -> int:
        """The character of the text where token `i` starts."""
        piece = bisect_right(self.firsts, i) - 1
        spans = self._spans.get(piece)
        if spans is None:
            spans = self._spans[piece] = self.encodings[piece].offsets
        return self.offsets[piece] + spans[i - self.firsts[piece]][0]


class PieceTokenizer:
    """Token ids of a text, a long one tokenized in pieces side by side where that gives the whole text's ids
    (see the module's docstring). `piece_chars`: about how long a piece is (0: never cut)."""

    def __init__(self, tokenizer, piece_chars: int = PIECE_CHARS):
        self._tokenizer = tokenizer
        self.piece_chars = piece_chars
        self.splits = piece_chars > 0 and bool(getattr(tokenizer, "is_fast", False)) and self.joins(PROBE)
        self.seams_failed = 0  # texts tokenized whole after a seam's check failed

    def encode(self, text: str) -> Encoded:
        """The ids of `text`, with each token's start where the tokenizer gives spans."""
        seams = self._seams(text) if self.splits else []
        if seams:
            encoded = self._joined(text, seams)
            if self._seams_hold(text, encoded):
                return encoded
            self.seams_failed += 1
        return self._joined(text, [])

    def ids_batch(self, texts: list[str]) -> list[tuple[int, ...]]:
        """The ids of each (short) text, in one batch call of the tokenizer."""
        return [tuple(ids) for ids in self._tokenizer(texts, add_special_tokens=False)["input_ids"]]

    def joins(self, text: str) -> bool:
        """Whether `text` cut before every word, its pieces tokenized alone and joined, gives its own ids."""
        seams = [i for i in range(1, len(text) - 1) if _before_word(text, i)]
        return bool(seams) and self._joined(text, seams).ids == self._joined(text, []).ids

    def _seams(self, text: str) -> list[int]:
        """Where to cut `text`: before a word about every `piece_chars` characters, no piece shorter than half that
        (none for a text shorter than one and a half pieces, or one without words)."""
        size, half = self.piece_chars, self.piece_chars // 2
        seams, last = [], 0
        for target in range(size, len(text) - half, size):
            seam = _word_start_before(text, last + half, target)
            if seam is not None:
                seams.append(seam)
                last = seam
        return seams

    def _joined(self, text: str, seams: list[int]) -> Encoded:
        """The pieces between `seams` tokenized in one batch call (on the tokenizer's threads), their ids joined."""
        bounds = [0, *seams, len(text)]
        batch = self._tokenizer([text[a:b] for a, b in pairwise(bounds)], add_special_tokens=False)
        ids: list[int] = []
        firsts = []
        for piece_ids in batch["input_ids"]:
            firsts.append(len(ids))
            ids += piece_ids
        return Encoded(tuple(ids), firsts, bounds[:-1], batch.encodings)

    def _seams_hold(self, text: str, encoded: Encoded) -> bool:
        """Whether the text around each seam, tokenized as one, gives the joined ids there. A window ends where a
        joined token starts, and starts where one starts at a word (a text's first word is marked as any other's by
        the tokenizers that split at all: the probe's pieces start there too), at the latest `SEAM_TOKENS` before
        the seam; one that starts or ends inside a character (a byte-level token) gets other ids, so the check
        fails safely."""
        ids, n, firsts = encoded.ids, len(encoded.ids), encoded.firsts
        if len(set(firsts)) < len(firsts) or firsts[-1] == n:
            return False  # a piece without ids: nothing to check its seams on
        windows, expected = [], []
        for first in firsts[1:]:
            begin, end = max(first - SEAM_TOKENS, 0), min(first + SEAM_TOKENS, n)
            while begin and not _before_word(text, encoded.start(begin)):  # stops at the last seam at the latest
                begin -= 1
            windows.append(text[encoded.start(begin) : encoded.start(end) if end < n else len(text)])
            expected.append(ids[begin:end])
        got = self._tokenizer(windows, add_special_tokens=False)["input_ids"]
        return all(tuple(window) == want for window, want in zip(got, expected, strict=True))


def _before_word(text: str, i: int) -> bool:
    """Whether `i` is a space after a non-space and before a letter: a word's start."""
    return 0 < i < len(text) - 1 and text[i] == " " and not text[i - 1].isspace() and text[i + 1].isalpha()


def _word_start_before(text: str, low: int, high: int) -> int | None:
    """The last word start (see `_before_word`) in [low, high), else None."""
    i = text.rfind(" ", low, high)
    while i > 0:  # `_before_word` checks the neighbours' bounds
        if _before_word(text, i):
            return i
        i = text.rfind(" ", low, i)
    return None
