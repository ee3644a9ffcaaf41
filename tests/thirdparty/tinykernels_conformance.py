"""The conformance spec a user of ``tinykernels`` writes: the package is imported as installed,
never edited. Run with ``pytest conformance --impl=tests/thirdparty/tinykernels_conformance.py``
(``tests/thirdparty`` on the path, as an installed package would be)."""

import torch

import tinykernels
from conformance import Scalar, Tensor, register
from tinykernels import ops

# Kernels accumulate in float32: float64 is not a supported dtype, so gradcheck is n/a.
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

register(
    tinykernels.RMSNorm,
    name="tinykernels_rms_norm",
    inputs=[Tensor("x", "*batch d"), Tensor("weight", "d"), Scalar("eps", 1e-6)],
    reference=lambda x, weight, eps: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight,
    dtypes=DTYPES,
    double_backward=False,
    autotune=ops._rms_fwd,
    max_elements=128,
    max_examples=4,
    waivers={"unneeded_grads": "one kernel computes grad_x and the weight partials together"},
)

register(
    tinykernels.GeluTanh,
    name="tinykernels_gelu_tanh",
    inputs=[Tensor("x", "*batch n")],
    reference=lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    dtypes=DTYPES,
    double_backward=False,
    max_elements=128,
    max_examples=4,
)
