"""Shared fixtures: the real embedded model, its tokenizer, tiny random models of several families, and the fake
language model (`typedlm.runtime.fake`).

Tiny models use the embedded model's real tokenizer and chat template (vocabulary 49152), so their
prompts, labels and token boundaries are real; only the weights are random. Exactness tests compare
the packed one-pass readout with an independent full forward per question (see `reference_masses`).

The fake model uses that tokenizer too, behind a real `Decider`: everything but the model runs as it does on a real
one (`fake_lm_decider`, `decider_on_fake`), for tests whose subject is not the model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, Gemma3TextConfig, LlamaConfig, Qwen3Config

from typedlm.calibrate.calibration import shipped_calibration
from typedlm.core.description import ModelDescription
from typedlm.decide.decider import Decider
from typedlm.ops.attention import kernel_available
from typedlm.runtime.fake import FAKE_NAME, fake_model
from typedlm.runtime.models import (
    EMBEDDED_MODEL,
    LoadedModel,
    converted_gguf,
    embedded_gguf_path,
    load_model,
    model_fingerprint,
)
from typedlm.text.labels import LabelSet

FAMILIES = ("qwen3", "llama", "gemma3")

# Servers the tests start keep no feedback unless a test gives them a database of its own: gold answers a developer
# posted to this machine's default database would otherwise change their answers.
os.environ["TYPEDLM_FEEDBACK_DB"] = "none"
# The commands the tests start serve the embedded model, whatever else this machine has installed (without --model a
# command serves the best named model installed); a test about another model names it.
os.environ["TYPEDLM_MODEL"] = "smollm2-135m"

# Under pytest-xdist (`make test` runs one worker per core) every worker shares the cores: torch's threads are split
# between them, so that two workers on two cores do not each run two threads.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

needs_triton = pytest.mark.skipif(not kernel_available(), reason="Triton is not installed")

# The files that take longest (seconds of their own on one core, `pytest -p no:xdist --durations=0`), handed out
# first: `make test` gives each worker a file at a time in collection order (--dist loadfile,
# --no-loadscope-reorder), and a long file begun last would keep one worker busy while the others wait.
LONGEST_FIRST = (
    "jobs/test_batch.py",  # a local Ray and batch jobs in subprocesses
    "replicas/test_replicas.py",  # Ray Serve with two replicas
    "runtime/test_graphs.py",
    "cli/test_cli.py",  # the commands in subprocesses
    "decide/test_recorded_bodies.py",
    "offline/test_evaluate.py",
    "decide/test_decider.py",
    "decide/test_feedback.py",
    "hosting/test_model_process.py",
    "server/test_server.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of LONGEST_FIRST before the rest, in its order; every file's tests keep theirs (a stable sort)."""
    tests = Path(__file__).parent

    def rank(item: pytest.Item) -> int:
        path = item.path.relative_to(tests).as_posix() if item.path.is_relative_to(tests) else ""
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)


