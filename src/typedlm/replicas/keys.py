"""What the router sends a request by, read from its body. The document it is about, as a short key: the router
sends a request to the replica whose prefix cache holds its document. And for a feedback post that labels answers
by their ids, the replicas that gave them (the part of an id before its dot, `core.labeling.origin_of`): a label by
id must reach the replica that holds its answer. Only routing hints: a body they cannot be read from gets none (any
replica), and the replica then answers it, errors included, exactly as the single server does."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from typedlm.core.errors import TypedLMError
from typedlm.core.labeling import origin_of
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


@dataclass(frozen=True)
class Keys:
    """What a request is routed by (see the module)."""

    document: str | None = None  # its document's key; None: no document to read
    origins: tuple[str, ...] = ()  # the replicas that gave the answers it labels by id, in the body's order
    listed: bool = False  # they are labels listed by id (`labels`), which one replica must hold all of


def _answer_ids(body: Any) -> tuple[list[Any], bool]:
    """The answer ids a feedback post names (not yet checked), and whether it lists its labels."""
    if not isinstance(body, Mapping):
        return [], False
    if isinstance(body.get("labels"), list):
        return [label.get("x_id") for label in body["labels"] if isinstance(label, Mapping)], True
    if "x_id" in body:
        return [body["x_id"]], False
    ids = body.get("x_ids")
    return (list(ids.values()), False) if isinstance(ids, Mapping) else ([], False)


def request_keys(path: str, content_encoding: str, body: bytes, limit: int) -> Keys:
    """A request's keys: its document's (equal for requests on the same document: their `state`, or a chat's
    document) and, for a feedback post by answer ids, their origins; none where there is nothing to read (another
    route, a body that is not JSON, a compressed body over `limit`)."""
    if path not in (SYSTEMONE, FEEDBACK, CHAT):
        return Keys()
    try:
        decoded = json.loads(decode(body, content_encoding, limit))
        state = _state(path, decoded)
    except (APIError, TypedLMError, ValueError, RecursionError):  # not JSON, not a chat...: the replica says why
        return Keys()
    origins: tuple[str, ...] = ()
    listed = False
    if path == FEEDBACK:
        ids, listed = _answer_ids(decoded)
        found = (origin_of(answer) for answer in ids if isinstance(answer, str))
        origins = tuple(dict.fromkeys(origin for origin in found if origin is not None))
    if state is None:
        return Keys(None, origins, listed)
    text = state if isinstance(state, str) else json.dumps(state, ensure_ascii=False, separators=(",", ":"))
    return Keys(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest(), origins, listed)


def document_key(path: str, content_encoding: str, body: bytes, limit: int) -> str | None:
    """The key of the document a request is about (`request_keys`), None where there is none to read."""
    return request_keys(path, content_encoding, body, limit).document
