"""The readout: the LM head applied in float32 to the rows that are read, and answer-group masses from it.

`LMHead.logprobs(hidden [R, D])` is the log-softmax over the vocabulary [R, V] in float32 (the head's weights
stay in the model's dtype: a float32 copy of a 151,936-row head would outweigh a small model). `group_masses`
turns each label step's log-probability into the mass of every answer group of every item: a label's
probability is the product of its tokens' conditionals, a group's mass the sum over its labels. `decision_rows`
gives, where asked, each item's hidden state at its decision row (its label tree's root: the row whose head output
holds every label's first token), exactly what the head reads there: a learned readout's features.
"""

from __future__ import annotations

import contextlib
import itertools

import numpy as np
import torch

from typedlm.core.errors import ModelError
from typedlm.runtime.packing import PackedBatch

HEAD_CHUNK_ROWS = 16384  # vocabulary rows of the LM head converted to float32 at a time


class LMHead:
    """The model's output embedding (and bias, and final logit softcap) as log-probabilities in float32."""

    def __init__(self, head: torch.nn.Module | None, softcap: float | None):
        if head is None:
            raise ModelError("the model has no LM head to read answers from")
        self.weight = head.weight.detach()  # [V, D], applied in float32 chunk by chunk (no fp32 copy kept)
        self.bias = None if head.bias is None else head.bias.detach().to(torch.float32)
        self.softcap = softcap
        self.device = self.weight.device

    def logprobs(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [R, D] -> logits: [R, V], float32
        logits = None
        if self.weight.dtype == torch.float32:
            logits = hidden.to(torch.float32) @ self.weight.T
        elif hidden.is_cuda and hidden.dtype == self.weight.dtype:  # accumulated and written in float32
            with contextlib.suppress(RuntimeError, TypeError):  # an older torch without out_dtype: chunks below
                logits = torch.mm(hidden, self.weight.T, out_dtype=torch.float32)
        if logits is None:  # in float32 chunk by chunk: a float32 copy of the head outweighs the model (Qwen3: 622 MB)
            hidden = hidden.to(torch.float32)
            logits = torch.empty(hidden.shape[0], self.weight.shape[0], dtype=torch.float32, device=hidden.device)
            for start in range(0, self.weight.shape[0], HEAD_CHUNK_ROWS):
                chunk = self.weight[start : start + HEAD_CHUNK_ROWS].to(torch.float32)  # [C, D]
                torch.mm(hidden, chunk.T, out=logits[:, start : start + chunk.shape[0]])
        if self.bias is not None:
            logits = logits + self.bias
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return torch.log_softmax(logits, dim=-1)

    def masses(
        self, batch: PackedBatch, hidden: torch.Tensor, features: bool = False
    ) -> tuple[list[list[float]], np.ndarray | None]:
        """Group masses per item from the packed rows' hidden states [N, D]: only read rows meet the head; with
        `features`, each item's decision row too (`decision_rows`), else None."""
        hidden = hidden[torch.tensor(batch.read_rows, device=self.device)]  # [R, D]
        logprobs = self.logprobs(hidden)  # [R, V]
        rows, tokens = (torch.tensor(a, device=self.device) for a in (batch.step_read, batch.step_token))
        masses = group_masses(batch, logprobs[rows, tokens].cpu())
        return masses, decision_rows(batch, hidden) if features else None


def decision_rows(batch: PackedBatch, read_hidden: torch.Tensor) -> np.ndarray:
    """Each item's hidden state at its decision row [items, D] (float32, on the CPU), from the read rows' [R, D]
    (what the head reads: after the final norm)."""
    rows = torch.tensor(batch.first_reads, device=read_hidden.device)
    return read_hidden[rows].to(torch.float32).cpu().numpy()


def group_masses(batch: PackedBatch, steps: torch.Tensor) -> list[list[float]]:
    """Group masses per item from each label step's log-probability [K] (on the CPU)."""
    weights = steps.numpy().astype(np.float64)
    form_logp = np.bincount(batch.step_form, weights, minlength=len(batch.form_group))  # [F]
    group_mass = np.bincount(batch.form_group, np.exp(form_logp), minlength=sum(batch.groups_per_item))  # [G]
    masses, ends = group_mass.tolist(), itertools.accumulate(batch.groups_per_item)
    return [masses[end - n : end] for n, end in zip(batch.groups_per_item, ends)]
