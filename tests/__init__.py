import os

import torch

# Without a GPU, Triton kernels (typedlm.ops.cascade_kernel) run in Triton's interpreter on CPU tensors. The choice is
# read when Triton defines its own kernels, so it is made here, before anything imports Triton.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
