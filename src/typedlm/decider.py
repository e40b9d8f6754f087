"""The decider: state + typed questions in, typed answers out. The one object callers hold.

    decider = Decider.load()                      # embedded default model, CPU
    response = decider.decide("I was charged twice.", {"billing": NoulQuestion("Is this about billing?")})
    response.to_wire()                            # the /v1/systemone response body

Request path (each step names the module that does it):
1. labels for every question, verified against the tokenizer at load      (labels)
2. prompt text → shared prefix ids + one suffix per question               (prompt)
3. limits, checked on token counts before any model work                   (here)
4. the state's new tokens over the longest cached prefix (system prompt, earlier documents), and
5. every suffix and label tree packed after them, in ONE forward; read the label mass (engine, packing)
6. normalise, confidence, wire shape                                       (confidence, answers)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from typedlm.answers import Answer, ChoiceAnswer, NoulAnswer, Response, ScoreAnswer, Usage
from typedlm.confidence import choice_confidence, normalise, score_confidence
from typedlm.engine import Engine
from typedlm.errors import LimitExceeded
from typedlm.labels import Labeler, LabelSet
from typedlm.models import LoadedModel, load_model
from typedlm.packing import PackedItem
from typedlm.prefix_cache import PrefixCache
from typedlm.prompt import ChatLayout
from typedlm.questions import (
    MAX_LEVELS,
    MAX_OPTIONS,
    ChoiceQuestion,
    NoulQuestion,
    Question,
    ScoreQuestion,
    Text,
    parse_questions,
    parse_request,
    parse_state,
)

DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


class Decider:
    """A loaded model ready to answer typed questions about documents."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_input_tokens: int | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        cuda_graphs: bool | None = None,
    ):
        self.name = loaded.name
        self.tokenizer = loaded.tokenizer
        self.engine = Engine(loaded.model, static=cuda_graphs)
        self.layout = ChatLayout(loaded.tokenizer)
        self.labeler = Labeler(loaded.tokenizer, self.layout.answer_opening)
        self.labeler.verify(MAX_OPTIONS, MAX_LEVELS)
        self.max_input_tokens = max_input_tokens
        # The system prompt's keys/values, computed once and pinned in the prefix cache beside the documents
        # it keeps across requests (with 0 bytes only the system prompt is reused).
        cache, length = self.engine.prefill(self.layout.system_ids)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.prefix_cache.pin(self.layout.system_ids, Engine.snapshot(cache, length))

    @classmethod
    def load(
        cls,
        model: str | None = None,
        device: str = "cpu",
        dtype: str | None = None,
        max_input_tokens: int | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        cuda_graphs: bool | None = None,
    ) -> Decider:
        """Load a model (None: the embedded default) and prepare it; see `typedlm.models.load_model`.

        `cuda_graphs` (default: on with CUDA) replays each request's forward as a CUDA graph (see `graphs`).
        """
        return cls(load_model(model, device, dtype), max_input_tokens, prefix_cache_bytes, cuda_graphs)

    def labels_for(self, question: Question) -> LabelSet:
        if isinstance(question, NoulQuestion):
            return self.labeler.noul()
        if isinstance(question, ChoiceQuestion):
            return self.labeler.choice(len(question.options))
        return self.labeler.score(len(question.levels))

    def _check_limits(self, prefix_len: int, items: list[PackedItem], qids: list[str]) -> None:
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
        total = prefix_len + sum(len(item.suffix_ids) + len(item.labels.inner_nodes) for item in items)
        if self.max_input_tokens and total > self.max_input_tokens:
            raise LimitExceeded(
                f"the request takes {total} tokens; this server reads at most {self.max_input_tokens} per request: "
                "shorten the state or send fewer questions"
            )

    def decide(self, state: Text, questions: Mapping[str, Question]) -> Response:
        """Answer every question about `state` from one packed forward pass.

        Returns:
            A `Response` whose answers are keyed like `questions`.
        Raises:
            LimitExceeded: the prompt is longer than the model or the configuration allows.
        """
        qids = list(questions)
        # 1-2. labels and token ids, all before any model work
        prompt = self.layout.tokenize(state, [questions[q] for q in qids])
        items = [PackedItem(ids, self.labels_for(questions[q])) for q, ids in zip(qids, prompt.suffix_ids)]
        # 3. limits
        self._check_limits(len(prompt.prefix_ids), items, qids)
        # 4. prefill the state on top of the longest cached prefix (at least the system prompt, usually)
        # 5. and every question packed after it, in one forward (two for sliding-window models)
        base = self.prefix_cache.lookup(prompt.prefix_ids)
        shared = base.length if base else 0
        keep = self.prefix_cache.max_bytes > 0  # a prefix that will not be cached need not be copied
        masses, prefix = self.engine.run(prompt.prefix_ids[shared:], items, base, keep_prefix=keep)
        prefix_len = prefix.length
        if prefix_len > shared:
            self.prefix_cache.insert(prompt.prefix_ids, prefix)
        # 6. answers
        answers = {q: self._answer(questions[q], m) for q, m in zip(qids, masses)}
        processed = (prefix_len - shared) + sum(len(i.suffix_ids) + len(i.labels.inner_nodes) for i in items)
        return Response(self.name, answers, Usage(processed))

    @staticmethod
    def _answer(question: Question, masses: list[float]) -> Answer:
        probs, raw_mass = normalise(masses)
        if isinstance(question, NoulQuestion):
            return NoulAnswer(probs[0], raw_mass)
        if isinstance(question, ChoiceQuestion):
            by_name = {name: p for (name, _), p in zip(question.options, probs)}
            return ChoiceAnswer(by_name, choice_confidence(probs), raw_mass)
        assert isinstance(question, ScoreQuestion)
        return ScoreAnswer(tuple(probs), question.levels, score_confidence(probs), raw_mass)

    def stats(self) -> dict[str, dict[str, int]]:
        """Counters for monitoring: the prefix cache's hits, misses, entries and bytes."""
        return {"prefix_cache": self.prefix_cache.stats()}

    def decide_wire(self, state: Any, questions: Any) -> Response:
        """Like `decide`, from JSON values: validates them first (raises `InvalidRequest`)."""
        return self.decide(parse_state(state), parse_questions(questions))

    def respond(self, body: Any) -> dict[str, Any]:
        """A whole `/v1/systemone` request body → the response body."""
        request = parse_request(body)
        return self.decide(request.state, request.questions).to_wire()
