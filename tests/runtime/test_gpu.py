"""The CUDA path: the packed readout on a GPU equals the reference there (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch

from typedlm.core.confidence import normalise
from typedlm.core.options import EngineOptions
from typedlm.core.questions import ChoiceQuestion, NoulQuestion, ScoreQuestion
from typedlm.decide.decider import Decider
from typedlm.ops.lse_attention import attend_with_lse, plain_attention
from typedlm.runtime import graphs as graphs_module
from typedlm.runtime.engine import Engine
from typedlm.runtime.models import LoadedModel
from typedlm.runtime.patching import unfuse_rope

from ..conftest import reference_masses, tiny_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

QUESTIONS = {
    "n": NoulQuestion("Is it about billing?"),
    "c": ChoiceQuestion(tuple((f"option {i}", None) for i in range(40))),
    "s": ScoreQuestion(("low", "medium", "high")),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["full", "causal", "masked"])
def test_cuda_kernels_with_lse_match_the_plain_computation(dtype, kind):
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 8, 64, 128, device="cuda", dtype=dtype) for _ in range(3))
    mask = None
    if kind == "masked":  # a label tree's shape: a causal chain, and rows that see only themselves past it
        mask = torch.ones(64, 64, dtype=torch.bool, device="cuda").tril()
        mask[40:, 40:] = torch.eye(24, dtype=torch.bool, device="cuda")
        mask = mask[None, None].expand(3, 1, 64, 64)
    out, lse = attend_with_lse(q, k, v, 128**-0.5, causal=kind == "causal", mask=mask)
    ref_out, ref_lse = plain_attention(q, k, v, 128**-0.5, causal=kind == "causal", mask=mask)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert (lse - ref_lse).abs().max() < tol * 10 and (out.float() - ref_out.float()).abs().max() < tol


@pytest.mark.parametrize("family", ["qwen3", "gemma3"])
def test_packed_readout_on_cuda_equals_full_forward_in_float32(family, tokenizer):
    model = tiny_model(family, len(tokenizer)).cuda()
    decider = Decider(LoadedModel(model, tokenizer, "tiny"), calibration="raw")
    state = "The customer was charged twice and wants the second payment back."
    response = decider.decide(state, QUESTIONS)
    for qid, question in QUESTIONS.items():
        whole = decider.layout.encode(decider.layout.prefix_text(state) + decider.layout.suffix_text(question))
        probs, raw = normalise(reference_masses(model, whole, decider.labeler.for_question(question)))
        answer = response.answers[qid]
        got = (
            [answer.p_yes]
            if qid == "n"
            else list(answer.probabilities if qid == "s" else answer.probabilities.values())
        )
        assert max(abs(a - b) for a, b in zip(got, probs[: len(got)], strict=True)) < 1e-4, qid
        assert abs(answer.raw_mass - raw) < 1e-4


def test_bfloat16_cascade_agrees_with_masked_attention(tokenizer):
    model = tiny_model("qwen3", len(tokenizer)).cuda().to(torch.bfloat16)
    state = "The parcel is late and the customer is upset."
    masked = Decider(LoadedModel(model, tokenizer, "tiny"), calibration="raw")
    masked.engine = Engine(model, EngineOptions(cascade=False))  # the same model, one masked attention per layer
    masked_answers = masked.decide(state, QUESTIONS).answers
    cascade_answers = Decider(LoadedModel(model, tokenizer, "tiny"), calibration="raw").decide(state, QUESTIONS).answers
    assert abs(masked_answers["n"].p_yes - cascade_answers["n"].p_yes) < 0.05
    assert list(masked_answers["s"].probabilities) == pytest.approx(list(cascade_answers["s"].probabilities), abs=0.05)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graphs_equal_the_eager_forward(dtype, tokenizer):
    model = tiny_model("qwen3", len(tokenizer)).cuda().to(dtype)
    graphs = Decider(LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, calibration="raw")
    eager = Decider(
        LoadedModel(model, tokenizer, "tiny"),
        prefix_cache_bytes=0,
        engine=EngineOptions(cuda_graphs=False),
        calibration="raw",
    )
    assert graphs.features.capture and not eager.features.static
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    states = ["The parcel is late and the customer is upset.", "A short one.", "The parcel is late, again and again."]
    for state in states * 2:  # the second round replays the captured graphs
        want, got = eager.decide(state, QUESTIONS).answers, graphs.decide(state, QUESTIONS).answers
        assert abs(want["n"].p_yes - got["n"].p_yes) < tol
        assert list(want["s"].probabilities) == pytest.approx(list(got["s"].probabilities), abs=tol)
        assert list(want["c"].probabilities.values()) == pytest.approx(list(got["c"].probabilities.values()), abs=tol)
    assert len(graphs.engine.forward.runner.slots) <= 3


def _graphs_and_eager(tokenizer) -> tuple[Decider, Decider]:
    """Deciders over one tiny Qwen3 model on the GPU: CUDA graphs (the default there) and eager forwards."""
    model = tiny_model("qwen3", len(tokenizer)).cuda()
    graphs = Decider(LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, calibration="raw")
    eager_options = EngineOptions(cuda_graphs=False)
    return graphs, Decider(
        LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, engine=eager_options, calibration="raw"
    )


@pytest.mark.parametrize("max_graphs", [1, 2])
def test_cuda_graphs_survive_a_growing_buffer_and_evictions(max_graphs, tokenizer, monkeypatch):
    # a longer document than any before reallocates the key/value buffer and drops every graph; later captures
    # must not reuse the freed graphs' memory pool (PyTorch asserts), nor must captures after LRU evictions
    monkeypatch.setattr(graphs_module, "MAX_GRAPHS", max_graphs)
    graphs, eager = _graphs_and_eager(tokenizer)
    states = ["short", "a bit longer than that " * 3, "word " * 300, "tiny", "word " * 700, "more words " * 40]
    for state in states:
        want, got = eager.decide(state, QUESTIONS).answers, graphs.decide(state, QUESTIONS).answers
        assert abs(want["n"].p_yes - got["n"].p_yes) < 1e-5
    assert len(graphs.engine.forward.runner.slots) <= max_graphs


def test_graph_captures_are_counted_for_monitoring(tokenizer):
    """`stats()["cuda_graphs"]`: a new batch shape captures a graph, a shape held replays without one."""
    graphs, eager = _graphs_and_eager(tokenizer)
    assert "cuda_graphs" not in eager.stats()
    graphs.decide("word " * 300, QUESTIONS)
    first = graphs.stats()["cuda_graphs"]
    graphs.decide("word " * 300, QUESTIONS)  # the same shape: replayed
    assert graphs.stats()["cuda_graphs"] == first and first["captures"] >= 1
    graphs.decide("word " * 900, QUESTIONS)  # a longer document: another shape
    after = graphs.stats()["cuda_graphs"]
    assert after["captures"] > first["captures"] and after["held"] == len(graphs.engine.forward.runner.slots)


@pytest.mark.parametrize("max_graphs", [64, 1])
def test_forwards_launched_before_the_last_is_done_equal_each_alone(max_graphs, tokenizer, monkeypatch):
    """The server's pipeline: forwards launched while earlier ones are still in flight (the same captured shape
    again, its inputs rewritten and its output overwritten; a longer document that grows the buffer; with one
    graph kept, evictions; a document repeated while its first forward runs, a prefix-cache hit) give the answers
    each request gets alone, in bfloat16."""
    monkeypatch.setattr(graphs_module, "MAX_GRAPHS", max_graphs)
    model = tiny_model("qwen3", len(tokenizer)).cuda().to(torch.bfloat16)
    loaded = LoadedModel(model, tokenizer, "tiny")
    pipelined = Decider(loaded, calibration="raw")
    alone = Decider(loaded, calibration="raw", prefix_cache_bytes=0)
    states = [f"Ticket {i}: the customer was charged {i + 2} times." * (1 + i % 3) for i in range(6)]
    batches = [[states[0]], [states[3]], [states[1], states[2]], ["word " * 700], [states[4], states[5]], [states[0]]]
    waits = [pipelined.launch_prepared([pipelined.prepare_request(s, QUESTIONS) for s in batch]) for batch in batches]
    worst = 0.0
    for batch, wait in zip(batches, waits, strict=True):  # every forward was launched before any was waited for
        for state, response in zip(batch, wait(), strict=True):
            want = alone.decide(state, QUESTIONS).answers
            for qid, question in QUESTIONS.items():
                got = question.wire_probabilities(response.answers[qid].to_wire())
                expected = question.wire_probabilities(want[qid].to_wire())
                worst = max(worst, *(abs(a - b) for a, b in zip(got, expected, strict=True)))
    print(f"pipelined vs alone (graphs kept: {max_graphs}): max |Δp| {worst}")
    assert worst < 2e-3
    assert pipelined.stats()["prefix_cache"]["hits"] >= 1, "the repeated document found the prefix of its first forward"


def test_cuda_graphs_with_the_prefix_cache(tokenizer):
    model = tiny_model("qwen3", len(tokenizer)).cuda()
    cached = Decider(LoadedModel(model, tokenizer, "tiny"), calibration="raw")
    eager = Decider(
        LoadedModel(model, tokenizer, "tiny"),
        prefix_cache_bytes=0,
        engine=EngineOptions(cuda_graphs=False),
        calibration="raw",
    )
    state = {"turns": ["hello", "my order is late"]}
    for _ in range(3):
        got, want = cached.decide(state, QUESTIONS).answers, eager.decide(state, QUESTIONS).answers
        assert abs(want["n"].p_yes - got["n"].p_yes) < 1e-5
        state = {"turns": [*state["turns"], "still waiting"]}
    assert cached.stats()["prefix_cache"]["hits"] + cached.stats()["prefix_cache"]["partial_hits"] >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_kernels_agree_with_the_models_own(dtype, tokenizer):
    pytest.importorskip("liger_kernel")
    model = tiny_model("qwen3", len(tokenizer)).cuda().to(dtype)
    unfuse_rope(model)  # an earlier test's decider may have swapped the family's rotary
    state = "The parcel is late and the customer is upset."
    # eager: graphs captured on the model would keep the fused decider from joining gate and up (see kernels)
    own = Decider(
        LoadedModel(model, tokenizer, "tiny"),
        engine=EngineOptions(fused_kernels=False, cuda_graphs=False),
        calibration="raw",
    )
    assert own.features.fusion is None
    want = own.decide(state, QUESTIONS).answers  # before fusing: the rotary swap is process-wide
    try:
        fused = Decider(LoadedModel(model, tokenizer, "tiny"), calibration="raw")
        report = fused.features.fusion
        assert report is not None and report.norms > 0 and report.mlps > 0 and report.rope and not report.kept
        assert report.norm_ropes == model.config.num_hidden_layers  # q/k norms and rotary as one kernel
        got = fused.decide(state, QUESTIONS).answers
    finally:
        unfuse_rope(model)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    assert abs(want["n"].p_yes - got["n"].p_yes) < tol
    assert list(want["s"].probabilities) == pytest.approx(list(got["s"].probabilities), abs=tol)
    assert list(want["c"].probabilities.values()) == pytest.approx(list(got["c"].probabilities.values()), abs=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_kernel_equals_torch_kernels(dtype, tokenizer):
    pytest.importorskip("triton")
    model = tiny_model("qwen3", len(tokenizer)).cuda().to(dtype)
    loaded = LoadedModel(model, tokenizer, "tiny")
    kernel = Decider(loaded, prefix_cache_bytes=0, calibration="raw", engine=EngineOptions(attention_kernel=True))
    torch_kernels = Decider(
        loaded, prefix_cache_bytes=0, calibration="raw", engine=EngineOptions(attention_kernel=False)
    )
    assert kernel.features.attention_kernel and not torch_kernels.features.attention_kernel
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for state in ["The parcel is late and the customer is upset.", "A short one."] * 2:  # then replayed
        want, got = torch_kernels.decide(state, QUESTIONS).answers, kernel.decide(state, QUESTIONS).answers
        assert abs(want["n"].p_yes - got["n"].p_yes) < tol
        assert list(want["s"].probabilities) == pytest.approx(list(got["s"].probabilities), abs=tol)
        assert list(want["c"].probabilities.values()) == pytest.approx(list(got["c"].probabilities.values()), abs=tol)


@pytest.mark.parametrize("attention_kernel", [True, False])
@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_requests_batched_in_one_forward_equal_each_alone_in_bfloat16(family, attention_kernel, tokenizer):
    """Batch invariance on the GPU path the server runs (static shapes, fused kernels): several requests answered by
    one forward equal each decided alone within 2e-3 in bfloat16, with the cascade as the one Triton kernel (the
    default) or as torch's kernels. (The gap between the two kinds of kernel is printed, not bounded here.)"""
    model = tiny_model(family, len(tokenizer)).cuda().to(torch.bfloat16)
    loaded = LoadedModel(model, tokenizer, "tiny")
    decider = Decider(loaded, calibration="raw", engine=EngineOptions(attention_kernel=attention_kernel))
    other = Decider(loaded, calibration="raw", engine=EngineOptions(attention_kernel=not attention_kernel))
    assert decider.features.capture and decider.max_batch > 1
    assert decider.features.attention_kernel == attention_kernel
    states = [
        f"Ticket {i}: the customer was charged {i + 2} times and wants the money back." * (1 + i % 3) for i in range(7)
    ]
    requests = [(state, QUESTIONS if i % 2 else {"n": QUESTIONS["n"]}) for i, state in enumerate(states)]
    requests.append(requests[0])  # a document twice in one batch
    worst = {"same kernels": 0.0, "vs the other kernels alone": 0.0}
    for batch in (requests, requests[:2], requests[3:]):
        together = decider.launch_prepared([decider.prepare_request(s, q) for s, q in batch])()
        for (state, questions), response in zip(batch, together, strict=True):
            for label, alone in (("same kernels", decider), ("vs the other kernels alone", other)):
                answers = alone.decide(state, questions).answers
                for qid, question in questions.items():
                    got = question.wire_probabilities(response.answers[qid].to_wire())
                    want = question.wire_probabilities(answers[qid].to_wire())
                    worst[label] = max(worst[label], *(abs(a - b) for a, b in zip(got, want, strict=True)))
    print(f"{family}, attention kernel {attention_kernel}: batched vs alone, max |Δp| {worst}")
    assert worst["same kernels"] < 2e-3, worst


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_a_model_on_the_second_gpu_runs_there_with_the_first_one_current(tokenizer):
    # graphs, streams, events and Triton kernels follow the current device: the engine makes its own current
    state = "The parcel is late and the customer is upset."
    answers = []
    for device in ("cuda:0", "cuda:1"):  # the same weights on each
        torch.cuda.set_device(0)
        model = tiny_model("qwen3", len(tokenizer)).to(device, torch.bfloat16)
        decider = Decider(LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, calibration="raw")
        assert decider.features.capture and decider.features.attention_kernel
        for _ in range(2):  # captured, then replayed
            answers.append(decider.decide(state, QUESTIONS).answers)
        assert torch.cuda.current_device() == 0
    for got in answers[1:]:
        assert abs(got["n"].p_yes - answers[0]["n"].p_yes) < 1e-3
        assert list(got["c"].probabilities.values()) == pytest.approx(
            list(answers[0]["c"].probabilities.values()), abs=1e-3
        )


