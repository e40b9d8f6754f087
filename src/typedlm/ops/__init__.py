"""Tensor operations, with no model and no transformers: the cascade attention's math (torch's kernels and a
plain reference), its one-launch Triton kernel, the fused RMSNorm / SwiGLU kernels, and the table of fused
operations (`fused`) that `typedlm.runtime.patching` swaps into a model where they agree with its own.

Torch and Triton only; imports nothing else of typedlm's.
"""
