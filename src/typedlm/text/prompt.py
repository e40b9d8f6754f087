"""Prompt rendering and the prefix/suffix token split. Text in, token ids out; no model.

Layout, rendered with the model's own chat template (thinking off for Qwen3-style templates):

    [system turn: SYSTEM_PROMPT] [user turn: <document>\\n{state}\\n</document>\\n\\nQuestion:  ← prefix, shared
                                  {rest of the question block}] [assistant turn opening]  ← suffix, one per question

Every question block starts with the same words (`QUESTION_OPEN`), so they close the shared prefix: computed once
per document rather than once per question (the prompt is the same text either way).

The template is rendered once with sentinels in place of the state and the question, and cut there,
so any template works. Token boundaries are the trap: BPE may merge characters across the cut (Qwen's
pre-tokenizer glues ">" to the newlines after it). So the split is made on token ids, not text:
the shared prefix is the longest common prefix of every question's whole-prompt ids and of the
prefix's own ids, and feeding prefix + suffix is exactly the ids of the whole prompt.

Tokenizing each whole prompt would cost Q tokenizations of the document. Instead a document's prompts are cut at
a token boundary inside the prefix's close (`ChatLayout.prefix_close`: the document close and the question opening;
`typedlm.text.cut`): the ids before it are the document's own, and the text after it (a piece of the close, then the
question) is the same for every document, so its ids are remembered per question. The cut is checked once per
document, on the document's last tokens with the first question; documents are remembered (by their exact text)
with their ids and checked cut, so a repeated document is not tokenized again. A long new document is tokenized in
pieces side by side (`typedlm.text.pieces`), each seam checked the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from typedlm.core.bounded import BoundedCache, text_bytes
from typedlm.core.errors import ModelError
from typedlm.core.names import Kind
from typedlm.core.questions import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion, Text
from typedlm.text.cut import Cut, CutTokenizer, common_prefix_length
from typedlm.text.labels import choice_labels, score_labels
from typedlm.text.pieces import PIECE_CHARS, PieceTokenizer


@dataclass(frozen=True)
class Wording:
    """What the model is told besides the document and the question: the system prompt, and each kind's closing
    instruction. A calibration file records the version it was fitted with (its numbers hold for that one only)."""

    system: str
    noul: str = "Answer yes or no."
    choice_letters: str = "Answer with the label of the best option."
    choice_names: str = "Answer with the name of the best option, exactly as written."
    score: str = "Answer with the level number."


# Prompt versions. "1" is the default; the others are candidates measured against it on the labeled sets' train
# splits (docs/calibration.md, "Prompt wording"): a model whose shipped calibration was fitted with another version
# reads with that one.
WORDINGS = {
    "1": Wording(
        "You read a document and answer one question about it. "
        "Reply with the answer's label only: yes or no, an option's label, or a level number."
    ),
    # a reader told to judge by the document alone and to give its best guess where the document is silent
    "2-system": Wording(
        "You are a careful reader. Answer the question using only the document. When the document does not "
        "settle it, give the most likely answer. Reply with the answer's label only: yes or no, an option's "
        "label, or a level number."
    ),
    # the same system prompt; each question ends asking for the label alone, in the words of the system prompt
    "2-question": Wording(
        "You read a document and answer one question about it. "
        "Reply with the answer's label only: yes or no, an option's label, or a level number.",
        noul="Reply with one word: yes or no.",
        choice_letters="Reply with the letter of the best option only.",
        choice_names="Reply with the best option's name only, exactly as written.",
        score="Reply with the level number only.",
    ),
}
PROMPT_VERSION = "1"
SYSTEM_PROMPT = WORDINGS[PROMPT_VERSION].system


def wording(version: str) -> Wording:
    """The wording of a prompt version; a `ModelError` naming the known ones for any other."""
    try:
        return WORDINGS[version]
    except KeyError:
        raise ModelError(f"unknown prompt version {version!r}: one of {', '.join(WORDINGS)}") from None


DOCUMENT_OPEN = "<document>\n"
DOCUMENT_CLOSE = "\n</document>"
QUESTION_LEAD = "\n\n"
QUESTION_OPEN = "Question:"  # how every question block starts (the prefix ends with it; see `ChatLayout`)
DOCUMENT_CACHE_BYTES = 64 << 20  # documents whose prefix ids and checked cut are remembered (texts and ids)
SUFFIX_TEXT_BYTES = 32 << 20  # questions whose suffix text is remembered (questions and texts)
WORD_JOINER = "\u2060"  # invisible; breaks a control-token string in user text into plain text
_STATE = "\x00typedlm-state\x00"
_QUESTION = "\x00typedlm-question\x00"
# A plain layout for models without a chat template (base models).
_PLAIN_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] | capitalize }}: {{ m['content'] }}\n\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)


def render_text(value: Text | None) -> str:
    """Strings as they are (trimmed); objects and arrays as readable JSON."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value.strip()
    return json.dumps(value, ensure_ascii=False, indent=2)