def test_features_of_forwards_in_flight_are_each_their_own(tokenizer):
    """Features read from captured graphs while later forwards of the same shape are launched (the graph's output
    overwritten by the next replay) equal the eager forward's, each document its own, in float32."""
    from typedlm.runtime.packing import PackedItem
    from typedlm.text.labels import LabelSet

    model = tiny_model("qwen3", len(tokenizer)).cuda()
    graphs, eager = Engine(model, EngineOptions(cuda_graphs=True)), Engine(model, EngineOptions(cuda_graphs=False))
    labels = LabelSet.build([[(5,)], [(9,)], [(10, 11)], [(10, 12)]])
    documents = [
        [([100 + i, 200 + i, 300 + i], [PackedItem([400 + i, 401], labels), PackedItem([500, 501 + i], labels)], None)]
        for i in range(5)
    ]
    launched = [graphs.launch_many(work, keep_prefix=False, features=True) for work in documents]  # all in flight
    for work, in_flight in zip(documents, launched, strict=True):
        masses, rows = in_flight.wait(), in_flight.features()
        alone = eager.launch_many(work, keep_prefix=False, features=True)
        want_masses, want_rows = alone.wait(), alone.features()
        assert torch.allclose(torch.from_numpy(rows[0]), torch.from_numpy(want_rows[0]), atol=1e-4, rtol=1e-4)
        assert max(abs(a - b) for g, w in zip(masses[0], want_masses[0]) for a, b in zip(g, w)) < 1e-5
    assert graphs.stats()["cuda_graphs"]["captures"] == 1  # one shape, replayed five times


