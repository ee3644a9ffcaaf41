"""A spec module that turns grad mode off at import (a notebook habit: "inference only").

Loaded before another --impl target, it must change nothing about that target's examples or
verdicts: every evaluation runs under the suite's pinned state (tests/test_global_state.py).
"""

from __future__ import annotations

from typing import Any

import torch

from conformance import Tensor, register

torch.set_grad_enabled(False)


class CubeGradOff(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x * x

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 3 * x * x * grad_output


register(CubeGradOff, name="cube_grad_off_module", inputs=[Tensor("x", "*batch n")], reference=lambda x: x * x * x)
