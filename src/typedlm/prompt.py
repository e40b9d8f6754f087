"""Prompt rendering and the prefix/suffix token split. Text in, token ids out; no model.

Layout, rendered with the model's own chat template (thinking off for Qwen3-style templates):

    [system turn: SYSTEM_PROMPT] [user turn: <document>\\n{state}\\n</document>   ← prefix, shared
                                  \\n\\n{question block}] [assistant turn opening]  ← suffix, one per question

The template is rendered once with sentinels in place of the state and the question, and cut there,
so any template works. Token boundaries are the trap: BPE may merge characters across the cut (Qwen's
pre-tokenizer glues ">" to the newlines after it). So the split is made on token ids, not text:
every question's prefix+suffix text is tokenized whole, and the shared prefix is the longest common
prefix of those id lists and of the prefix alone. Feeding prefix + suffix is then, by construction,
exactly the ids of the whole prompt.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from typedlm.errors import ModelError
from typedlm.labels import choice_labels, score_labels
from typedlm.questions import ChoiceQuestion, NoulQuestion, Question, ScoreQuestion, Text

PROMPT_VERSION = "1"
SYSTEM_PROMPT = (
    "You read a document and answer one question about it. "
    "Reply with the answer's label only: yes or no, an option's label, or a level number."
)
DOCUMENT_OPEN = "<document>\n"
DOCUMENT_CLOSE = "\n</document>"
QUESTION_LEAD = "\n\n"
TAIL_TOKENS = 48  # prefix tokens re-tokenized with each suffix (the rest is tokenized once)
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


def question_block(question: Question) -> str:
    """The question as the model reads it: text, options or levels, and the answer format."""
    if isinstance(question, NoulQuestion):
        lines = [f"Question: {render_text(question.instructions) or 'Is this true of the document?'}"]
        if question.true is not None:
            lines.append(f"Answer yes if: {render_text(question.true)}")
        if question.false is not None:
            lines.append(f"Answer no if: {render_text(question.false)}")
        lines.append("Answer yes or no.")
    elif isinstance(question, ChoiceQuestion):
        labels = choice_labels(len(question.options))
        lines = [f"Question: {render_text(question.instructions) or 'Which option fits the document best?'}"]
        lines.append("Options:")
        lines += [f"{label}) {_described(name, desc)}" for label, (name, desc) in zip(labels, question.options)]
        lines.append("Answer with the label of the best option.")
    else:
        assert isinstance(question, ScoreQuestion), f"unknown question {question!r}"
        lines = [f"Question: {render_text(question.instructions) or 'Rate the document on this scale.'}"]
        lines.append("Levels:")
        lines += [f"{i}: {render_text(level)}" for i, level in zip(score_labels(len(question.levels)), question.levels)]
        lines.append("Answer with the level number.")
    return "\n".join(lines)


def common_prefix_length(first: Sequence[int], *others: Sequence[int]) -> int:
    """How many leading token ids `first` shares with every one of `others`."""
    reference = np.asarray(first, dtype=np.int64)
    n = len(reference)
    for other in others:
        other = np.asarray(other, dtype=np.int64)
        n = min(n, len(other))
        differ = np.flatnonzero(reference[:n] != other[:n])
        if len(differ):
            n = int(differ[0])
    return n


@dataclass(frozen=True)
class TokenizedPrompt:
    """A request's prompt as token ids: one shared prefix, one suffix per question."""

    prefix_ids: list[int]
    suffix_ids: list[list[int]]


class ChatLayout:
    """The chat template cut into its fixed pieces: head, document close, and answer opening."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        messages = [
            {"role": "system", "content": SYSTEM_PROMPT},
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
        self.system_ids = self.encode(head)
        # Strings the tokenizer turns into control tokens (<|im_end|>, <|im_start|>, ...). In user text
        # they would let a document close its own turn and answer for the model, so they are defused.
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        specials = set(getattr(tokenizer, "all_special_tokens", [])) | {t.content for t in added.values() if t.special}
        self._control_strings = sorted((s for s in specials if len(s) > 1), key=len, reverse=True)

    def defuse(self, text: str) -> str:
        """User text with every control-token string broken by a word joiner, so it tokenizes as text."""
        for control in self._control_strings:
            if control in text:
                text = text.replace(control, control[0] + WORD_JOINER + control[1:])
        return text

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def prefix_text(self, state: Text) -> str:
        return f"{self.head}{self.defuse(render_text(state))}{self.document_close}"

    def suffix_text(self, question: Question) -> str:
        return f"{QUESTION_LEAD}{self.defuse(question_block(question))}{self.answer_opening}"

    def tokenize(self, state: Text, questions: Sequence[Question]) -> TokenizedPrompt:
        """Token ids of the shared prefix and of each question's suffix; prefix + suffix == ids of the whole."""
        prefix = self.prefix_text(state)
        suffixes = [self.suffix_text(question) for question in questions]
        whole, alone = self._tokenize_whole(prefix, suffixes)
        n = common_prefix_length(alone, *whole)
        prompt = TokenizedPrompt(alone[:n], [ids[n:] for ids in whole])
        for ids, suffix in zip(whole, prompt.suffix_ids):
            assert suffix and prompt.prefix_ids + suffix == ids, "prefix + suffix must be the whole prompt's ids"
        return prompt

    def _tokenize_whole(self, prefix: str, suffixes: list[str]) -> tuple[list[list[int]], list[int]]:
        """The ids of every `prefix + suffix`, and of `prefix` alone, tokenizing the long prefix only twice.

        Tokenizing each whole prompt would cost Q tokenizations of the document. Tokenizers split text into
        short pieces before merging (whitespace, punctuation), so a document cut at a token boundary
        `TAIL_TOKENS` tokens before its end tokenizes the same whatever follows: the head is tokenized once
        and only the tail is tokenized with each suffix. The first question's whole prompt is tokenized in
        full as a check; a tokenizer for which the cut does not hold gets every prompt tokenized whole.
        """
        encoded = self._tokenizer(prefix, add_special_tokens=False, return_offsets_mapping=True)
        alone = list(encoded["input_ids"])
        cut = len(alone) - TAIL_TOKENS
        offsets = encoded.get("offset_mapping")
        if cut > 0 and offsets:
            start = offsets[cut][0]
            tails = self._tokenizer([prefix[start:] + s for s in suffixes], add_special_tokens=False)["input_ids"]
            whole = [alone[:cut] + list(ids) for ids in tails]
            if whole[0] == self.encode(prefix + suffixes[0]):
                return whole, alone
        texts = [prefix + suffix for suffix in suffixes]
        return [list(ids) for ids in self._tokenizer(texts, add_special_tokens=False)["input_ids"]], alone