def test_a_failed_capture_runs_its_shape_eagerly_and_later_captures_still_work(tokenizer, monkeypatch):
    """A capture that fails (here: a device-wide wait inside it, which CUDA refuses while a stream captures) is
    logged and counted, its request answered by the eager forward, its shape never captured again, also once a
    grown buffer has dropped every slot; the next shape's capture succeeds on the same device."""
    graphs, eager = _graphs_and_eager(tokenizer)
    runner = graphs.engine.forward.runner
    plain_forward = runner.forward

    def failing(slot):
        if torch.cuda.is_current_stream_capturing():
            torch.cuda.synchronize()
        return plain_forward(slot)

    def same_answers(document: str) -> None:
        got, want = graphs.decide(document, QUESTIONS).answers, eager.decide(document, QUESTIONS).answers
        assert abs(want["n"].p_yes - got["n"].p_yes) < 1e-5

    monkeypatch.setattr(runner, "forward", failing)
    for _ in range(2):  # the second request of the same shape runs eagerly, with no capture tried
        same_answers("word " * 300)
    assert graphs.stats()["cuda_graphs"] == {"captures": 0, "held": 1, "capture_failures": 1}
    monkeypatch.setattr(runner, "forward", plain_forward)
    same_answers("word " * 900)  # a longer document: the buffer grows, dropping every slot held, then a capture
    assert graphs.stats()["cuda_graphs"] == {"captures": 1, "held": 1, "capture_failures": 1}
    same_answers("word " * 300)  # the failed shape again: eager, not captured again
    assert graphs.stats()["cuda_graphs"] == {"captures": 1, "held": 2, "capture_failures": 1}