@pytest.fixture(scope="session")
def sentencepiece_tokenizer():
    """A small BPE tokenizer trained here that marks spaces as SentencePiece does (`▁`, no byte-level pieces), with
    a Gemma-like chat template: how Llama- and Gemma-family tokenizers split text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    corpus = ["Question: Does the customer ask for a refund?\nAnswer yes or no.", "</document>\n\nQuestion: Spam?"] * 50
    specials = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>"]
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, special_tokens=specials))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}<start_of_turn>{{ m['role'] }}\n{{ m['content'] }}<end_of_turn>\n{% endfor %}"
        "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
    )
    return fast


@pytest.fixture(scope="session")
def embedded_dir():
    return converted_gguf(embedded_gguf_path())


@pytest.fixture(scope="session")
def tokenizer(request):
    # TYPEDLM_TEST_TOKENIZER: a directory with the embedded model's tokenizer, for machines without the GGUF
    # (tiny-model tests need only the tokenizer).
    override = os.environ.get("TYPEDLM_TEST_TOKENIZER")
    return AutoTokenizer.from_pretrained(override or request.getfixturevalue("embedded_dir"))


def tiny_config(family: str, vocab_size: int):
    common = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=4096,
        initializer_range=0.2,  # peaked distributions, so label masses are not all ~1/V
        tie_word_embeddings=family != "llama",
    )
    if family == "qwen3":
        return Qwen3Config(**common)
    if family == "llama":
        return LlamaConfig(**common)
    if family == "gemma3":
        # A short window that prompts exceed, on one of the two layers: the sliding-window trap.
        return Gemma3TextConfig(**common, sliding_window=24, layer_types=["sliding_attention", "full_attention"])
    raise ValueError(family)


def tiny_model(family: str, vocab_size: int, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = tiny_config(family, vocab_size)
    config._attn_implementation = "sdpa"
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="session", params=FAMILIES)
def tiny_decider(request, tokenizer):
    model = tiny_model(request.param, len(tokenizer))
    return Decider(LoadedModel(model, tokenizer, f"tiny-{request.param}"), calibration="raw")


@pytest.fixture(scope="session")
def real_decider():
    # the raw readout with options read by letter whatever the embedded model's shipped file says (reading by name
    # has its own tests), which the exactness tests compare against
    return Decider(load_model(None, "cpu", "float32"), calibration="raw", choice_answers="letters")


EMBEDDED_CONTEXT = 8192  # the embedded model's context: the fake's in `fake_lm_decider`, so limits read the same


def decider_on_fake(
    tokenizer, *, name: str = FAKE_NAME, max_positions: int = EMBEDDED_CONTEXT, fitted: bool = False, **options
) -> Decider:
    """A decider on the fake language model (`typedlm.runtime.fake`) with `tokenizer`; raw calibration unless
    `options` say otherwise. With `fitted`, it has the calibration file shipped for the embedded model, made out to
    the fake's fingerprint: its fitted path runs as the embedded model's does (its numbers mean nothing here)."""
    loaded = fake_model(tokenizer, name, max_positions=max_positions)
    if fitted:
        shipped = shipped_calibration(EMBEDDED_MODEL)
        fingerprint = model_fingerprint(loaded.model)
        options["calibration_file"] = dataclasses.replace(shipped, model=name, fingerprint=fingerprint)
    return Decider(loaded, **{"calibration": "raw", **options})


@pytest.fixture(scope="session")
def fake_lm_decider(tokenizer):
    """`real_decider`'s settings on the fake language model: raw calibration, options read by letter, a fitted
    file (the embedded model's numbers), the embedded model's context."""
    return decider_on_fake(tokenizer, fitted=True, choice_answers="letters")


@torch.inference_mode()
def reference_masses(model, full_ids: list[int], labels: LabelSet) -> list[float]:
    """Brute force: one full forward (with LM head) per label node, no cache, the model's own masks."""
    nodes = {form[:k] for forms in labels.groups for form in forms for k in range(len(form))}
    logprobs = {}
    for node in nodes:
        ids = torch.tensor([full_ids + list(node)], device=model.device)
        logits = model(ids, logits_to_keep=1).logits[0, -1].float()
        logprobs[node] = torch.log_softmax(logits, dim=-1)
    masses = []
    for forms in labels.groups:
        total = 0.0
        for form in forms:
            total += float(torch.exp(sum(logprobs[form[:k]][token].double() for k, token in enumerate(form))))
        masses.append(total)
    return masses


class ServerThread:
    """A real uvicorn server on a free loopback port, in a background thread, for one app."""

    def __init__(self, app, **config):
        import uvicorn

        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", **config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


@pytest.fixture(scope="session")
def server_url(real_decider):
    from typedlm.server import ServerSettings, create_app

    with ServerThread(create_app(real_decider, ServerSettings())) as url:
        yield url


@pytest.fixture(scope="session")
def fake_lm_server_url(fake_lm_decider):
    """A real server on `fake_lm_decider`."""
    from typedlm.server import ServerSettings, create_app

    with ServerThread(create_app(fake_lm_decider, ServerSettings())) as url:
        yield url


@pytest.fixture(scope="session")
def keyed_server_url(real_decider):
    from typedlm.server import ServerSettings, create_app

    with ServerThread(create_app(real_decider, ServerSettings(api_keys=("key-one", "key-two")))) as url:
        yield url


# ---------------------------------------------------------------- a fake decider, for the HTTP layer's own tests


class FakeCall(NamedTuple):
    state: Any
    questions: dict[str, Any]
    calibration: str | None
    order_reads: int | None


class FakePrepared(NamedTuple):
    call: FakeCall  # decide's arguments
    tokens: int


class FakeDecider:
    """A stand-in for `Decider` whose subject is NOT the model: for tests of the HTTP layer (routing, parsing,
    errors, auth, limits, queueing), which never need a real answer.

    It has the whole `DeciderLike` shape `create_app` takes, answering one request per forward (`max_batch` 1, as a
    decider on a CPU): `prepare_request` keeps the request, `launch_prepared` answers it with `decide` on the model
    thread; there is no feedback database (the feedback routes refuse as a real decider without one does).
    `decide` answers every question through the question's
    own `answer` with uniform probabilities (raw mass 1.0), so responses are well-formed and deterministic;
    usage counts one token per whitespace-separated word of the state. Every call is recorded in `calls`.
    `gate` (a threading.Event) makes each call wait until it is set (at most `gate_timeout_s`), and
    `delay_s` makes it sleep after that: slow model passes for queue and timeout tests; `fail_with` (an
    exception) is raised by every call: a server bug, for the 5xx path. `stats` has the
    real prefix cache's counters: a state seen before counts as a hit, a new one as a miss.
    """

    def __init__(
        self,
        name: str = "fake-model",
        *,
        delay_s: float = 0.0,
        gate: threading.Event | None = None,
        gate_timeout_s: float = 60.0,
        calibration: str = "raw",
        max_bytes: int = 1 << 20,
    ):
        self.name = name
        self.delay_s = delay_s
        self.gate = gate
        self.gate_timeout_s = gate_timeout_s
        self.calibration = calibration
        self.calls: list[FakeCall] = []
        self._lock = threading.Lock()
        self._seen: dict[str, int] = {}  # state as JSON -> its size in bytes
        self._counters = dict.fromkeys(("hits", "partial_hits", "misses", "reused_tokens"), 0)
        self._max_bytes = max_bytes
        self.fail_with: Exception | None = None

    max_batch = 1

    def describe(self) -> ModelDescription:
        return ModelDescription(self.name)

    def prepare_request(self, state, questions, calibration=None, order_reads=None, keep_reading=False, **_):
        tokens = max(1, len(json.dumps(state, ensure_ascii=False).split()))
        return FakePrepared(FakeCall(state, dict(questions), calibration, order_reads), tokens)

    def launch_prepared(self, requests):
        responses = [self.decide(*prepared.call) for prepared in requests]
        return lambda: responses

    def record_feedback(self, posted, response):
        from typedlm.calibrate.feedback import feedback_needed

        raise feedback_needed()

    def feedback_report(self):
        from typedlm.calibrate.feedback import feedback_needed

        raise feedback_needed()

    def close(self) -> None:
        pass

    def decide(self, state, questions, calibration=None, order_reads=None):
        from typedlm.core.answers import Response, Usage

        self.calls.append(FakeCall(state, dict(questions), calibration, order_reads))
        if self.fail_with is not None:
            raise self.fail_with
        if self.gate is not None:
            self.gate.wait(self.gate_timeout_s)
        if self.delay_s:
            time.sleep(self.delay_s)
        key = json.dumps(state, ensure_ascii=False, sort_keys=True)
        tokens = max(1, len(key.split()))
        with self._lock:
            if key in self._seen:
                self._counters["hits"] += 1
                self._counters["reused_tokens"] += tokens
            else:
                self._counters["misses"] += 1
                self._seen[key] = len(key.encode())
        answers = {qid: q.answer([1 / q.size] * q.size, 1.0, {}) for qid, q in questions.items()}
        extras: dict[str, Any] = {"calibration": calibration or self.calibration}
        if order_reads and order_reads > 1:
            extras["order_reads"] = order_reads
        return Response(self.name, answers, Usage(tokens), extras)

    def stats(self) -> dict[str, dict[str, int]]:
        with self._lock:
            entries, size = len(self._seen), sum(self._seen.values())
            return {"prefix_cache": {**self._counters, "entries": entries, "bytes": size, "max_bytes": self._max_bytes}}


@pytest.fixture(scope="session")
def fake_decider():
    return FakeDecider()


@pytest.fixture(scope="session")
def fake_server_url(fake_decider):
    from typedlm.server import ServerSettings, create_app

    with ServerThread(create_app(fake_decider, ServerSettings())) as url:
        yield url


@pytest.fixture(scope="session")
def fake_keyed_server_url():
    from typedlm.server import ServerSettings, create_app

    with ServerThread(create_app(FakeDecider(), ServerSettings(api_keys=("key-one", "key-two")))) as url:
        yield url


def json_leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """(path, value) of every leaf of a decoded JSON object (lists are leaves)."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from json_leaves(item, (*path, key))
    else:
        yield path, value


CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs a Chromium (apt-get install chromium)")


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    """A page in a headless Chromium, one per test module, recording its errors (`page.errors`: page errors and
    console errors) and the URLs it requests (`page.requested`). Skipped without playwright; a module using it marks
    itself `needs_chromium`."""
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page()
        errors: list[str] = []
        requested: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.on("request", lambda request: requested.append(request.url))
        page.errors, page.requested = errors, requested
        try:
            yield page
        finally:
            browser.close()
