"""The decider: state + typed questions in, typed answers out. The one object callers hold.

    decider = Decider.load()                      # embedded default model, CPU
    response = decider.decide("I was charged twice.", {"billing": NoulQuestion("Is this about billing?")})
    response.to_wire()                            # the /v1/systemone response body

A request goes through three phases, each a module named after it, conducted here:

1. `prepare`: every read of every question, its token ids and labels, the limits checked; no model, so a server
   runs it on a host thread while the model works (`prepare_request`);
2. `schedule`: documents grouped, each over the longest prefix cached, every request's reads in ONE forward,
   returned as soon as it is queued (`launch_prepared`: on a GPU a server launches the next batch's forward before
   it builds this one's answers);
3. `answer`: the reads back in each question's option order, calibrated by the request's calibrator
   (`typedlm.calibrate`), typed.

`prepare_request` + `launch_prepared` is the one request API: the server's worker, the batch jobs and the tests use
it; `decide`, `respond` and `read` (the raw label masses, for evaluation and fitting) are it for one request.
What a decider is told is one `DeciderConfig`, resolved once for its model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from typedlm.calibrate.feedback import Feedback, feedback_needed
from typedlm.calibrate.methods import Calibrators
from typedlm.calibrate.out_of_fold import OutOfFold
from typedlm.calibrate.projection import Projection
from typedlm.calibrate.reads import Reading
from typedlm.core.answers import Response
from typedlm.core.bounded import BoundedCache, process_memory
from typedlm.core.description import ModelDescription
from typedlm.core.errors import AnswerNotHeld
from typedlm.core.labeling import LabelsById, parse_post
from typedlm.core.names import CalibrationMethod, ChoiceAnswers
from typedlm.core.questions import (
    MAX_LEVELS,
    MAX_OPTIONS,
    FeedbackRequest,
    Handover,
    NoulQuestion,
    Question,
    Text,
    parse_request,
)
from typedlm.decide.answer import respond
from typedlm.decide.by_id import post_by_id
from typedlm.decide.config import DeciderConfig
from typedlm.decide.prepare import CONTENT_FREE_STATE, PreparedRequest, Preparer
from typedlm.decide.recent import RecentAnswers, Suggestions
from typedlm.decide.schedule import Scheduler
from typedlm.runtime.engine import Engine
from typedlm.runtime.interface import EngineLike
from typedlm.runtime.models import LoadedModel, load_model, model_fingerprint
from typedlm.runtime.packing import BATCH_LAYOUTS, ITEM_LAYOUTS
from typedlm.store.feedback import FeedbackStore
from typedlm.text.labels import Labeler
from typedlm.text.prompt import ChatLayout

BATCH_REQUESTS = 64  # requests one static forward answers at most (the server's token budget bounds it too)


class Decider:
    """A loaded model ready to answer typed questions about documents."""

    def __init__(self, loaded: LoadedModel, config: DeciderConfig | None = None, **options: Any):
        """Prepare a loaded model, read by the engine it names (`LoadedModel.engine_class`: the real
        `runtime.engine.Engine` unless it is the fake of `runtime.fake`), as `config` says, or as `options` (the
        fields of `DeciderConfig`, as `DeciderConfig.of` reads them) say."""
        self.name = loaded.name
        self.fingerprint = model_fingerprint(loaded.model)
        self.tokenizer = loaded.tokenizer
        config = (config or DeciderConfig.of(**options)).resolved(self.name, self.fingerprint)
        self.config = config
        self.engine: EngineLike = (loaded.engine_class or Engine)(loaded.model, config.engine)
        self.features = self.engine.features  # what the engine runs with on this model and device
        self.prompt_version = config.prompt_version
        self.calibration_file = config.calibration_file
        self.layout = ChatLayout(loaded.tokenizer, config.prompt_version)
        self.labeler = Labeler(loaded.tokenizer, self.layout.answer_opening)
        self.labeler.verify(MAX_OPTIONS, MAX_LEVELS)
        self.preparer = Preparer(
            self.layout,
            self.labeler,
            self.engine,
            config.choice_answers,
            config.max_input_tokens,
            config.max_forward_bytes,
        )
        # The system prompt's keys/values, computed once and pinned in the prefix cache beside the documents
        # it keeps across requests (with 0 bytes only the system prompt is reused).
        self.scheduler = Scheduler(self.engine, config.prefix_cache_bytes)
        self.scheduler.pin(self.layout.system_ids)
        self.prefix_cache = self.scheduler.prefix_cache
        # One calibrator per method (`typedlm.calibrate.methods`), resolved here once.
        self.calibrators = Calibrators(
            lambda versions: self.scheduler.run_pinned(*self.preparer.content_free(versions)),
            config.calibration_file,
            config.prompt_version,
            config.choice_answers == ChoiceAnswers.NAMES_PER_TOKEN,
            OutOfFold() if config.feedback_db is not None else None,
            config.calibration,
        )
        self.calibration = self.calibrators.default.method
        self.projection = Projection(self.fingerprint)  # reads' features, where a readout may learn from them
        # Feedback: what users' gold answers teach, kept in the database and learned by the feedback calibrator.
        self.feedback: Feedback | None = None
        if self.calibrators.feedback is not None:
            self.feedback = Feedback(
                FeedbackStore(config.feedback_db),
                self.calibrators.feedback,
                model=self.name,
                fingerprint=self.fingerprint,
                reading=config.choice_answers.value,
                poll_s=config.feedback_poll_s,
            )
        # Recent answers, held so that a label may name one by its id, where labels can be posted.
        self.recent: RecentAnswers | None = None
        if self.feedback is not None and config.answer_window_bytes > 0:
            self.recent = RecentAnswers(config.answer_window_bytes, config.answer_window_s, config.answer_origin)
        # The content-free document's prefix, prefilled once and pinned (contextual calibration).
        self.scheduler.pin(self.layout.tokenize(CONTENT_FREE_STATE, [NoulQuestion()]).prefix_ids)
        if self.feedback is not None:
            self.feedback.start()  # what is stored is learned now; then polled for other processes' posts

    @classmethod
    def load(cls, model: str | None = None, device: str = "cpu", dtype: str | None = None, **options: Any) -> Decider:
        """Load a model (None: the embedded default; see `typedlm.runtime.models.load_model`) and prepare it;
        `options` are a `DeciderConfig` (`config`) or its fields. A calibration file given by path is read before
        the model loads, so a bad file fails fast."""
        config = options.pop("config", None) or DeciderConfig.of(**options)
        return cls(load_model(model, device, dtype), config)

    def describe(self) -> ModelDescription:
        """The served model in a few fields (the start-up log, the metrics' model info, the OpenAPI limits)."""
        param = next(self.engine.model.parameters())
        preparer, config = self.preparer, self.config
        return ModelDescription(
            model=self.name,
            fingerprint=self.fingerprint,
            device=str(param.device),
            dtype=str(param.dtype).removeprefix("torch."),
            context=self.engine.max_positions,
            calibration=self.calibration,
            order_reads=config.order_reads,
            choice_answers=config.choice_answers,
            prompt_version=self.prompt_version,
            max_request_tokens=preparer.max_request_tokens,
            max_reads=preparer.max_reads,
            max_forward_mb=preparer.max_forward_bytes >> 20,
            feedback_db=str(self.feedback.store.path) if self.feedback is not None else None,
        )

    @property
    def max_batch(self) -> int:
        """Requests worth answering in one forward: many where the engine runs several documents in one (static
        shapes), else one (one forward per document either way: batching would only make requests wait)."""
        return BATCH_REQUESTS if self.features.static else 1

    def prepare_request(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: CalibrationMethod | str | None = None,
        order_reads: int | None = None,
        keep_reading: bool = False,
        priors: bool = False,
        handover: Handover | None = None,
        remember: bool = False,
    ) -> PreparedRequest:
        """A request made ready for the model (`prepare.Preparer`): every check that can refuse it is done here, so
        a batch of prepared requests fails only for reasons of the model's own. `calibration` and `order_reads`
        override the decider's defaults; `keep_reading`: its response keeps the reads (`Response.reading`), as a
        feedback post needs; `priors`: they include the content-free priors whatever the method needs; `handover`:
        each answer's set and abstention (x_coverage, x_min_accuracy); `remember`: its answers are held for labels
        by their ids and carry them (`x_id`), where a feedback database is open (a server's requests).

        Raises:
            LimitExceeded: the prompt is longer than the model or the configuration allows.
            InvalidRequest: an unknown method, or fitted calibration without a calibration file.
        """
        method = self.calibrators.get(calibration).method
        k = order_reads or self.config.order_reads
        prepared = self.preparer.prepare(state, questions, k)
        return PreparedRequest(prepared, method, k, keep_reading, priors, handover or Handover(), remember)

    def launch_prepared(self, requests: Sequence[PreparedRequest]) -> Callable[[], list[Response]]:
        """Several prepared requests answered from ONE forward (`schedule.Scheduler.launch`), each as alone,
        returned as soon as the forward is queued: the function returned waits for it and builds the responses.
        The reads' features (their decision rows' hidden states, projected) are read where a readout may use them:
        with a feedback database, and for a response that keeps its reading (a feedback post, `read`)."""
        features = self.feedback is not None or any(request.keep_reading for request in requests)
        wait = self.scheduler.launch([request.reads for request in requests], features)
        priors = self.calibrators.contextual.priors

        def content_free(versions: list[Question]) -> list[list[float]]:
            return priors(versions, [self.layout.suffix_text(version) for version in versions])

        def responses() -> list[Response]:
            return [
                self._remembered(
                    request,
                    respond(
                        self.name,
                        request,
                        self.calibrators.get(request.method),
                        masses,
                        cached,
                        content_free,
                        None if rows is None else self.projection(rows),
                    ),
                )
                for request, (masses, cached, rows) in zip(requests, wait())
            ]

        return responses

    def _remembered(self, request: PreparedRequest, response: Response) -> Response:
        """`response` with its answers held and their ids, where the request asks and labels can be posted; its
        reads only where the request keeps them."""
        if request.remember and self.recent is not None:
            keys = self.feedback.calibrator.keys

            def family(question: Question) -> str:
                return keys(question)["family"]

            response = self.recent.remember(response, request.reads.questions, request.method.value, family)
        if response.reading is not None and not request.keep_reading:
            response = replace(response, reading=None)
        return response

    def decide(
        self,
        state: Text,
        questions: Mapping[str, Question],
        calibration: CalibrationMethod | str | None = None,
        order_reads: int | None = None,
        handover: Handover | None = None,
        remember: bool = False,
    ) -> Response:
        """Answer every question about `state` from one packed forward pass (see `prepare_request`).

        Returns:
            A `Response` whose answers are keyed like `questions`.
        """
        prepared = self.prepare_request(
            state, questions, calibration, order_reads, handover=handover, remember=remember
        )
        return self.launch_prepared([prepared])()[0]

    def respond(self, body: Any) -> dict[str, Any]:
        """A whole `/v1/systemone` request body → the response body."""
        r = parse_request(body)
        return self.decide(r.state, r.questions, r.calibration, r.order_reads, r.handover).to_wire()

    def read(
        self, state: Text, questions: Mapping[str, Question], order_reads: int = 1, contextual: bool = False
    ) -> Reading:
        """The raw label masses of every read of every question, from one packed forward pass; with `contextual`,
        each read's masses on the content-free document too (its `priors`). Raises as `prepare_request` does."""
        request = self.prepare_request(
            state, questions, CalibrationMethod.RAW, order_reads, keep_reading=True, priors=contextual
        )
        return self.launch_prepared([request])()[0].reading

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
        stored, in_force = self.feedback.post(
            questions, response.reading.reads, posted.gold, posted.feedback_id, posted.sample
        )
        return {**response.to_wire(), "x_feedback": in_force, "x_feedback_stored": stored}

    def label_by_id(self, posted: LabelsById) -> dict[str, Any]:
        """A post's labels of answers by their ids, stored and learned (`Feedback.post`) from what the window of
        recent answers held of each (no forward), as a post of the state and questions stores them; an answer handed
        out to teach is stored "chosen" (`recent.Held.sample`). Returns the post's response body: per answer id, its
        question id, how its label was stored and the calibration now in force for its question.

        Raises:
            InvalidRequest: no feedback database is open; a gold answer that is not one of its answer's
                (`by_id.gold_indexes`).
            AnswerNotHeld: naming the ids not held (nothing is stored).
            StoreError: the database cannot be written.
        """
        if self.feedback is None:
            raise feedback_needed()
        if self.recent is None:  # --answer-window-mb 0
            raise AnswerNotHeld(posted.answer_ids)
        answers = self.recent.held(posted.answer_ids)
        stored, labels = post_by_id(self.feedback, answers, posted)
        self.recent.labeled(answers)
        return {"model": self.name, "x_labels": labels, "x_feedback_stored": stored}

    def suggest_labels(self, family: str | None, n: int) -> dict[str, Any]:
        """What to label next among the recent answers (`RecentAnswers.suggest`): the body of
        GET /v1/systemone/feedback/suggest. Raises `InvalidRequest` where no feedback database is open."""
        if self.feedback is None:
            raise feedback_needed()
        if self.recent is None:
            return Suggestions(family, 0, 0).to_wire()
        return self.recent.suggest(family, n).to_wire()

    def respond_feedback(self, body: Any) -> dict[str, Any]:
        """A whole `/v1/systemone/feedback` body, in any of its forms (`labeling.parse_post`) → its response body:
        by id where every answer it names is held (`label_by_id`), else its request answered again and its labels
        stored (`record_feedback`)."""
        posted = parse_post(body)
        if self.feedback is None:
            raise feedback_needed()
        if isinstance(posted, LabelsById):
            try:
                return self.label_by_id(posted)
            except AnswerNotHeld:
                if posted.fallback is None:
                    raise
                posted = posted.fallback
        r = posted.request
        prepared = self.prepare_request(
            r.state, r.questions, r.calibration, r.order_reads, keep_reading=True, handover=r.handover
        )
        return self.record_feedback(posted, self.launch_prepared([prepared])()[0])

    def feedback_report(self) -> dict[str, Any]:
        """The feedback database's report (`Feedback.report`). Raises `InvalidRequest` where none is open."""
        if self.feedback is None:
            raise feedback_needed()
        return self.feedback.report()

    def caches(self) -> list[BoundedCache]:
        """The caches of host data kept across requests, each bounded in bytes (the prefix cache aside; the packed
        layouts' are shared by every decider of this process)."""
        return [
            *self.layout.caches(),
            self.labeler.named,
            self.calibrators.contextual.cache,
            ITEM_LAYOUTS,
            BATCH_LAYOUTS,
        ]

    def stats(self) -> dict[str, Any]:
        """Counters for monitoring: the prefix cache's hits, misses, entries and bytes; every other cache kept
        across requests (`caches`: name -> its entries, bytes, budget, hits, misses, evictions); this process's
        resident memory; on a GPU the CUDA graphs' captures and how many are held; with a feedback database, the
        labels learned from it."""
        return {
            "prefix_cache": self.prefix_cache.stats(),
            "caches": {cache.name: cache.stats() for cache in self.caches()},
            "process": process_memory(),
            **self.engine.stats(),
            **({"feedback": self.feedback.stats()} if self.feedback is not None else {}),
            **({"answer_window": self.recent.stats()} if self.recent is not None else {}),
        }

    def close(self) -> None:
        """Stop learning from the feedback database and close it (the model stays usable, without feedback)."""
        if self.feedback is not None:
            self.feedback.close()
