"""Preparing a request: everything before the model, on a host thread while the model works on others.

    preparer = Preparer(layout, labeler, engine, choice_answers, max_input_tokens, max_forward_bytes)
    prepared = preparer.prepare(state, questions, order_reads)   # every read's token ids and labels, checked

1. every read of every question: the question itself, and for choice/score with order reads k > 1 k rotations of
   its option order (more suffixes, the same forward); a choice read by its options' names where the decider
   says so and the names can be read                                              (calibrate.reads, text.labels)
2. prompt text → the shared prefix's ids and one suffix per read                  (text.prompt)
3. the limits: a request too large for any tokenization is refused on its reads and characters before any of it
   is tokenized; then on its token counts, the model's context and its forward's memory, before any model work.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from typedlm.calibrate.reads import read_count, rotations
from typedlm.core.errors import LimitExceeded
from typedlm.core.names import CalibrationMethod, ChoiceAnswers, Kind
from typedlm.core.questions import (
    MAX_CHARS_PER_TOKEN,
    ChoiceQuestion,
    Handover,
    NoulQuestion,
    Question,
    ScoreQuestion,
    Text,
)
from typedlm.runtime.budget import default_forward_bytes
from typedlm.runtime.interface import EngineLike
from typedlm.runtime.packing import PackedItem
from typedlm.text.labels import Labeler
from typedlm.text.prompt import ChatLayout, TokenizedPrompt, render_text

CONTENT_FREE_STATE = "N/A"  # the document contextual calibration reads the label prior from
READ_TOKENS_MARGIN = 2  # tokens a read's suffix may lose where its text merges with the text around it


@dataclass(frozen=True)
class Prepared:
    """A request's reads made ready for the model: its questions, every read (question id, the version read, its
    option order), the prompt's token ids and each read's packed item."""

    questions: dict[str, Question]
    flat: list[tuple[str, Question, list[int]]]
    prompt: TokenizedPrompt
    items: list[PackedItem]

    @property
    def tokens(self) -> int:
        """The tokens this request puts through the model when nothing of it is cached."""
        return len(self.prompt.prefix_ids) + sum(item.rows for item in self.items)


@dataclass(frozen=True)
class PreparedRequest:
    """A whole request made ready: its reads, the calibration method it is answered by, its number of order reads
    and whether its response keeps what the model read (`Response.reading`: a feedback post, or `Decider.read`)."""

    reads: Prepared
    method: CalibrationMethod
    order_reads: int
    keep_reading: bool = False
    priors: bool = False  # the reads' content-free priors are read whatever the method needs (`Decider.read`)
    handover: Handover = field(default_factory=Handover)  # each answer's set and abstention, where the request asks
    remember: bool = False  # its answers are held for labels by id, each with its id (`recent`), where one may post

    @property
    def tokens(self) -> int:
        return self.reads.tokens


class Preparer:
    """Steps 1-3 for one decider's model: its prompt layout and labels, the engine's context and memory budget."""

    def __init__(
        self,
        layout: ChatLayout,
        labeler: Labeler,
        engine: EngineLike,
        choice_answers: ChoiceAnswers,
        max_input_tokens: int | None,
        max_forward_bytes: int | None,
    ):
        self.layout, self.labeler, self.engine = layout, labeler, engine
        self.choice_answers = choice_answers
        self.max_input_tokens = max_input_tokens
        self.max_forward_bytes = max_forward_bytes or default_forward_bytes(engine.device)
        budget_tokens = engine.budget.tokens(self.max_forward_bytes)
        self.max_request_tokens = min(max_input_tokens or budget_tokens, budget_tokens)  # no request takes more
        # The fewest tokens one read of any question takes (its suffix, a one-character question with the fewest
        # options), less a margin for merges at its edges: what the number of reads is checked against.
        shortest = [NoulQuestion("?"), ChoiceQuestion((("a", None), ("b", None)), "?"), ScoreQuestion(("a", "b"), "?")]
        suffixes = layout.tokenize(CONTENT_FREE_STATE, shortest).suffix_ids
        self.min_read_tokens = max(1, min(map(len, suffixes)) - READ_TOKENS_MARGIN)
        self.max_reads = self.max_request_tokens // self.min_read_tokens  # reads (questions, order reads) a request

    def prepare(self, state: Text, questions: Mapping[str, Question], order_reads: int = 1) -> Prepared:
        """Steps 1-3 (see the module).

        Raises:
            LimitExceeded: the prompt is longer than the model or the configuration allows.
        """
        qids = list(questions)
        self.check_size(state, questions, order_reads)  # before anything of the request is tokenized or kept
        # 1-2. every read's question version, labels and token ids, all before any model work
        versions = {q: rotations(self.as_read(questions[q]), order_reads) for q in qids}
        flat = [(q, version, order) for q in qids for version, order in versions[q]]
        prompt = self.layout.tokenize(state, [version for _, version, _ in flat])
        items = self.items(prompt, [version for _, version, _ in flat])
        # 3. limits
        self.check_limits(len(prompt.prefix_ids), items, [q for q, _, _ in flat])
        return Prepared(dict(questions), flat, prompt, items)

    def items(self, prompt: TokenizedPrompt, versions: Sequence[Question]) -> list[PackedItem]:
        """Each read's suffix with its question version's labels."""
        return [PackedItem(ids, self.labeler.for_question(v)) for ids, v in zip(prompt.suffix_ids, versions)]

    def content_free(self, versions: list[Question]) -> tuple[list[int], list[PackedItem]]:
        """The prefix ids and packed reads of question versions on the content-free document (contextual
        calibration's priors)."""
        prompt = self.layout.tokenize(CONTENT_FREE_STATE, versions)
        return prompt.prefix_ids, self.items(prompt, versions)

    def as_read(self, question: Question) -> Question:
        """The question as this decider reads it: a choice by its options' names where `choice_answers` says so
        and the names can be read (`Labeler.can_name`), else as it is (by letter)."""
        if self.choice_answers == ChoiceAnswers.LETTERS or question.kind != Kind.CHOICE:
            return question
        return (
            replace(question, by_name=True)
            if self.labeler.can_name(tuple(n for n, _ in question.options))
            else question
        )

    def check_size(self, state: Text, questions: Mapping[str, Question], order_reads: int) -> None:
        """Refuse a request too large for any tokenization to fit the token limits, on its reads and characters,
        before any of it is tokenized, labelled or kept: an 8 MiB state, or 100,000 questions, would otherwise hold
        the model thread for seconds (and gigabytes) only to be refused after."""
        limit = self.max_request_tokens
        reads = sum(read_count(question, order_reads) for question in questions.values())
        if reads > self.max_reads:
            raise LimitExceeded(
                f"the request asks for {reads} reads (questions, every order read); each takes at least "
                f"{self.min_read_tokens} tokens and this server reads at most {limit} tokens per request: send "
                f"at most {self.max_reads} questions"
            )
        limit = min(limit, self.engine.max_positions or limit)
        # a question's every read has the same characters (its options rotated; read by name a few fewer)
        chars = len(render_text(state)) + sum(
            self.layout.suffix_chars(question) * read_count(question, order_reads) for question in questions.values()
        )
        if chars > MAX_CHARS_PER_TOKEN * limit:
            raise LimitExceeded(
                f"the request holds {chars} characters of text (state and questions, every order read); this "
                f"server reads at most {limit} tokens, never more than {MAX_CHARS_PER_TOKEN} characters each: "
                "shorten the state or send fewer questions"
            )

    def check_limits(self, prefix_len: int, items: list[PackedItem], qids: list[str]) -> None:
        """Refuse a tokenized request over the model's context, the token limit or the forward's memory."""
        context = self.engine.max_positions
        if context:
            for qid, item in zip(qids, items):
                need = prefix_len + len(item.suffix_ids) + item.labels.max_depth - 1
                if need > context:
                    raise LimitExceeded(
                        f"the state and this question take {need} tokens; the model reads at most {context}: "
                        "shorten the state or the question",
                        ("questions", qid),
                    )
        total = prefix_len + sum(item.rows for item in items)
        if self.max_input_tokens and total > self.max_input_tokens:
            raise LimitExceeded(
                f"the request takes {total} tokens; this server reads at most {self.max_input_tokens} per request: "
                "shorten the state or send fewer questions"
            )
        need = self.engine.budget.bytes(prefix_len, [item.rows for item in items])
        if need > self.max_forward_bytes:
            raise LimitExceeded(
                f"the request takes {total} tokens, whose forward would hold about {need / 2**20:.0f} MiB; this "
                f"server allows {self.max_forward_bytes / 2**20:.0f} MiB per request (--max-forward-mb): shorten "
                "the state or send fewer questions"
            )