def _described(name: str, description: Text | None) -> str:
    text = render_text(description)
    return f"{name}: {text}" if text else name


def _noul_lines(question: NoulQuestion, words: Wording) -> list[str]:
    lines = [f"{QUESTION_OPEN} {render_text(question.instructions) or 'Is this true of the document?'}"]
    if question.true is not None:
        lines.append(f"Answer yes if: {render_text(question.true)}")
    if question.false is not None:
        lines.append(f"Answer no if: {render_text(question.false)}")
    lines.append(words.noul)
    return lines


def _choice_lines(question: ChoiceQuestion, words: Wording) -> list[str]:
    lines = [f"{QUESTION_OPEN} {render_text(question.instructions) or 'Which option fits the document best?'}"]
    lines.append("Options:")
    if question.by_name:  # answered by the option's own name (see ChoiceQuestion.by_name)
        lines += [f"- {_described(name, desc)}" for name, desc in question.options]
        lines.append(words.choice_names)
        return lines
    labels = choice_labels(len(question.options))
    lines += [f"{label}) {_described(name, desc)}" for label, (name, desc) in zip(labels, question.options)]
    lines.append(words.choice_letters)
    return lines


def _score_lines(question: ScoreQuestion, words: Wording) -> list[str]:
    lines = [f"{QUESTION_OPEN} {render_text(question.instructions) or 'Rate the document on this scale.'}"]
    lines.append("Levels:")
    lines += [f"{i}: {render_text(level)}" for i, level in zip(score_labels(len(question.levels)), question.levels)]
    lines.append(words.score)
    return lines


_QUESTION_LINES = {Kind.NOUL: _noul_lines, Kind.CHOICE: _choice_lines, Kind.SCORE: _score_lines}


def question_block(question: Question, version: str = PROMPT_VERSION) -> str:
    """The question as the model reads it: text, options or levels, and the answer format (in `version`'s words)."""
    return "\n".join(_QUESTION_LINES[question.kind](question, wording(version)))


@dataclass(frozen=True)
class TokenizedPrompt:
    """A request's prompt as token ids: one shared prefix, one suffix per question.

    `prefix_array` holds the prefix's ids too, as a read-only int64 array (shared by the requests on one
    document: what a forward's inputs are copied from without converting Python ints).
    """

    prefix_ids: list[int]
    suffix_ids: list[list[int]]
    prefix_array: np.ndarray


