"""The cascade kernel equals softmax attention over each row's own key set, computed row by row in float64.

Without a GPU the kernel runs in Triton's interpreter (see conftest); on a GPU, test_gpu runs it compiled.
"""

from __future__ import annotations

import pytest
import torch

from typedlm.ops.kernel_blocks import block_table, block_tokens, capacity

from ..conftest import needs_triton

pytestmark = needs_triton
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (first packed row, rows) of each question, then a padding slot; S = the widest
SEGMENTS = [(0, 9), (9, 20), (29, 3), (0, 0)]
WIDTH = 20
REAL_PACKED = 32  # rows of the questions; the packed rows after them are padding


def row_slot() -> torch.Tensor:
    """[REAL_PACKED]: each packed row's question g and place s in it, as g·S + s."""
    return torch.tensor([g * WIDTH + s for g, (_, n) in enumerate(SEGMENTS) for s in range(n)])


def own_visibility() -> torch.Tensor:
    """[G, S, S]: a chain with one branch per question (a label tree's shape); padding slots see themselves."""
    mask = torch.zeros(len(SEGMENTS), WIDTH, WIDTH, dtype=torch.bool)
    for g, (_, n) in enumerate(SEGMENTS):
        block = torch.ones(n, n, dtype=torch.bool).tril()
        if n > 5:
            block[n - 2, n - 3] = False  # two siblings: the second does not see the first
        mask[g, :n, :n] = block
        mask[g, n:, n:] = torch.eye(WIDTH - n, dtype=torch.bool)
    return mask


def blocks(t: int, p: int, doc_rows: int, packed_rows: int, heads: int, kv_heads: int) -> torch.Tensor:
    """The kernel's block table for one document of t new rows after p cached keys, and the questions."""
    tokens = block_tokens(heads // kv_heads)
    rows = capacity(doc_rows, packed_rows, 1, tokens)
    return torch.from_numpy(block_table([t], [p], [0], [REAL_PACKED], doc_rows, packed_rows, tokens, rows))


def row_by_row(q, k, v, kbuf, vbuf, p, t, doc_rows, mask, scale) -> torch.Tensor:
    """Each row's keys listed explicitly: document row i sees the buffer's [0, p + i]; a question's row sees the
    buffer's [0, p + t) and the rows of its question that `mask` shows it."""
    rows, heads, _ = q.shape
    groups = heads // kbuf.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    where = {doc_rows + start + s: (g, start, s) for g, (start, n) in enumerate(SEGMENTS) for s in range(n)}
    for r in range(rows):
        if r < t:
            keys, values = kbuf[: p + r + 1], vbuf[: p + r + 1]
        elif r in where:
            g, start, s = where[r]
            own = doc_rows + start + torch.nonzero(mask[g, s]).flatten()
            keys, values = torch.cat([kbuf[: p + t], k[own]]), torch.cat([vbuf[: p + t], v[own]])
        else:
            continue  # padding rows: zeros
        for h in range(heads):
            weights = torch.softmax(q[r, h].double() @ keys[:, h // groups].double().T * scale, dim=0)
            out[r, h] = weights @ values[:, h // groups].double()
    return out


@pytest.mark.parametrize(
    "heads, kv_heads, dim",
    [(4, 2, 16), (2, 2, 16), (6, 2, 24), (7, 1, 32)],  # groups 2, 1, 3 (rows padded to 4), 7; a head dim of 24
)
@pytest.mark.parametrize("t, doc_rows", [(37, 40), (0, 0)])  # 3 padding document rows; no new document rows
def test_kernel_equals_attention_row_by_row(heads, kv_heads, dim, t, doc_rows):
    from typedlm.ops.cascade_kernel import cascade_attention

    torch.manual_seed(heads * 100 + dim)
    p, packed_rows, capacity = 5, 36, 64  # 4 padding packed rows
    rows = doc_rows + packed_rows
    q = torch.randn(rows, heads, dim)
    k, v = torch.randn(rows, kv_heads, dim), torch.randn(rows, kv_heads, dim)
    kbuf, vbuf = torch.randn(capacity, kv_heads, dim), torch.randn(capacity, kv_heads, dim)
    kbuf[p:], vbuf[p:] = float("nan"), float("nan")  # past the cached prefix: never read, the document written
    table = blocks(t, p, doc_rows, packed_rows, heads, kv_heads)
    mask = own_visibility()
    on = [x.to(DEVICE) for x in (q, k, v, kbuf, vbuf, table, row_slot(), mask)]
    got = cascade_attention(*on, doc_rows, dim**-0.5).cpu()
    written_k, written_v = on[3].cpu(), on[4].cpu()
    assert torch.equal(written_k[p : p + t], k[:t]) and torch.equal(written_v[p : p + t], v[:t])
    assert torch.isnan(written_k[p + t :]).all()  # nothing past the document's real rows
    want = row_by_row(q, k, v, written_k, written_v, p, t, doc_rows, mask, dim**-0.5)
    assert not torch.isnan(got).any()
    assert torch.allclose(got.double(), want, atol=1e-5)


@pytest.mark.parametrize("layout", ["transposed", "joined"])
def test_kernel_takes_strided_rows(layout):
    """q, k, v as the model hands them over: [1, H, R, D] transposed to [R, H, D] views (no copies); or column
    slices of one joined q/k/v product (keys and values with other row strides than each other's)."""
    from typedlm.ops.cascade_kernel import cascade_attention

    torch.manual_seed(1)
    heads, kv_heads, dim, p, t, doc_rows, packed_rows = 4, 2, 16, 3, 16, 16, 32
    rows = doc_rows + packed_rows
    if layout == "transposed":
        q, k, v = (torch.randn(1, h, rows, dim) for h in (heads, kv_heads, kv_heads))
        q, k, v = (x[0].transpose(0, 1) for x in (q, k, v))
    else:
        joined = torch.randn(rows, (heads + 2 * kv_heads) * dim)
        q, k, v = joined.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1)
        k = k.contiguous()  # as a k norm hands it over
        q, k, v = (x.view(rows, -1, dim) for x in (q, k, v))
        assert k.stride() != v.stride()
    kbuf, vbuf = torch.randn(64, kv_heads, dim), torch.randn(64, kv_heads, dim)
    q, k, v, kbuf, vbuf = (x.to(DEVICE) for x in (q, k, v, kbuf, vbuf))
    args = (
        kbuf,
        vbuf,
        blocks(t, p, doc_rows, packed_rows, heads, kv_heads).to(DEVICE),
        row_slot().to(DEVICE),
        own_visibility().to(DEVICE),
        doc_rows,
        0.25,
    )
    strided = cascade_attention(q, k, v, *args)
    written = kbuf.clone(), vbuf.clone()  # the document rows' keys and values, written by the kernel
    dense = cascade_attention(q.contiguous(), k.contiguous(), v.contiguous(), *args)
    assert torch.equal(strided, dense)
    assert torch.equal(written[0], kbuf) and torch.equal(written[1], vbuf)


@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 2, 16), (7, 1, 24)])
def test_the_engines_probe_passes_here(heads, kv_heads, dim):
    """`kernel_agrees`, which an engine runs before it uses the kernel, compares it with plain attention."""
    from typedlm.ops.attention import kernel_agrees

    assert kernel_agrees(heads, kv_heads, dim, torch.float32, torch.device(DEVICE))


