"""The engine's feature switches as asked for: one object, passed from the command line, `Decider.load`, the
benchmarks and the tests down to the runtime, which resolves it once at load (`typedlm.runtime.features`).

None means "decide for this machine and model" (the default for each switch):

- `cuda_graphs`: replay each request's forward as a CUDA graph with static shapes (auto: on CUDA, where
  the model runs document and questions in one forward); True on a CPU runs the static path eagerly (tests);
- `fused_kernels`: swap the layers' norms, SwiGLU products and rotary embeddings for fused Triton kernels
  (auto: on CUDA, where liger-kernel is installed; each kept only where it agrees with the model's own);
- `attention_kernel`: run the static forward's attention as one Triton launch per layer (auto: on CUDA for
  16-bit models, with Triton, where the kernel agrees with plain attention on a probe of the model's shapes;
  off when `fused_kernels` is False); True on a CPU runs it in Triton's interpreter (tests);
- `cascade`: attention as the cascade (the shared prefix and each question's own rows apart, merged exactly);
  False runs one masked attention per layer over everything (a reference for tests).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineOptions:
    cuda_graphs: bool | None = None
    fused_kernels: bool | None = None
    attention_kernel: bool | None = None
    cascade: bool = True