class ChatLayout:
    """The chat template cut into its fixed pieces: head, document close (then the question opening), and answer
    opening."""

    def __init__(self, tokenizer, version: str = PROMPT_VERSION, piece_chars: int = PIECE_CHARS):
        self._tokenizer = tokenizer
        self.pieces = PieceTokenizer(tokenizer, piece_chars)  # a new document's ids: pieces tokenized side by side
        self.version = version  # the prompt version (see `WORDINGS`)
        messages = [
            {"role": "system", "content": wording(version).system},
            {"role": "user", "content": f"{DOCUMENT_OPEN}{_STATE}{DOCUMENT_CLOSE}{_QUESTION}"},
        ]
        template = tokenizer.chat_template if getattr(tokenizer, "chat_template", None) else _PLAIN_TEMPLATE
        try:
            rendered = tokenizer.apply_chat_template(
                messages, chat_template=template, tokenize=False, add_generation_prompt=True, enable_thinking=False
            )
        except Exception as exc:
            raise ModelError(f"the model's chat template cannot render a system + user turn: {exc}") from exc
        if rendered.count(_STATE) != 1 or rendered.count(_QUESTION) != 1:
            raise ModelError("the model's chat template does not keep the user message verbatim")
        head, rest = rendered.split(_STATE)
        self.head = head  # everything up to the state: system turn, user turn opening, <document>
        self.document_close, self.answer_opening = rest.split(_QUESTION)
        self.question_opening = f"{QUESTION_LEAD}{QUESTION_OPEN}"  # every suffix's shared start, in the prefix
        self.prefix_close = f"{self.document_close}{self.question_opening}"  # the prefix after the state
        self.system_ids = self.encode(head)
        # Remembered across requests, each bounded in bytes and shared by the threads that tokenize:
        # (state or prefix text) -> its cut; question -> its suffix text (and, in the cutter, the ids after a cut)
        self.documents: BoundedCache[tuple[str, str], Cut] = BoundedCache("documents", DOCUMENT_CACHE_BYTES)
        self.suffix_texts: BoundedCache[Question, str] = BoundedCache("suffix_texts", SUFFIX_TEXT_BYTES)
        # Strings the tokenizer turns into control tokens (<|im_end|>, <|im_start|>, ...). In user text
        # they would let a document close its own turn and answer for the model, so they are defused.
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        specials = set(getattr(tokenizer, "all_special_tokens", [])) | {t.content for t in added.values() if t.special}
        self._control_strings = sorted((s for s in specials if len(s) > 1), key=len, reverse=True)
        # where a document's prompts are cut, and the ids of the text after the cut, remembered per question
        self.cutter = CutTokenizer(tokenizer, self.pieces, self.prefix_close, sorted(specials))

    def defuse(self, text: str) -> str:
        """User text with every control-token string broken by a word joiner, so it tokenizes as text."""
        for control in self._control_strings:
            if control in text:
                text = text.replace(control, control[0] + WORD_JOINER + control[1:])
        return text

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def document_text(self, state: Text) -> str:
        """The prompt up to the document's close: system turn, user turn opening, the state."""
        return f"{self.head}{self.defuse(render_text(state))}{self.document_close}"

    def prefix_text(self, state: Text) -> str:
        """The text every question of a request shares: the document, then the opening of a question block."""
        return f"{self.document_text(state)}{self.question_opening}"

    def suffix_text(self, question: Question) -> str:
        try:
            text = self.suffix_texts.get(question)
        except TypeError:  # a question holding an object or array is not hashable: rendered every time
            return self.render_suffix(question)
        if text is None:
            text = self.render_suffix(question)
            # the question holds about the text's characters (its names, descriptions and instructions) too
            text = self.suffix_texts.put(question, text, 2 * text_bytes(text))
        return text

    def suffix_chars(self, question: Question) -> int:
        """The length of the question's suffix text, without keeping the text where it is not kept already (a
        request's size is checked on it before anything of the request is kept)."""
        try:
            known = self.suffix_texts.peek(question)
        except TypeError:  # a question holding an object or array is not hashable
            known = None
        return len(known if known is not None else self.render_suffix(question))

    def render_suffix(self, question: Question) -> str:
        """The question's suffix text, rendered anew (`suffix_text` remembers it)."""
        block = self.defuse(question_block(question, self.version))
        assert block.startswith(QUESTION_OPEN), "every question block opens the same way"
        return f"{block.removeprefix(QUESTION_OPEN)}{self.answer_opening}"

    def tokenize(self, state: Text, questions: Sequence[Question]) -> TokenizedPrompt:
        """Token ids of the shared prefix and of each question's suffix; prefix + suffix == ids of the whole.
        Safe to call from several threads: the caches are touched under a lock, a new document is tokenized
        outside it (several documents at once, where the tokenizer releases the GIL)."""
        suffixes = [self.suffix_text(question) for question in questions]
        key, prefix = self._document_key(state)
        cut = self.documents.get(key)
        if cut is None:
            prefix = prefix or self.prefix_text(state)
            cut = self.cutter.cut(prefix, suffixes[0])  # the long part: the whole document tokenized
            cut = self.documents.put(key, cut, cut.nbytes + text_bytes(key[1]))  # a thread that cut it meanwhile:
            # the same cut
        if cut.tail is None:  # no cut holds for this document: every whole prompt tokenized whole
            prefix = prefix or self.prefix_text(state)
            tails = self.cutter.encode_batch([prefix + suffix for suffix in suffixes])
        else:
            tails = self.cutter.tail_ids([cut.tail + suffix for suffix in suffixes], cut.anchored)
        n = common_prefix_length(cut.tail_ids, *tails)
        prefix_ids = [*cut.head_ids, *cut.tail_ids[:n]]
        array = cut.array[: len(prefix_ids)]  # the document's array (a view), shared by every request on it
        prompt = TokenizedPrompt(prefix_ids, [list(ids[n:]) for ids in tails], array)
        assert all(prompt.suffix_ids), "every question has at least one token of its own"
        return prompt

    def _document_key(self, state: Text) -> tuple[tuple[str, str], str | None]:
        """The document cache's key for `state`, and its prefix text where making the key rendered it: a string
        state is its own key (rendering its prefix text scans it for control strings); an object's or array's key
        is its prefix text."""
        prefix = None if isinstance(state, str) else self.prefix_text(state)
        return (("state", state) if prefix is None else ("prefix", prefix)), prefix

    def cut_holds(self, state: Text) -> bool | None:
        """Whether `state`'s prompt was cut after the document (each suffix then tokenized alone, the usual case)
        or is tokenized whole with each question; None for a document not tokenized lately."""
        key, _ = self._document_key(state)  # an object's prefix text rendered outside the lock, as in `tokenize`
        cut = self.documents.get(key)
        return None if cut is None else cut.tail is not None

    def caches(self) -> list[BoundedCache]:
        """The caches this layout keeps across requests (for their sizes on /metrics)."""
        return [self.documents, self.cutter.tails, self.suffix_texts]
