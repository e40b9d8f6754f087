"""Peer runners: answer Jev noul questions with two open PyPI peers, for benchmarks side by side with typedlm.

``peer_runners(model_dir, device)`` loads each peer's in-process Hugging Face backend once and returns
``{name: run}`` with ``run(state, questions) -> {question id: P(yes)}``. Only ``type == "noul"`` questions are
answered; others are skipped. A peer that does not import or load is left out, with the reason on stderr once.
Install both with ``pip install --no-deps anyjev==0.3.0 llm2jev==0.6.1`` (their other needs, numpy, requests,
jinja2, accelerate, transformers and torch, are typedlm's own); neither pulls any data over the network here.

anyjev 0.3.0 (``anyjev.Decider`` over ``anyjev.backends.hf.HFBackend``)
    Configured as shipped: level "L0", prior "batch", batch_size 16, here with ``device`` and ``dtype`` given
    (HFBackend defaults to cuda/bfloat16). Each noul question becomes a system + user chat prompt
    ("State: <document> / Question: <q> / Answer Yes or No.") and its "Answer No or Yes." twin, so a request
    holds 2 full prompts per question (1 with ``anyjev_level="raw"``), each carrying the whole document.
    They go as left-padded, length-sorted batches of 16 rows, one forward per batch with ``logits_to_keep=1``:
    ceil(2·Q/16) forwards for Q questions. The document is encoded 2·Q times; no KV prefix is shared (its
    shared-prefix path needs at least 3 option orders, which a noul never has). P(yes) is read from the "Yes"
    and "No" label tokens, the two orders are averaged in log space, and, from the 8th state seen with the same
    question text on, divided by the running mean over earlier calls (power 0.75): with the "batch" prior an
    answer depends on what this runner answered before. ``anyjev_prior="none"`` makes it stateless. The noul
    ``criteria`` field is not used (anyjev's noul takes only a text).

llm2jev 0.6.1 (``llm2jev.LLM2Jev`` over ``llm2jev.backends.HF``)
    Configured like its CLI ``--backend hf --prompt chat`` with temperature 1.0, here with the given
    ``device`` (as ``device_map``) and ``dtype`` (its default is bfloat16). The document goes in a user turn
    of the model's chat template, each question in a last user turn with "A. Yes: yes / B. No: no" options
    (noul ``criteria`` fill those texts), and the assistant turn is pre-filled with "Answer:". The prompt
    prefix is rendered once as text, but the HF backend has no prefix cache: every question is its own
    batch-1 forward over the full prompt (document included), with logits kept for every position, so Q
    questions cost Q forwards and Q encodings of the document. They are sent through a thread pool but run
    one at a time under a lock. P(yes) is a softmax over the " A" / " B" label logprobs. Stateless. At most
    64 questions per call, so larger sets are split here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

from typedlm.core.names import Kind

LLM2JEV_MAX_QUESTIONS = 64  # llm2jev.engine.MAX_QUESTIONS in 0.6.1
_reported: set[str] = set()


def _report(name: str, exc: BaseException) -> None:
    message = f"peers: {name} left out: {type(exc).__name__}: {exc}"
    if message not in _reported:
        _reported.add(message)
        print(message, file=sys.stderr, flush=True)


def _noul_only(questions: dict) -> dict:
    return {qid: q for qid, q in questions.items() if isinstance(q, dict) and q.get("type") == Kind.NOUL}


def _anyjev_runner(model_dir: str, device: str, dtype: str, level: str, prior: str) -> Callable[[object, dict], dict]:
    from anyjev import Decider, Question
    from anyjev.backends.hf import HFBackend
    from anyjev.readout import resolve_labels

    backend = HFBackend(model_dir, device=device, dtype=dtype)
    resolve_labels(backend.tokenizer, Question.noul("probe"))  # fails now if "Yes"/"No" are not single tokens
    decider = Decider(backend, level=level, prior=prior)

    def run(state: object, questions: dict) -> dict[str, float]:
        asked = _noul_only(questions)
        if not asked:
            return {}
        specs = [Question.noul(str(q.get("instructions") or ""), name=qid) for qid, q in asked.items()]
        decisions = decider.decide(state, specs)
        return {qid: decisions[i].p_true for i, qid in enumerate(asked)}

    return run


def _llm2jev_runner(model_dir: str, device: str, dtype: str) -> Callable[[object, dict], dict]:
    from llm2jev import LLM2Jev
    from llm2jev.backends import HF
    from transformers import AutoTokenizer

    backend = HF(model_dir, device=device, dtype=dtype)
    jev = LLM2Jev(AutoTokenizer.from_pretrained(model_dir), backend, temperature=1.0, style="chat")

    def run(state: object, questions: dict) -> dict[str, float]:
        asked = list(_noul_only(questions).items())
        out: dict[str, float] = {}
        for start in range(0, len(asked), LLM2JEV_MAX_QUESTIONS):
            answers = jev(state, dict(asked[start : start + LLM2JEV_MAX_QUESTIONS]))
            out.update({qid: float(a["noul"]) for qid, a in answers.items()})
        return out

    return run


def peer_runners(
    model_dir: str,
    device: str = "cpu",
    *,
    dtype: str = "float32",
    anyjev_level: str = "L0",
    anyjev_prior: str = "batch",
) -> dict[str, Callable[[object, dict], dict]]:
    """{peer name: run(state, questions) -> {question id: P(yes)}} for every peer that imports and loads.

    ``model_dir`` is a local Hugging Face causal-LM directory with a chat template; the model is loaded once per
    peer here. ``dtype`` is a torch dtype name used by both peers; ``anyjev_level`` ("L0" | "raw") and
    ``anyjev_prior`` ("batch" | "content_free" | "none") are passed to anyjev's Decider.
    """
    builders: dict[str, Callable[[], Callable[[object, dict], dict]]] = {
        "anyjev": lambda: _anyjev_runner(model_dir, device, dtype, anyjev_level, anyjev_prior),
        "llm2jev": lambda: _llm2jev_runner(model_dir, device, dtype),
    }
    runners: dict[str, Callable[[object, dict], dict]] = {}
    for name, build in builders.items():
        try:
            runners[name] = build()
        except Exception as exc:  # a missing package, a failed load or an unusable tokenizer: leave the peer out
            _report(name, exc)
    return runners
