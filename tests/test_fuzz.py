"""Generated requests against the real server (the embedded model): no 5xx, responses as the OpenAPI says.

Two generators: schemathesis, from the server's own OpenAPI document (every operation, bounded), and a
hypothesis fuzz of raw bodies that reaches what a schema-driven generator does not: lone surrogates in every
text field, nesting deeper than the limit, non-finite and oversized numbers, huge fields, broken JSON.
"""

from __future__ import annotations

import json

import pytest

hypothesis = pytest.importorskip("hypothesis")
schemathesis = pytest.importorskip("schemathesis")

from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from typedlm.server import ServerSettings, create_app  # noqa: E402

SCHEMA_EXAMPLES = 40  # per operation
FUZZ_EXAMPLES = 150


@pytest.fixture
def app(real_decider):  # one per test: a client's lifespan (schemathesis') stops the app's model worker
    # a 1024-token budget per request: generated bodies stay cheap on a CPU (a few thousand tokens of nested JSON
    # levels read in 8 orders would take seconds each); everything over it is a 413, which is what is tested
    budget, real_decider.max_input_tokens = real_decider.max_input_tokens, 1024
    yield create_app(real_decider, ServerSettings(max_body_bytes=1 << 20))
    real_decider.max_input_tokens = budget


def test_generated_requests_get_no_server_error_and_conform_to_the_schema(app):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.path for op in operations} >= {"/v1/systemone", "/v1/models", "/v1/chat/completions", "/health"}
    for operation in operations:

        @given(operation.as_strategy())
        @settings(max_examples=SCHEMA_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def call(case):
            # schema-valid data may still be over the size limits (413) or the queue (503): the stock "positive
            # data accepted" check counts those as rejections, so it is replaced by the one that matters here
            response = case.call_and_validate(excluded_checks=[positive_data_acceptance])
            assert response.status_code != 422, f"schema-valid data refused: {response.text[:300]}"

        call()


# ---------------------------------------------------------------- raw bodies nobody's schema would generate

SURROGATE = st.sampled_from(["\\ud800", "\\udfff", "\\udc00x", "a\\ud83d"])  # as JSON escapes: lone halves
TEXT = st.one_of(st.text(max_size=40), SURROGATE.map(lambda s: "t" + s))


def _quoted(text: str) -> str:
    """A JSON string literal; a lone-surrogate escape is spliced in as written."""
    return '"' + text + '"' if "\\u" in text else json.dumps(text)


@st.composite
def question(draw) -> str:
    kind = draw(st.sampled_from(["noul", "choice", "score", "box", "maybe"]))
    parts = [f'"type": {_quoted(kind)}']
    if draw(st.booleans()):
        parts.append(f'"instructions": {_quoted(draw(TEXT))}')
    if kind == "choice":
        names = draw(st.lists(TEXT, min_size=0, max_size=5))
        parts.append('"criteria": {' + ", ".join(f"{_quoted(n)}: null" for n in names) + "}")
    elif kind == "score":
        level = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e999", '{"v": 1e999}', '"low"', "[1, 2]"]))
        parts.append(f'"criteria": [{level}, "high"]')
    return "{" + ", ".join(parts) + "}"


@st.composite
def body(draw) -> bytes:
    state = draw(
        st.one_of(
            TEXT.map(_quoted),
            st.integers(1, 200).map(lambda depth: "[" * depth + "]" * depth),
            st.integers(60, 70).map(lambda depth: '{"a": ' * depth + "1" + "}" * depth),
            st.just('"' + "word " * 3000 + '"'),
            st.just("9" * 5000),
        )
    )
    qids = draw(st.lists(TEXT, min_size=0, max_size=3))
    questions = "{" + ", ".join(f"{_quoted(q)}: {draw(question())}" for q in qids) + "}"
    extra = draw(st.sampled_from(["", ', "x_order_reads": 8', ', "x_order_reads": 0', ', "x_calibration": "nope"']))
    text = '{"state": ' + state + ', "questions": ' + questions + extra + "}"
    if draw(st.integers(0, 9)) == 0:
        text = text[: draw(st.integers(0, len(text)))]  # broken JSON
    return text.encode("utf-8", "surrogatepass")


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
        assert resp.status_code < 500, (path, raw[:200], resp.text[:300])
        json.loads(resp.text, parse_constant=lambda name: pytest.fail(f"non-standard JSON {name}"))