COLD_START = """
import torch
from typedlm.core.options import EngineOptions
from typedlm.core.questions import NoulQuestion
from typedlm.decide.decider import Decider
from typedlm.runtime.models import LoadedModel
from transformers import AutoTokenizer
from tests.conftest import tiny_model

tokenizer = AutoTokenizer.from_pretrained({tokenizer!r})
questions = {{"n": NoulQuestion("Is it about billing?"), "m": NoulQuestion("Is the customer angry?")}}
for family in ("qwen3", "llama"):
    for dtype in (torch.float32, torch.bfloat16):
        model = tiny_model(family, len(tokenizer)).cuda().to(dtype)
        graphs = Decider(LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, calibration="raw")
        eager = Decider(
            LoadedModel(model, tokenizer, "tiny"), prefix_cache_bytes=0, calibration="raw",
            engine=EngineOptions(cuda_graphs=False),
        )
        for state in ("short", "word " * 300, "a longer ticket about a refund " * 40):
            got, want = graphs.decide(state, questions).answers, eager.decide(state, questions).answers
            assert abs(got["n"].p_yes - want["n"].p_yes) < 2e-2, (family, dtype, state[:10])
        # two documents in one forward (the fields of its static inputs at other offsets than one document's)
        pair = ("two at once", "word " * 200)
        together = graphs.launch_prepared([graphs.prepare_request(state, questions) for state in pair])()
        alone = [eager.decide(state, questions) for state in pair]
        for got, want in zip(together, alone):
            assert abs(got.answers["n"].p_yes - want.answers["n"].p_yes) < 2e-2, (family, dtype)
        stats = graphs.stats()["cuda_graphs"]
        assert stats["captures"] >= 4 and stats["capture_failures"] == 0, stats
print("cold start: every capture held")
"""


def test_captures_hold_in_a_fresh_process_with_every_kernel_cache_empty(tokenizer, tmp_path):
    """A new machine's first captures: a fresh process whose Triton and CUDA kernel caches are empty (every kernel
    compiled and loaded for the first time, in the warm-up before each capture) captures every shape, in float32
    and bfloat16, on two families, and answers as the eager forward does."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    tokenizer.save_pretrained(tmp_path / "tokenizer")
    env = {
        **os.environ,
        "TRITON_CACHE_DIR": str(tmp_path / "triton"),
        "CUDA_CACHE_PATH": str(tmp_path / "cuda"),
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    script = COLD_START.format(tokenizer=str(tmp_path / "tokenizer"))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "every capture held" in done.stdout
    # the cascade kernel is compiled once per model and dtype, whatever the documents' and questions' lengths and
    # however many documents share a forward (its row counts and width are not specialised on, and its inputs keep
    # one alignment): a new machine's first long document, or first batched forward, compiles nothing
    variants = list((tmp_path / "triton").rglob("_cascade_kernel.cubin"))
    assert 0 < len(variants) <= 4, [path.parent.name for path in variants]
