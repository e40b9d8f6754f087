"""The decider: state + typed questions in, typed answers out. The one object callers hold.

    decider = Decider.load()                      # embedded default model, CPU
    response = decider.decide("I was charged twice.", {"billing": NoulQuestion("Is this about billing?")})
    response.to_wire()                            # the /v1/systemone response body

Public API: `load`, `decide`, `respond` (wire body in, wire body out), `read` (the raw label masses of every
read, from one forward) and `answer` (one question's answer from its reads under a calibration method), which
evaluation and calibration fitting use; `stats`; `name`, `fingerprint`, `features`.

Request path (each step names the module that does it):
1. every read of every question: the question itself, and for choice/score with `order_reads` k > 1
   k rotations of its option order (more suffixes, same pass); labels verified at load   (reads, text.labels)
2. prompt text → shared prefix ids + one suffix per read                               (text.prompt)
3. limits, checked on token counts before any model work                               (here)
4. the state's new tokens over the longest cached prefix (system prompt, earlier documents), and
5. every suffix and label tree packed after them, in ONE forward; read the label mass   (runtime.engine)
6. for contextual calibration, the same reads over a content-free document, whose prefix is cached at
   load (their masses are remembered per suffix, so repeated questions cost nothing)   (here)
7. calibrate each read, average the reads; the question type builds its answer         (calibration, core)

Steps 1-3 are `prepare` (no model: a server runs it on another thread while the model works), 4-5 `forward`, which
takes several prepared requests at once (one forward for all of them where the engine has static shapes:
`prepare_request` / `decide_prepared`), and 6-7 `finish` and `answer`. `launch` / `launch_prepared` return as
soon as the forward is queued, with the function that waits for it and finishes: on a GPU a server launches
the next batch's forward before it builds this one's answers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from typedlm.calibrate.calibration import DEFAULT_CALIBRATION, CalibrationFile, shipped_calibration
from typedlm.calibrate.calibrators import Calibrator, ContextualCalibrator, FittedCalibrator, RawCalibrator
from typedlm.calibrate.feedback import POLL_S, Feedback, FeedbackCalibrator, feedback_needed
from typedlm.calibrate.learning import Learner
from typedlm.calibrate.reads import CHOICE_ANSWERS, Reading, Reads, read_count, rotations, unrotate
from typedlm.core.answers import Answer, Response, Usage
from typedlm.core.bounded import BoundedCache, process_memory
from typedlm.core.errors import InvalidRequest, LimitExceeded
from typedlm.core.options import EngineOptions
from typedlm.core.questions import (
    CALIBRATION_METHODS,
    MAX_CHARS_PER_TOKEN,
    MAX_LEVELS,
    MAX_OPTIONS,
    MAX_ORDER_READS,
    ChoiceQuestion,
    FeedbackRequest,
    NoulQuestion,
    Question,
    ScoreQuestion,
    Text,
    parse_feedback,
    parse_request,
)
from typedlm.runtime.budget import default_forward_bytes
from typedlm.runtime.engine import Engine
from typedlm.runtime.features import Features
from typedlm.runtime.interface import EngineLike
from typedlm.runtime.models import LoadedModel, load_model, model_fingerprint
from typedlm.runtime.packing import BATCH_LAYOUTS, ITEM_LAYOUTS, PackedItem
from typedlm.runtime.prefix_cache import PrefixCache
from typedlm.store.feedback import FeedbackStore
from typedlm.text.labels import Labeler
from typedlm.text.prompt import PROMPT_VERSION, ChatLayout, TokenizedPrompt, render_text, wording


@dataclass(frozen=True)
class Prepared:
    """A request's reads made ready for the model (`Decider.prepare`): its questions, every read (question id,
    the version read, its option order), the prompt's token ids and each read's packed item."""

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
    """A whole request made ready: its reads, calibration method and number of order reads."""

    reads: Prepared
    method: str
    order_reads: int
    keep_reading: bool = False  # its response keeps what the model read (`Response.reading`): a feedback post

    @property
    def tokens(self) -> int:
        return self.reads.tokens


BATCH_REQUESTS = 64  # requests one static forward answers at most (the server's token budget bounds it too)

CONTENT_FREE_STATE = "N/A"  # the document contextual calibration reads the label prior from
READ_TOKENS_MARGIN = 2  # tokens a read's suffix may lose where its text merges with the text around it
DEFAULT_PREFIX_CACHE_BYTES = 1 << 30


class Decider:
    """A loaded model ready to answer typed questions about documents."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        engine: EngineOptions | None = None,
        max_input_tokens: int | None = None,
        max_forward_bytes: int | None = None,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
        calibration: str | None = None,
        calibration_file: CalibrationFile | str | Path | None = None,
        order_reads: int | None = None,
        choice_answers: str | None = None,
        prompt_version: str | None = None,
        feedback_db: str | Path | None = None,
        feedback_poll_s: float = POLL_S,
    ):
        """Prepare a loaded model, read by the engine it names (`LoadedModel.engine_class`: the real
        `runtime.engine.Engine` unless it is the fake of `runtime.fake`). `engine`: the feature switches (see
        `typedlm.core.options`);
        `max_input_tokens`: tokens per request (None: as many as `max_forward_bytes` admits; each question with
        the document within the model's context either way); `max_forward_bytes`: the memory one request's forward
        may take, estimated before it runs (`runtime.budget`; None: 1 GiB on a CPU, a quarter of a GPU's memory);
        `prefix_cache_bytes`: memory for
        documents kept across requests (0: only the system prompt); `calibration`: the default method (see
        `calibrate.calibration`; None: fitted where there is a file, else contextual); `calibration_file`: a file
        fitted by `typedlm calibrate` for this model (or its path; None: the file shipped for a named model, if one
        is and it matches these weights); `order_reads`: the default number of option orders read per choice/score
        question (None: what the calibration file was fitted with, else 1); `choice_answers`: how choice options are
        answered, one of `reads.CHOICE_ANSWERS` (None: what the calibration file was fitted with, else letters);
        `prompt_version`: the prompt's wording, one of `text.prompt.WORDINGS` (None: the version the calibration file,
        given or shipped for this model, was fitted with, else `PROMPT_VERSION`); `feedback_db`: the feedback database
        (`typedlm.store.feedback`) whose gold answers calibrate this model's answers ("default": this model's file in
        the cache folder; None or "none": none kept, no feedback calibration); `feedback_poll_s`: how often it is
        read for labels other processes stored."""
        if isinstance(calibration_file, (str, Path)):
            calibration_file = CalibrationFile.load(calibration_file)
        self.name = loaded.name
        self.fingerprint = model_fingerprint(loaded.model)
        self.tokenizer = loaded.tokenizer
        self.engine: EngineLike = (loaded.engine_class or Engine)(loaded.model, engine)  # `fake.FakeEngine` in tests
        shipped = shipped_calibration(self.name) if calibration_file is None else None
        if shipped is not None and shipped.fingerprint != self.fingerprint:
            shipped = None  # shipped for other weights of the same name: its numbers mean nothing here
        if prompt_version is None:
            known = calibration_file or shipped
            prompt_version = known.prompt_version if known is not None else PROMPT_VERSION
        wording(prompt_version)  # an unknown version fails here, before any forward
        self.prompt_version = prompt_version
        self.layout = ChatLayout(loaded.tokenizer, prompt_version)
        self.labeler = Labeler(loaded.tokenizer, self.layout.answer_opening)
        self.labeler.verify(MAX_OPTIONS, MAX_LEVELS)
        self.max_input_tokens = max_input_tokens
        if max_forward_bytes is not None and max_forward_bytes <= 0:
            raise InvalidRequest("the memory a request's forward may take must be positive")
        self.max_forward_bytes = max_forward_bytes or default_forward_bytes(self.engine.device)
        budget_tokens = self.engine.budget.tokens(self.max_forward_bytes)
        self.max_request_tokens = min(max_input_tokens or budget_tokens, budget_tokens)  # no request takes more
        # The system prompt's keys/values, computed once and pinned in the prefix cache beside the documents
        # it keeps across requests (with 0 bytes only the system prompt is reused).
        cache, length = self.engine.prefill(self.layout.system_ids)
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.prefix_cache.pin(self.layout.system_ids, self.engine.snapshot(cache, length))
        # Calibration: the request's method or this default; a fitted file must match this model and prompt. A
        # file shipped for a named model is used only for the weights it was fitted on.
        if calibration_file is not None:
            self.check_calibration(calibration_file)
        elif shipped is not None and shipped.prompt_version == prompt_version:
            calibration_file = shipped
        self.calibration_file = calibration_file
        if order_reads is None:
            order_reads = int(calibration_file.data.get("order_reads", 1)) if calibration_file is not None else 1
        if not 1 <= order_reads <= MAX_ORDER_READS:
            raise InvalidRequest(f"order reads must be from 1 to {MAX_ORDER_READS}")
        self.order_reads = order_reads
        if choice_answers is None:
            choice_answers = calibration_file.data.get("choice_answers", "letters") if calibration_file else "letters"
        if choice_answers not in CHOICE_ANSWERS:
            raise InvalidRequest(f"choice answers must be one of {', '.join(CHOICE_ANSWERS)}")
        self.choice_answers = choice_answers
        # One calibrator per method (`typedlm.calibrate.calibrators`), resolved here once; the default is fitted where
        # there is a file, else contextual.
        normalised = choice_answers == "names_per_token"
        self.contextual = ContextualCalibrator(self._content_free, normalised)  # it holds the priors
        self.calibrators: dict[str, Calibrator] = {"raw": RawCalibrator(normalised), "contextual": self.contextual}
        if calibration_file is not None:
            self.calibrators["fitted"] = FittedCalibrator(calibration_file, prompt_version, normalised)
        default = "fitted" if calibration_file is not None else DEFAULT_CALIBRATION
        # Feedback: the default (or the method asked for) with what users' gold answers taught on top; the
        # default wherever a feedback database is open, unless another method is asked for.
        self.feedback: Feedback | None = None
        if feedback_db == "default":
            feedback_db = FeedbackStore.default_path(self.fingerprint)  # one file per model, in the cache folder
        if feedback_db not in (None, "none"):
            base = self.calibrator(default if calibration in (None, "feedback") else calibration, "--calibration")
            learner = FeedbackCalibrator(base, Learner(), prompt_version)
            self.calibrators["feedback"] = learner
            store = FeedbackStore(feedback_db)
            self.feedback = Feedback(
                store,
                learner,
                model=self.name,
                fingerprint=self.fingerprint,
                reading=choice_answers,
                poll_s=feedback_poll_s,
            )
            default = "feedback"
        self._default = default  # what "feedback" answers with where no feedback database is open
        self.calibration = self.calibrator(calibration or default, "--calibration").method
        # The content-free document's prefix, prefilled once and pinned (contextual calibration).
        free = self.layout.tokenize(CONTENT_FREE_STATE, [NoulQuestion()]).prefix_ids
        cache, length = self.engine.prefill(free)
        self.prefix_cache.pin(free, self.engine.snapshot(cache, length))
        # The fewest tokens one read of any question takes (its suffix, a one-character question with the fewest
        # options), less a margin for merges at its edges: what the number of reads is checked against.
        shortest = [NoulQuestion("?"), ChoiceQuestion((("a", None), ("b", None)), "?"), ScoreQuestion(("a", "b"), "?")]
        suffixes = self.layout.tokenize(CONTENT_FREE_STATE, shortest).suffix_ids
        self.min_read_tokens = max(1, min(map(len, suffixes)) - READ_TOKENS_MARGIN)
        if self.feedback is not None:
            self.feedback.start()  # what is stored is learned now; then polled for other processes' posts

    @classmethod
    def load(cls, model: str | None = None, device: str = "cpu", dtype: str | None = None, **options: Any) -> Decider:
        """Load a model (None: the embedded default; see `typedlm.runtime.models.load_model`) and prepare it;
        `options` are `Decider`'s own (engine, max_input_tokens, prefix_cache_bytes, calibration, ...).
        A calibration file given by path is read before the model loads, so a bad file fails fast."""
        if isinstance(options.get("calibration_file"), (str, Path)):
            options["calibration_file"] = CalibrationFile.load(options["calibration_file"])
        return cls(load_model(model, device, dtype), **options)

    def describe(self) -> dict[str, str]:
        """The served model in a few strings (the start-up log, the metrics' model info)."""
        param = next(self.engine.model.parameters())
        return {
            "model": self.name,
            "fingerprint": self.fingerprint,
            "device": str(param.device),
            "dtype": str(param.dtype).removeprefix("torch."),
            "context": str(self.engine.max_positions or "unknown"),
            "calibration": self.calibration,
            "order_reads": str(self.order_reads),
            "choice_answers": self.choice_answers,
            "prompt_version": self.prompt_version,
            "max_request_tokens": str(self.max_request_tokens),
            "max_reads": str(self.max_reads),
            "max_forward_mb": str(self.max_forward_bytes >> 20),
            "feedback_db": str(self.feedback.store.path) if self.feedback is not None else "none",
        }

    @property
    def max_reads(self) -> int:
        """The most reads (questions, every order read) a request may ask for: each takes `min_read_tokens`."""
        return self.max_request_tokens // self.min_read_tokens

    @property
    def max_batch(self) -> int:
        """Requests worth answering in one forward: many where the engine runs several documents in one (static
        shapes), else one (one forward per document either way: batching would only make requests wait)."""
        return BATCH_REQUESTS if self.engine.features.static else 1

    @property
    def features(self) -> Features:
        """What the engine runs with on this model and device (CUDA graphs, kernels, attention)."""
        return self.engine.features

    def check_calibration(self, file: CalibrationFile) -> None:
        """Raise `ModelError` unless `file` was fitted for this model and prompt."""
        file.check(self.fingerprint, self.prompt_version)

    def calibrator(self, method: str, where: str = "x_calibration") -> Calibrator:
        """The calibrator of `method` (see `typedlm.calibrate.calibrators`).

        Raises:
            InvalidRequest: no such method, or fitted calibration without a calibration file; `where` names the
                option or field that asked for it.
        """
        if method not in CALIBRATION_METHODS:
            raise InvalidRequest(f"{where} must be one of {', '.join(CALIBRATION_METHODS)}", (where,))
        if method == "feedback" and method not in self.calibrators:  # no database, no labels: the default's answers
            return self.calibrators[getattr(self, "calibration", None) or self._default]
        if method not in self.calibrators:
            raise InvalidRequest(
                "fitted calibration needs a calibration file for this model (typedlm calibrate, then "
                "typedlm serve --calibration-file FILE)",
                (where,),
            )
        return self.calibrators[method]

    def _check_size(self, state: Text, questions: Mapping[str, Question], order_reads: int) -> None:
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

    def prepare(self, state: Text, questions: Mapping[str, Question], order_reads: int = 1) -> Prepared:
        """Steps 1-3, everything before the model: every read's question version, labels and token ids, and the
        limits checked. Safe to run on another thread than the forwards (tokenizing overlaps them).

        Raises:
            LimitExceeded: the prompt is longer than the model or the configuration allows.
        """
        qids = list(questions)
        self._check_size(state, questions, order_reads)  # before anything of the request is tokenized or kept
        # 1-2. every read's question version, labels and token ids, all before any model work
        versions = {q: rotations(self._as_read(questions[q]), order_reads) for q in qids}
        flat = [(q, version, order) for q in qids for version, order in versions[q]]
        prompt = self.layout.tokenize(state, [version for _, version, _ in flat])
        items = [
            PackedItem(ids, self.labeler.for_question(version)) for (_, version, _), ids in zip(flat, prompt.suffix_ids)
        ]
        # 3. limits
        self._check_limits(len(prompt.prefix_ids), items, [q for q, _, _ in flat])
        return Prepared(dict(questions), flat, prompt, items)

    def forward(self, prepared: Sequence[Prepared]) -> list[tuple[list[list[float]], int]]:
        """Steps 4-5 for several prepared requests in ONE forward: each document's new tokens over the longest
        cached prefix of it, every request's reads packed after its document. Requests on the same document share
        it (their questions join one document's; no question sees another). Returns each request's masses per read
        and its tokens served from the prefix cache."""
        return self.launch(prepared)()

    def launch(self, prepared: Sequence[Prepared]) -> Callable[[], list[tuple[list[list[float]], int]]]:
        """`forward`, returned as soon as its forward is queued (`EngineLike.launch_many`; on a GPU the host is then
        free), its documents' new prefixes already in the prefix cache: the function returned waits for the
        forward and gives `forward`'s results."""
        groups: dict[bytes, list[int]] = {}  # a document's prefix ids → the requests on it
        for i, request in enumerate(prepared):
            groups.setdefault(request.prompt.prefix_array.tobytes(), []).append(i)
        documents, bases = [], []
        for members in groups.values():
            prompt = prepared[members[0]].prompt
            base = self.prefix_cache.lookup(prompt.prefix_ids)
            shared = base.length if base else 0
            documents.append((prompt.prefix_array[shared:], [it for i in members for it in prepared[i].items], base))
            bases.append(shared)
        keep = self.prefix_cache.max_bytes > 0  # a prefix that will not be cached need not be copied
        in_flight = self.engine.launch_many(documents, keep_prefix=keep)
        for members, shared, prefix in zip(groups.values(), bases, in_flight.prefixes):
            if prefix is not None and prefix.length > shared:
                self.prefix_cache.insert(prepared[members[0]].prompt.prefix_ids, prefix)

        def wait() -> list[tuple[list[list[float]], int]]:
            results: list[tuple[list[list[float]], int]] = [([], 0)] * len(prepared)
            for members, shared, masses in zip(groups.values(), bases, in_flight.wait()):
                start = 0
                for i in members:
                    n = len(prepared[i].items)
                    results[i] = (masses[start : start + n], shared)
                    start += n
            return results

        return wait

    def finish(self, prepared: Prepared, masses: list[list[float]], cached: int, contextual: bool) -> Reading:
        """Step 6 and the reads: each read's masses (and, with `contextual`, its content-free priors) back in its
        question's own option order."""
        flat, items = prepared.flat, prepared.items
        # 6. the content-free priors of the same reads
        priors = self._priors([version for _, version, _ in flat]) if contextual else None
        reads: dict[str, Reads] = {}
        for i, (q, version, order) in enumerate(flat):
            lengths = (
                [len(forms[0]) for forms in items[i].labels.groups] if getattr(version, "by_name", False) else None
            )
            entry = reads.setdefault(
                q, Reads(prepared.questions[q].kind, [], [] if priors else None, lengths and unrotate(lengths, order))
            )
            entry.masses.append(unrotate(masses[i], order))
            if priors:
                entry.priors.append(unrotate(priors[i], order))
        return Reading(reads, prepared.tokens, cached)

    def read(
        self, state: Text, questions: Mapping[str, Question], order_reads: int = 1, contextual: bool = False
    ) -> Reading:
        """The raw label masses of every read of every question, from one packed forward pass; with
        `contextual`, each read's masses on the content-free document too (its `priors`).

        Returns the reads keyed like `questions` and the number of tokens run through the model.
        Raises:
            LimitExceeded: the prompt is longer than the model or the configuration allows.
        """
        prepared = self.prepare(state, questions, order_reads)
        ((masses, cached),) = self.forward([prepared])
        return self.finish(prepared, masses, cached, contextual)

    def _as_read(self, question: Question) -> Question:
        """The question as this decider reads it: a choice by its options' names where `choice_answers` says so
        and the names can be read (`Labeler.can_name`), else as it is (by letter)."""
        if self.choice_answers == "letters" or question.kind != "choice":
            return question
        return (
            replace(question, by_name=True)
            if self.labeler.can_name(tuple(n for n, _ in question.options))
            else question
        )

    def _priors(self, versions: list[Question]) -> list[list[float]]:
        """The content-free priors of each read's question version, from the contextual calibrator's cache."""
        return self.contextual.priors(versions, [self.layout.suffix_text(version) for version in versions])

    def _content_free(self, versions: list[Question]) -> list[list[float]]:
        """Masses of each question version on the content-free document, from one forward over its pinned
        prefix (what the contextual calibrator reads its missing priors with)."""
        prompt = self.layout.tokenize(CONTENT_FREE_STATE, versions)
        base = self.prefix_cache.lookup(prompt.prefix_ids)
        labels = map(self.labeler.for_question, versions)
        items = [PackedItem(ids, label_set) for ids, label_set in zip(prompt.suffix_ids, labels)]
        masses, _ = self.engine.run(prompt.prefix_ids[base.length :], items, base, keep_prefix=False)
        return masses

    def answer(self, question: Question, reads: Reads, method: str, fitted: CalibrationFile | None = None) -> Answer:
        """One question's answer from its reads under `method`'s calibrator (`calibrator`).

        `fitted` stands in for the decider's calibration file under the fitted method.
        """
        if method == "fitted" and fitted is not None:
            return FittedCalibrator(fitted, self.prompt_version, self.choice_answers == "names_per_token").answer(
                question, reads
            )
        return self.calibrator(method).answer(question, reads)

    def decide(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None = None,
        order_reads: int | None = None,
    ) -> Response:
        """Answer every question about `state` from one packed forward pass.

        `calibration` and `order_reads` override the decider's defaults for this request.
        Returns:
            A `Response` whose answers are keyed like `questions`.
        Raises:
            LimitExceeded: the prompt is longer than the model or the configuration allows.
            InvalidRequest: fitted calibration without a calibration file.
        """
        return self.decide_prepared([self.prepare_request(state, questions, calibration, order_reads)])[0]

    def prepare_request(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: str | None = None,
        order_reads: int | None = None,
        keep_reading: bool = False,
    ) -> PreparedRequest:
        """A request made ready for the model (see `prepare`): every check that can refuse it is done here, so a
        batch of prepared requests fails only for reasons of the model's own. Raises as `decide` does.
        `keep_reading`: its response keeps the reads (`Response.reading`), as a feedback post needs."""
        method = self.calibrator(calibration).method if calibration else self.calibration
        k = order_reads or self.order_reads
        return PreparedRequest(self.prepare(state, questions, k), method, k, keep_reading)

    def decide_prepared(self, requests: Sequence[PreparedRequest]) -> list[Response]:
        """Answer several prepared requests from ONE forward (see `forward`): each as `decide` would alone."""
        return self.launch_prepared(requests)()

    def launch_prepared(self, requests: Sequence[PreparedRequest]) -> Callable[[], list[Response]]:
        """`decide_prepared` with its forward queued (see `launch`): the function returned waits for it and
        builds the responses. A server launches the next batch's forward before it finishes this one's answers,
        so the GPU need not wait for the host between forwards."""
        wait = self.launch([request.reads for request in requests])
        return lambda: self._responses(requests, wait())

    def _responses(
        self, requests: Sequence[PreparedRequest], forwarded: list[tuple[list[list[float]], int]]
    ) -> list[Response]:
        responses = []
        for request, (masses, cached) in zip(requests, forwarded):
            method, questions = request.method, request.reads.questions
            reading = self.finish(request.reads, masses, cached, contextual=self.needs_prior(method))
            answers = {q: self.answer(questions[q], reading.reads[q], method) for q in questions}
            if method == "feedback" and not any("feedback" in answer.extras for answer in answers.values()):
                method = self.calibrators["feedback"].base.method  # nothing learned was used: the base's answers
            extras: dict[str, Any] = {"calibration": method}
            if request.order_reads > 1:
                extras["order_reads"] = request.order_reads
            usage = Usage(reading.input_tokens, cached_tokens=reading.cached_tokens)
            kept = reading if request.keep_reading else None
            responses.append(Response(self.name, answers, usage, extras, reading=kept))
        return responses

    def record_feedback(self, posted: FeedbackRequest, response: Response) -> dict[str, Any]:
        """A feedback post's labels stored and learned (`Feedback.post`), given the response its request got
        (prepared with `keep_reading`); returns the post's response body: that response (the answers as they were
        before), and per labeled question the calibration now in force for it (`x_feedback`).

        Raises:
            InvalidRequest: no feedback database is open.
            StoreError: the database cannot be written.
        """
        if self.feedback is None:
            raise feedback_needed()
        questions = posted.request.questions
        stored, in_force = self.feedback.post(questions, response.reading.reads, posted.gold, posted.feedback_id)
        return {**response.to_wire(), "x_feedback": in_force, "x_feedback_stored": stored}

    def feedback_report(self) -> dict[str, Any]:
        """The feedback database's report (`Feedback.report`). Raises `InvalidRequest` where none is open."""
        if self.feedback is None:
            raise feedback_needed()
        return self.feedback.report()

    def respond_feedback(self, body: Any) -> dict[str, Any]:
        """A whole `/v1/systemone/feedback` body → its response body (see `record_feedback`)."""
        posted = parse_feedback(body)
        if self.feedback is None:
            raise feedback_needed()
        request = posted.request
        prepared = self.prepare_request(
            request.state, request.questions, request.calibration, request.order_reads, keep_reading=True
        )
        return self.record_feedback(posted, self.decide_prepared([prepared])[0])

    def close(self) -> None:
        """Stop learning from the feedback database and close it (the model stays usable, without feedback)."""
        if self.feedback is not None:
            self.feedback.close()

    def needs_prior(self, method: str) -> bool:
        """Whether `method` reads the content-free priors."""
        return method in self.calibrators and self.calibrators[method].needs_prior

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: the prefix cache's hits, misses, entries and bytes; every other cache kept
        across requests (`caches`: name -> its entries, bytes, budget, hits, misses, evictions); this process's
        resident memory; on a GPU the CUDA graphs' captures and how many are held; with a feedback database, the labels
        learned from it."""
        return {
            "prefix_cache": self.prefix_cache.stats(),
            "caches": {cache.name: cache.stats() for cache in self.caches()},
            "process": process_memory(),
            **self.engine.stats(),
            **({"feedback": self.feedback.stats()} if self.feedback is not None else {}),
        }

    def caches(self) -> list[BoundedCache]:
        """The caches of host data kept across requests, each bounded in bytes (the prefix cache aside; the packed
        layouts' are shared by every decider of this process)."""
        return [*self.layout.caches(), self.labeler.named, self.contextual.cache, ITEM_LAYOUTS, BATCH_LAYOUTS]

    def respond(self, body: Any) -> dict[str, Any]:
        """A whole `/v1/systemone` request body → the response body."""
        request = parse_request(body)
        return self.decide(request.state, request.questions, request.calibration, request.order_reads).to_wire()
