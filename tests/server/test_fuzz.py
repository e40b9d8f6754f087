"""Generated requests against the real server: no 5xx, responses as the OpenAPI says. The model is the fake one
(`fake_lm_decider`: the embedded model's tokenizer, so the generated text meets the real tokenizing, labels and limits;
answers from `typedlm.runtime.fake`), whose answers are not what is tested here.

Two generators: schemathesis, from the server's own OpenAPI document (every operation, bounded), and a
hypothesis fuzz of raw bodies that reaches what a schema-driven generator does not: lone surrogates in every
text field, nesting deeper than the limit, non-finite and oversized numbers, huge fields, broken JSON.
"""

from __future__ import annotations

import collections
import json
import os

import pytest

hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from typedlm.server import ServerSettings, create_app  # noqa: E402

SCHEMA_EXAMPLES = 40  # per operation
# bodies per run (each sent to both routes); TYPEDLM_FUZZ_EXAMPLES=5000 for a long run, and TYPEDLM_FUZZ_REPORT=FILE
# to write the statuses it got
FUZZ_EXAMPLES = int(os.environ.get("TYPEDLM_FUZZ_EXAMPLES", "150"))
STATUSES: collections.Counter[str] = collections.Counter()


@pytest.fixture
def app(fake_lm_decider):  # one per test: a client's lifespan (schemathesis') stops the app's model worker
    # a 1024-token budget per request: generated bodies stay cheap (a few thousand tokens of nested JSON levels read
    # in 8 orders take long to tokenize); everything over it is a 413, which is what is tested
    preparer = fake_lm_decider.preparer
    budget, preparer.max_input_tokens = preparer.max_input_tokens, 1024
    yield create_app(fake_lm_decider, ServerSettings(max_body_bytes=1 << 20))
    preparer.max_input_tokens = budget


def test_generated_requests_get_no_server_error_and_conform_to_the_schema(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/systemone", "/v1/models", "/v1/chat/completions", "/health"}
    for operation in operations:
        # a feedback post's gold answers must name its own questions and their answers, which no JSON schema can
        # say: there a 422 is right, and only the rest (no 5xx, the documented shapes) is checked
        may_refuse = operation.path == "/v1/systemone/feedback" and operation.method.upper() == "POST"

        @given(operation.as_strategy())
        @settings(max_examples=SCHEMA_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def call(case):
            # schema-valid data may still be over the size limits (413) or the queue (503): the stock "positive
            # data accepted" check counts those as rejections, so it is replaced by the one that matters here
            response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
            assert may_refuse or response.status_code != 422, f"schema-valid data refused: {response.text[:300]}"  # noqa: B023 (called at once, in this iteration)

        call()


# ---------------------------------------------------------------- raw bodies nobody's schema would generate

# Each body is a valid request with at most one fault, so that a good share reaches the model (whose tokenizer
# sees the generated text) and every fault is met alone.
TEXT = st.text(max_size=200)  # any valid Unicode: astral characters, controls, RTL marks, NUL
NAME = st.text(min_size=1, max_size=20)
SURROGATES = ("\\ud800", "\\udfff", "x\\udc00", "\\ud83d!")  # lone halves, as JSON escapes
FAULTS = (
    None,
    None,
    None,
    "surrogate in state",
    "surrogate in instructions",
    "surrogate in an option",
    "surrogate in a question id",
    "deep nesting",
    "nesting past the limit",
    "non-finite level",
    "huge integer",
    "broken JSON",
    "unknown type",
    "no questions",
    "one option",
    "long state",
    "many reads of long options",
)


@st.composite
def body(draw) -> bytes:
    fault = draw(st.sampled_from(FAULTS))
    surrogate = draw(st.sampled_from(SURROGATES))
    state = json.dumps(draw(TEXT))
    if fault == "surrogate in state":
        state = '"' + surrogate + '"'
    elif fault == "deep nesting":
        state = '{"a": ' * 30 + json.dumps(draw(TEXT)) + "}" * 30
    elif fault == "nesting past the limit":
        depth = draw(st.integers(65, 3000))
        state = "[" * depth + "]" * depth
    elif fault == "long state":
        state = json.dumps("word " * draw(st.integers(2000, 60000)))
    questions = []
    for i in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["noul", "choice", "score"]))
        qid = json.dumps(draw(NAME))
        if i == 0 and fault == "surrogate in a question id":
            qid = '"' + surrogate + '"'
        parts = [f'"type": "{"box" if i == 0 and fault == "unknown type" else kind}"']
        instructions = json.dumps(draw(TEXT))
        if i == 0 and fault == "surrogate in instructions":
            instructions = '"why ' + surrogate + '"'
        parts.append(f'"instructions": {instructions}')
        if kind == "choice":
            names = draw(st.lists(NAME, min_size=2, max_size=6, unique=True))
            if i == 0 and fault == "one option":
                names = names[:1]
            options = [f"{json.dumps(n)}: {json.dumps(draw(TEXT))}" for n in names]
            if i == 0 and fault == "surrogate in an option":
                options.append('"opt' + surrogate + '": null')
            if i == 0 and fault == "many reads of long options":
                options = [f'"option {k}": {json.dumps("long " * 400)}' for k in range(40)]
            parts.append('"criteria": {' + ", ".join(options) + "}")
        elif kind == "score":
            levels = [json.dumps(t) for t in draw(st.lists(TEXT, min_size=2, max_size=5))]
            if i == 0 and fault == "non-finite level":
                levels[0] = '{"v": ' + draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999"])) + "}"
            parts.append('"criteria": [' + ", ".join(levels) + "]")
        questions.append(f"{qid}: {{{', '.join(parts)}}}")
    extra = ', "x_order_reads": 8' if fault == "many reads of long options" else ""
    if fault == "huge integer":
        extra = ', "n": ' + "9" * draw(st.integers(4301, 6000))
    text = '{"state": ' + state + ', "questions": {' + ("" if fault == "no questions" else ", ".join(questions)) + "}"
    text += extra + "}"
    if fault == "broken JSON":
        text = text[: draw(st.integers(0, len(text) - 1))]
    return text.encode("utf-8")


@given(body())
@settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
def test_fuzzed_bodies_are_answered_or_refused_never_a_server_error(app, raw):
    client = TestClient(app, raise_server_exceptions=False)  # no `with`: its lifespan would stop the model worker
    for path in ("/v1/systemone", "/v1/chat/completions"):
        content = raw
        if path == "/v1/chat/completions":  # the same text as the system message's questions
            content = (
                b'{"messages": [{"role": "system", "content": '
                + json.dumps(raw.decode("utf-8", "replace")).encode()
                + b'}, {"role": "user", "content": "hi"}]}'
            )
        resp = client.post(path, content=content, headers={"content-type": "application/json"})
        STATUSES[f"{path} {resp.status_code}"] += 1
        assert resp.status_code < 500, (path, raw[:200], resp.text[:300])
        json.loads(resp.text, parse_constant=lambda name: pytest.fail(f"non-standard JSON {name}"))


@pytest.fixture(scope="module", autouse=True)
def report_statuses():
    yield
    if os.environ.get("TYPEDLM_FUZZ_REPORT"):
        total = sum(STATUSES.values())
        server_errors = sum(v for k, v in STATUSES.items() if int(k.rsplit(" ", 1)[1]) >= 500)
        report = {"requests": total, "server_errors": server_errors}
        report["statuses"] = dict(sorted(STATUSES.items()))
        with open(os.environ["TYPEDLM_FUZZ_REPORT"], "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
