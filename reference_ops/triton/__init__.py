"""Triton reference Functions: registered only when Triton is importable.

Without a GPU the kernels run under the Triton interpreter, which has to be chosen
(``TRITON_INTERPRET=1``) before this package is imported; the pytest plugin does that on
machines without CUDA. Without Triton this package registers nothing and imports cleanly.
"""

from __future__ import annotations

__all__: list[str] = []

try:
    import triton  # noqa: F401
except ImportError:  # the optional extra is not installed: register nothing
    pass
else:
    # Outside the try: an error in a kernel module itself must fail loudly.
    from reference_ops.triton import custom_op, elementwise, norms, softmax
    from reference_ops.triton._common import interpreted

    __all__ = ["custom_op", "elementwise", "norms", "softmax"]
    if not interpreted(softmax._softmax_fwd):
        # Interpreted, flash attention alone takes ~105 s of the default run (measured, 2 cores):
        # there it is checked with --impl=reference_ops.triton.flash_attention (tests do so).
        from reference_ops.triton import flash_attention

        __all__ += ["flash_attention"]
