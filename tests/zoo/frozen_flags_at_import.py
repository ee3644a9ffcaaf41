"""A spec module that freezes torch's backend flags at import, as torch's own testing helpers do
(``torch.testing._internal.common_utils`` calls ``torch.backends.disable_global_flags()``): from
then on the process refuses direct assignment to cuDNN's flags. Loaded before another --impl
target, it must change nothing about that target's examples or verdicts (tests/test_global_state.py).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

torch.backends.disable_global_flags()


class SquareFrozenFlags(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad_output


register(SquareFrozenFlags, name="square_frozen_flags_module", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x)
