"""The document a request is about, as a short key: what the router uses to send a request to the replica whose
prefix cache holds its document. Only a routing hint: a body the key cannot be read from gets None (any replica),
and the replica then answers it, errors included, exactly as the single server does."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from typedlm.core.errors import TypedLMError
from typedlm.server.body import decode
from typedlm.server.chat import parse_chat
from typedlm.server.errors import APIError

SYSTEMONE = "/v1/systemone"
FEEDBACK = "/v1/systemone/feedback"  # a post is a request too: to the replica that has its document
CHAT = "/v1/chat/completions"


def _state(path: str, body: Any) -> Any:
    if path in (SYSTEMONE, FEEDBACK):
        return body.get("state") if isinstance(body, dict) else None
    _model, state, _questions, _handover = parse_chat(body)
    return state


def document_key(path: str, content_encoding: str, body: bytes, limit: int) -> str | None:
    """A key equal for requests on the same document (their `state`, or a chat's document), None where there is
    no document to read (another route, a body that is not JSON, a compressed body over `limit`)."""
    if path not in (SYSTEMONE, FEEDBACK, CHAT):
        return None
    try:
        state = _state(path, json.loads(decode(body, content_encoding, limit)))
    except (APIError, TypedLMError, ValueError, RecursionError):  # not JSON, not a chat...: the replica says why
        return None
    if state is None:
        return None
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
