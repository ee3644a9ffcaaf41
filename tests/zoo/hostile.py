"""Functions that try to take the run down: hangs, process exits, a segfault, a signal blocked
around a native-style hang. Each must fail its tests with a clear message while the rest of the
run (a correct Function beside them) goes on. tests/test_hostile.py runs them with a short
--example-timeout, serially under --isolate and under -n 2.

Each hostile act happens only for inputs that require grad, so a backward hang is reached.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time
from typing import Any

import torch

from conformance import Tensor, register


def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


class _Doubling(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x * 2

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output * 2


class HangsInForward(_Doubling):
    """Waits for a lock nobody releases (a sleep loop here)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        while True:
            time.sleep(0.01)


class HangsInBackward(_Doubling):
    """Spins forever in backward (a convergence loop whose exit condition is never met)."""

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        residual = 1.0
        while residual > 0:
            residual = residual * 0.5 + 1e-300
        return grad_output * 2


class HangsNatively(_Doubling):
    """Stands in for a hang in native code (a wedged kernel): signals never reach Python, so
    only the hard deadline can end it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        while True:
            pass


class ExitsInBackward(_Doubling):
    """Calls os._exit (a C library calling exit() on an error path does the same)."""

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        os._exit(3)


class SegfaultsInForward(_Doubling):
    """Reads address 0 (an out-of-bounds kernel read does the same)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctypes.string_at(0)
        return x * 2


class CallsSysExit(_Doubling):
    """Calls sys.exit in backward "on unsupported input"."""

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> torch.Tensor:
        sys.exit("unsupported input")


class RaisesKeyboardInterrupt(_Doubling):
    """Raises KeyboardInterrupt itself (to abort a long computation)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        raise KeyboardInterrupt


for _fn, _name in (
    (HangsInForward, "hangs_in_forward"),
    (HangsInBackward, "hangs_in_backward"),
    (HangsNatively, "hangs_natively"),
    (ExitsInBackward, "exits_in_backward"),
    (SegfaultsInForward, "segfaults_in_forward"),
    (CallsSysExit, "calls_sys_exit"),
    (RaisesKeyboardInterrupt, "raises_keyboard_interrupt"),
):
    register(_fn, name=_name, inputs=[Tensor("x", "*batch n")], reference=_double, devices=("cpu",))