@pytest.mark.parametrize("heads, kv_heads, dim", [(4, 2, 16), (6, 2, 24)])
def test_kernel_takes_several_documents(heads, kv_heads, dim):
    """Several documents in one launch, each with its own buffer range (cached prefix, then its new rows) and its
    own questions: every row equals softmax attention over its own document's keys only, row by row."""
    from typedlm.ops.cascade_kernel import cascade_attention

    torch.manual_seed(7 + heads)
    # per document: new rows t, cached p, its questions' rows (a chain each, the last row a sibling of the one before)
    # the last one's keys: whole blocks of its cached prefix, a block straddling the prefix's end, whole blocks of
    # its own new rows
    documents = [(37, 5, [9, 3]), (0, 12, [4]), (70, 0, [20, 1, 6]), (3, 30, [2]), (150, 70, [5])]
    width, doc_rows, packed_rows = 20, 272, 64
    t_all = sum(t for t, _, _ in documents)
    questions = [(b, n) for b, (_, _, rows) in enumerate(documents) for n in rows]
    real_packed = sum(n for _, n in questions)
    rows = doc_rows + packed_rows
    q = torch.randn(rows, heads, dim)
    k, v = torch.randn(rows, kv_heads, dim), torch.randn(rows, kv_heads, dim)
    starts = [sum(t + p for t, p, _ in documents[:b]) for b in range(len(documents))]
    size = starts[-1] + sum(documents[-1][:2]) + 8
    kbuf, vbuf = (torch.full((size, kv_heads, dim), float("nan")) for _ in range(2))
    for (_, p, _), start in zip(documents, starts):
        kbuf[start : start + p], vbuf[start : start + p] = torch.randn(p, kv_heads, dim), torch.randn(p, kv_heads, dim)
    mask = torch.zeros(len(questions) + 1, width, width, dtype=torch.bool)  # and one padding question
    mask[-1] = torch.eye(width, dtype=torch.bool)
    slots = []
    for g, (_, n) in enumerate(questions):
        mask[g, :n, :n] = torch.ones(n, n, dtype=torch.bool).tril()
        if n > 2:
            mask[g, n - 1, n - 2] = False
        mask[g, n:, n:] = torch.eye(width - n, dtype=torch.bool)
        slots += [g * width + s for s in range(n)]
    tokens = block_tokens(heads // kv_heads)
    table = block_table(
        [t for t, _, _ in documents], [p for _, p, _ in documents], starts, [sum(r) for _, _, r in documents],
        doc_rows, packed_rows, tokens, capacity(doc_rows, packed_rows, len(documents), tokens),
    )  # fmt: skip
    on = [x.to(DEVICE) for x in (q, k, v, kbuf.clone(), vbuf.clone(), torch.from_numpy(table), torch.tensor(slots))]
    got = cascade_attention(*on, mask.to(DEVICE), doc_rows, dim**-0.5).cpu().double()
    written_k = on[3].cpu()
    seen = {}  # row of the forward -> (its keys, its values)
    first, packed, g = 0, doc_rows, 0
    for b, (t, p, own) in enumerate(documents):
        start = starts[b]
        assert torch.equal(written_k[start + p : start + p + t], k[first : first + t])  # written after its prefix
        end = starts[b + 1] if b + 1 < len(documents) else len(written_k)
        assert torch.isnan(written_k[start + p + t : end]).all()  # and nothing else
        keys, values = (
            torch.cat([kbuf[start : start + p], k[first : first + t]]),
            torch.cat([vbuf[start : start + p], v[first : first + t]]),
        )
        for i in range(t):
            seen[first + i] = keys[: p + i + 1], values[: p + i + 1]
        for n in own:
            for s in range(n):
                mine = packed + torch.nonzero(mask[g, s, :n]).flatten()
                seen[packed + s] = torch.cat([keys, k[mine]]), torch.cat([values, v[mine]])
            packed, g = packed + n, g + 1
        first += t
    groups, want = heads // kv_heads, torch.zeros(rows, heads, dim, dtype=torch.float64)
    for r, (keys, values) in seen.items():
        for h in range(heads):
            weights = torch.softmax(q[r, h].double() @ keys[:, h // groups].double().T * dim**-0.5, dim=0)
            want[r, h] = weights @ values[:, h // groups].double()
    real = torch.zeros(rows, dtype=torch.bool)
    real[list(seen)] = True
    assert real.sum() == t_all + real_packed
    assert torch.allclose(got[real], want[real], atol=1e-5)
    assert (got[~real] == 0).all()  # padding rows are written as zeros


def test_a_question_reads_the_same_sums_whether_its_document_is_cached_or_new():
    """The keys of a document are summed in blocks counted from its range's start, wherever its cached part ends:
    its questions' rows come out bit for bit the same when the document is computed in this forward (its keys
    read from this forward's rows) and when it is cached (read from the buffer), alone or after another
    document. This is what makes a batched request equal to it alone, and a prefix-cache hit equal to a miss."""
    from typedlm.ops.cascade_kernel import cascade_attention

    torch.manual_seed(3)
    heads, kv_heads, dim, p, t = 4, 2, 16, 45, 50
    tokens = block_tokens(heads // kv_heads)
    q_doc, q_packed = torch.randn(t, heads, dim), torch.randn(REAL_PACKED, heads, dim)
    k_doc, v_doc = torch.randn(t, kv_heads, dim), torch.randn(t, kv_heads, dim)
    k_packed, v_packed = torch.randn(REAL_PACKED, kv_heads, dim), torch.randn(REAL_PACKED, kv_heads, dim)
    prefix_k, prefix_v = torch.randn(p, kv_heads, dim), torch.randn(p, kv_heads, dim)
    mask, slots = own_visibility().to(DEVICE), row_slot().to(DEVICE)

    def run(cached: bool, before: int) -> torch.Tensor:
        """The document's questions, the document cached or new, its range after `before` keys of another's."""
        doc_rows = 0 if cached else t
        q = torch.cat([q_packed] if cached else [q_doc, q_packed])
        k = torch.cat([k_packed] if cached else [k_doc, k_packed])
        v = torch.cat([v_packed] if cached else [v_doc, v_packed])
        kbuf, vbuf = torch.randn(before + p + t + 8, kv_heads, dim), torch.randn(before + p + t + 8, kv_heads, dim)
        kbuf[before : before + p], vbuf[before : before + p] = prefix_k, prefix_v
        if cached:
            kbuf[before + p : before + p + t], vbuf[before + p : before + p + t] = k_doc, v_doc
        length, new = (p + t, 0) if cached else (p, t)
        table = block_table(
            [new], [length], [before], [REAL_PACKED], doc_rows, REAL_PACKED, tokens,
            capacity(doc_rows, REAL_PACKED, 1, tokens),
        )  # fmt: skip
        on = [x.to(DEVICE) for x in (q, k, v, kbuf, vbuf, torch.from_numpy(table))]
        return cascade_attention(*on, slots, mask, doc_rows, dim**-0.5)[doc_rows:].cpu()

    new = run(cached=False, before=0)
    assert torch.equal(run(cached=True, before=0), new)
    assert torch.equal(run(cached=True, before=70), new)
    assert torch.equal(run(cached=False, before=33), new)
