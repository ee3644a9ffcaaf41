"""tinykernels: a small third-party-style Triton kernel package, written for GPUs as kernel
libraries are (Python float scalar arguments, ``libdevice`` math, ``@triton.autotune``), with
nothing in it for the Triton interpreter. The suite must run it on CPU without editing it."""

from tinykernels.ops import GeluTanh, RMSNorm, gelu_tanh, rms_norm

__all__ = ["GeluTanh", "RMSNorm", "gelu_tanh", "rms_norm"]
