"""The cascade kernel equals softmax attention over each row's own key set, computed row by row in float64.

Without a GPU the kernel runs in Triton's interpreter (see conftest); on a GPU, test_gpu runs it compiled.
"""

from __future__ import annotations

import pytest
import torch

from .conftest import needs_triton

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
    cu = torch.tensor([0, t, 0, p + t, 0, packed_rows, REAL_PACKED, 0], dtype=torch.int32)
    mask = own_visibility()
    on = [x.to(DEVICE) for x in (q, k, v, kbuf, vbuf, cu, row_slot(), mask)]
    got = cascade_attention(*on, doc_rows, dim**-0.5).cpu()
    written_k, written_v = on[3].cpu(), on[4].cpu()
    assert torch.equal(written_k[p : p + doc_rows], k[:doc_rows]) and torch.equal(
        written_v[p : p + doc_rows], v[:doc_rows]
    )
    assert torch.isnan(written_k[p + doc_rows :]).all()  # nothing past the document's rows
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
    cu = torch.tensor([0, t, 0, p + t, 0, packed_rows, REAL_PACKED, 0], dtype=torch.int32)
    q, k, v, kbuf, vbuf = (x.to(DEVICE) for x in (q, k, v, kbuf, vbuf))
    args = (
        kbuf,
        vbuf,
        cu.to(DEVICE),
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
