"""POST /v1/chat/completions: a decision, in the OpenAI chat shape, when the system message is a question schema.

The system message is the `questions` object of /v1/systemone as JSON (or {"questions": {...}}); the
user message is the state. The reply's message content is the answers as JSON; nothing is generated.
Any other chat request is refused with a 400 saying so. A refused request is answered in OpenAI's {"error": {...}}
shape, with the status and type of the one table (`hosting.status.status_of`) in OpenAI's terms (`error_response`).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from fastapi.responses import JSONResponse

from typedlm.core.errors import InvalidRequest, LimitExceeded
from typedlm.core.questions import Handover, Question, Text, parse_handover, parse_questions
from typedlm.hosting.status import APIError, status_of
from typedlm.server.body import NotJSON, parse_json

NOT_A_DECISION = (
    "this server decides, it does not generate: put the questions (the `questions` object of /v1/systemone, "
    "as JSON) in the system message and the document in the user message"
)


def openai_error(
    status: int,
    message: str,
    param: str | None = None,
    kind: str = "invalid_request_error",
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status, headers=headers)


def error_response(exc: APIError | InvalidRequest) -> JSONResponse:
    """A refused request in OpenAI's shape: the message, status, type and headers of the one table (`status_of`),
    in OpenAI's terms where they differ: a 400 where Jev answers 422, and invalid_request_error for every request
    refused for what it asks (`InvalidRequest`, over a limit too: Jev's request_too_large). `param` names the field
    at fault, none for a body that is not JSON or a request over a limit."""
    error = status_of(exc)
    status = 400 if error.status == 422 else error.status
    kind, param = error.error_type, None
    if isinstance(exc, InvalidRequest):
        kind = "invalid_request_error"
        param = None if isinstance(exc, (NotJSON, LimitExceeded)) else ".".join(map(str, exc.loc)) or None
    return openai_error(status, error.message, param, kind, error.headers)


def _text(content: Any) -> str | None:
    """A message's text: a string, or the text parts of a content array."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if parts and all(isinstance(p, str) for p in parts):
            return "".join(parts)
    return None


def parse_chat(body: Any) -> tuple[str | None, Text, dict[str, Question], Handover]:
    """(model, state, questions, handover) from a chat completion body, or InvalidRequest. `x_coverage` and
    `x_min_accuracy` may be fields of the body (the openai client's `extra_body`) or of the system message's
    JSON object beside its `questions`."""
    if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
        raise InvalidRequest("messages must be an array of chat messages", ("messages",))
    messages = [m for m in body["messages"] if isinstance(m, dict)]
    system = [_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer")]
    user = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    try:
        schema = parse_json(system[0]) if system and system[0] else None
    except NotJSON:
        schema = None  # not JSON: not a decision
    except InvalidRequest as exc:  # JSON, but refused (a lone surrogate, nesting too deep, a non-finite number)
        raise InvalidRequest(f"the system message: {exc.message}", ("messages",)) from exc
    handover = parse_handover(body)
    if isinstance(schema, dict) and isinstance(schema.get("questions"), dict):
        handover = handover or parse_handover(schema)
        schema = schema["questions"]
    looks_like_questions = (
        isinstance(schema, dict) and schema and all(isinstance(q, dict) and "type" in q for q in schema.values())
    )
    if not looks_like_questions:
        raise InvalidRequest(NOT_A_DECISION, ("messages",))
    if len(user) != 1 or user[0] is None:
        raise InvalidRequest("send exactly one user message holding the document as text", ("messages",))
    n = body.get("n")
    if n is not None and n != 1:
        raise InvalidRequest(
            "n must be 1: a decision has one answer (ask again for another read? it is the same)", ("n",)
        )
    if body.get("stream") is not None and not isinstance(body["stream"], bool):
        raise InvalidRequest("stream must be true or false", ("stream",))
    model = body.get("model")
    return (model if isinstance(model, str) else None), user[0], parse_questions(schema), handover


def usage(input_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": input_tokens,
        "completion_tokens": 0,
        "total_tokens": input_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def completion(model: str, answers: dict[str, Any], input_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": json.dumps(answers, ensure_ascii=False)},
                "finish_reason": "stop",
                "logprobs": None,
            }
        ],
        "usage": usage(input_tokens, cached_tokens),
    }


def stream_events(
    model: str, answers: dict[str, Any], input_tokens: int, cached_tokens: int = 0, include_usage: bool = False
) -> Iterator[str]:
    """`stream: true` as OpenAI's server-sent events: one chunk with the whole answer (nothing is generated token
    by token), one closing it, the usage chunk if asked for (`stream_options.include_usage`), then [DONE]."""
    head = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk", "created": int(time.time())}
    head["model"] = model
    content = json.dumps(answers, ensure_ascii=False)
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": content}, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if include_usage:
        chunks.append({**head, "choices": [], "usage": usage(input_tokens, cached_tokens)})
    for chunk in chunks:
        yield f"data: {json.dumps(chunk, ensure_ascii=False)}\n\n"
    yield "data: [DONE]\n\n"
