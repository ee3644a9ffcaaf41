"""Run typical Triton kernel libraries under the Triton interpreter (CPU) without editing them.

The interpreter (``TRITON_INTERPRET=1``) executes kernels with numpy. Kernel libraries written
for GPUs trip over four of its gaps, and it is slow where it need not be; :func:`install` closes the
gaps and cuts that cost, process-wide:

* ``triton.language.extra.libdevice`` functions are stubs returning ``None`` under the
  interpreter: the common float functions (``rsqrt``, ``tanh``, ``exp``, ``pow``, ``erf``, ...)
  get numpy implementations, shaped as Triton shapes them (a scalar in, a scalar out: a kernel
  stores ``libdevice.rsqrt(var)`` through a scalar pointer). A kernel calling one without a
  fallback raises :class:`InterpreterLimit` naming it, which the suite reports as "not run here".
* ``@triton.autotune`` benchmarks its configs, which needs a GPU driver: under the interpreter
  an autotuned kernel runs its first config (or the one :func:`pinned_config` chooses; specs that
  declare ``register(..., autotune=kernel)`` check every config, one test id each).
* bfloat16: the interpreter converts float32 to bfloat16 by truncation (numpy has no bfloat16),
  so a launch with a bfloat16 tensor raises :class:`InterpreterLimit` instead of computing
  silently wrong values.
* Overflow: numpy warns where a GPU kernel silently gives inf; launches run with its
  floating-point warnings off.
* Python float kernel arguments (``eps``) reach the kernel as Python floats, so ``eps.to(...)``
  fails ("'float' object has no attribute 'to'"): they become float32 scalars, as a compiled
  kernel receives them.
* Speed: a ``@triton.jit`` helper called inside a launch does not patch triton.language again,
  once per program, when the launch already did (a quarter of the reference kernels' time);
  without CUDA, triton.language stays patched after the first launch instead of being patched
  and restored around each one (a tenth); the numpy dtype of each Triton type is looked up once.

The pytest plugin calls :func:`install` before importing ``--impl`` modules when it chose the
interpreter. Import this module freely: it imports triton only inside its functions.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from conformance.engine.code_reach import reaches_once
from conformance.spec.autotune import autotuned_configs, describe_config
from conformance.spec.targets import OpAdapter

__all__ = [
    "LIBDEVICE_FALLBACKS",
    "InterpreterLimit",
    "autotuned_configs",
    "choose_interpreter",
    "describe_config",
    "install",
    "installed",
    "interpreter_limit",
    "interpreting",
    "pinned_config",
    "runs_interpreted",
    "uses_triton",
]


class InterpreterLimit(RuntimeError):
    """Something the Triton interpreter cannot run faithfully (a libdevice function without a
    fallback, bfloat16): the suite skips the example as "not run here", never fails it."""


def interpreter_limit(error: BaseException | None) -> InterpreterLimit | None:
    """The :class:`InterpreterLimit` in ``error``'s cause/context chain, if any."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, InterpreterLimit):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def interpreting() -> bool:
    """Whether Triton kernels decorated now run under the interpreter (``TRITON_INTERPRET=1``)."""
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def runs_interpreted(op: OpAdapter, device: str) -> bool:
    """Whether the target ``op`` runs Triton kernels under the interpreter on ``device``
    (milliseconds per launched program: such Functions take 5-30x as long)."""
    return device == "cpu" and interpreting() and uses_triton(op)


def uses_triton(op: OpAdapter) -> bool:
    """Whether the target launches Triton kernels: its own code (forward, backward, a custom op's
    kernels, and the helpers, modules and objects of the user's they name) reaches a kernel, an
    autotuner or the ``triton`` package. A plain Function defined next to Triton kernels does not.
    Where the code is too dynamic to follow (:mod:`conformance.engine.code_reach`), the answer is
    its module's: whether a Triton object is among the module's globals."""
    reached = reaches_once(op.function, lambda: op.user_code().values(), _is_triton)
    return _module_uses_triton(op.module) if reached is None else reached


def _is_triton(value: object) -> bool:
    import inspect

    if inspect.ismodule(value):
        return value.__name__.split(".")[0] == "triton"
    return any(kind.__module__.startswith("triton.") for kind in type(value).__mro__[:-1])  # a KernelInterface subclass too


def _module_uses_triton(module_name: str) -> bool:
    import sys

    module = sys.modules.get(module_name, None)
    return module is not None and any(_is_triton(value) for value in vars(module).values())


def _numpy_fallbacks() -> dict[str, Callable[..., Any]]:
    import numpy as np

    def rsqrt(x: Any) -> Any:
        return 1.0 / np.sqrt(x)

    def rcp(x: Any) -> Any:
        return 1.0 / x

    def exp10(x: Any) -> Any:
        return np.power(10.0, x)

    def rcbrt(x: Any) -> Any:
        return 1.0 / np.cbrt(x)

    def erf(x: Any) -> Any:
        return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x

    def erfc(x: Any) -> Any:
        return np.vectorize(math.erfc, otypes=[x.dtype])(x) if x.size else x

    return {
        "rsqrt": rsqrt, "sqrt": np.sqrt, "cbrt": np.cbrt, "rcbrt": rcbrt,
        "exp": np.exp, "exp2": np.exp2, "exp10": exp10, "expm1": np.expm1,
        "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
        "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
        "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
        "atanh": np.arctanh, "erf": erf, "erfc": erfc,
        "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint, "nearbyint": np.rint,
        "abs": np.abs, "fabs": np.abs, "rcp": rcp,
        "fast_expf": np.exp, "fast_logf": np.log, "fast_log2f": np.log2, "fast_exp10f": exp10,
        "fast_sinf": np.sin, "fast_cosf": np.cos, "fast_tanf": np.tan, "fast_powf": np.power,
        "fast_dividef": np.divide, "div_rn": np.divide, "div_rz": np.divide, "div_rd": np.divide, "div_ru": np.divide,
        "pow": np.power, "powf": np.power, "atan2": np.arctan2, "hypot": np.hypot, "fmod": np.fmod,
        "copysign": np.copysign, "fmax": np.fmax, "fmin": np.fmin, "fdim": lambda x, y: np.maximum(x - y, 0),
        "fma": lambda x, y, z: x * y + z,
    }


# The libdevice functions install() implements (numpy, in the dtype of the first tensor argument).
LIBDEVICE_FALLBACKS: tuple[str, ...] = (
    "rsqrt", "sqrt", "cbrt", "rcbrt", "exp", "exp2", "exp10", "expm1", "log", "log2", "log10", "log1p",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
    "floor", "ceil", "trunc", "rint", "nearbyint", "abs", "fabs", "rcp",
    "fast_expf", "fast_logf", "fast_log2f", "fast_exp10f", "fast_sinf", "fast_cosf", "fast_tanf", "fast_powf",
    "fast_dividef", "div_rn", "div_rz", "div_rd", "div_ru",
    "pow", "powf", "atan2", "hypot", "fmod", "copysign", "fmax", "fmin", "fdim", "fma",
)


def _interpreted_call(name: str, numpy_fn: Callable[..., Any]) -> Callable[..., Any]:
    """A libdevice stand-in: numpy on the interpreter tensors' data, shaped as Triton shapes an
    elementwise call (a scalar if every argument is one, else the arguments' broadcast block), in
    the dtype of the first tensor argument (Python numbers only: the dtype Triton gives the first)."""
    import numpy as np
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle, interpreter_semantic

    def call(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("_semantic", None)
        if kwargs or not args:
            raise TypeError(f"libdevice.{name}() takes positional arguments only, got {len(args)} and {sorted(kwargs)}")
        values = [a.value if isinstance(a, tl.constexpr) else a for a in args]
        tensors = [a for a in values if isinstance(a, tl.core.tensor)]
        if any(not isinstance(a, (tl.core.tensor, int, float)) for a in values):
            raise TypeError(f"libdevice.{name}() takes tensors and numbers, got {[type(a).__name__ for a in values]}")
        first = tensors[0] if tensors else interpreter_semantic.to_tensor(values[0])  # all Python: as Triton types it
        scalar, dtype = first.type.scalar, first.handle.data.dtype
        blocks = [a.type.shape if isinstance(a, tl.core.tensor) and a.type.is_block() else () for a in values]
        shape = _broadcast_block_shape(name, [tuple(b) for b in blocks])
        # An interpreter scalar holds a one-element array: made 0-d, it broadcasts as a scalar.
        # Python numbers take the result's dtype (exact in float64, whatever the kernel's intent).
        data = [_block_or_scalar_data(a) if isinstance(a, tl.core.tensor) else np.asarray(a, dtype=dtype) for a in values]
        try:
            with np.errstate(all="ignore"):
                result = np.broadcast_to(np.asarray(numpy_fn(*data)).astype(dtype, copy=False), shape)
        except Exception as error:  # the fallback's gap, not the kernel's: the kernel is not run here
            types = [str(getattr(a, "type", a)) for a in values]
            raise InterpreterLimit(
                f"the interpreter fallback for libdevice.{name} cannot run on {types} "
                f"({type(error).__name__}: {error}); run on a GPU to check this kernel"
            ) from error
        if not shape:  # a scalar, held as the interpreter holds scalars
            return tl.core.tensor(TensorHandle(np.array(result).reshape((1,)), scalar), scalar)
        return tl.core.tensor(TensorHandle(np.ascontiguousarray(result), scalar), tl.block_type(scalar, list(shape)))

    call.__name__ = name
    return call


def _block_or_scalar_data(value: Any) -> Any:
    return value.handle.data if value.type.is_block() else value.handle.data.reshape(())


def _broadcast_block_shape(name: str, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The block shape Triton broadcasts ``shapes`` to (``()``: all scalars); numpy's rules, with
    Triton's error for incompatible blocks (the kernel's mistake: a compiled kernel fails too)."""
    rank = max((len(s) for s in shapes), default=0)
    result = [1] * rank
    for shape in shapes:
        for i, size in enumerate((1,) * (rank - len(shape)) + shape):
            if size != 1 and result[i] not in (1, size):
                raise ValueError(
                    f"libdevice.{name}: Cannot make_shape_compatible: incompatible dimensions at index {i}: "
                    f"{result[i]} and {size}"
                )
            result[i] = size if size != 1 else result[i]
    return tuple(result)


def _unsupported(name: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        raise InterpreterLimit(
            f"libdevice.{name} has no fallback under the Triton interpreter (conformance.engine.triton_interpreter "
            f"implements {', '.join(LIBDEVICE_FALLBACKS[:8])}, ...); run on a GPU to check this kernel"
        )

    call.__name__ = name
    return call


_LOCK = threading.Lock()
_INSTALLED: dict[str, bool] = {"done": False}


def installed() -> bool:
    """Whether :func:`install` has patched triton in this process."""
    return _INSTALLED["done"]


def choose_interpreter(cuda_available: bool) -> None:
    """Without CUDA, Triton kernels run only under the interpreter, which must be chosen before any
    @triton.jit function is decorated (before the ``--impl`` modules are imported), and patched
    (:func:`install`) before a kernel runs: the plugin, ``check()`` and every repro script do this."""
    if cuda_available:
        return
    os.environ.setdefault("TRITON_INTERPRET", "1")
    if importlib.util.find_spec("triton") is not None:
        install()  # libdevice fallbacks, autotune without a driver, bfloat16 refused


def install() -> bool:
    """Patch triton for the interpreter (libdevice fallbacks, autotune without a driver, a
    clear error for bfloat16); idempotent. Returns False (and does nothing) when triton is not
    importable or kernels are not interpreted (``TRITON_INTERPRET`` unset)."""
    with _LOCK:
        if _INSTALLED["done"]:
            return True
        try:
            import triton
            from triton import knobs
        except ImportError:
            return False
        if not knobs.runtime.interpret:
            return False
        _patch_libdevice()
        _patch_float_arguments()
        _patch_autotune(triton)
        _patch_launches()
        _patch_bfloat16_casts()
        _patch_device_function_calls()
        _patch_numpy_dtypes()
        _INSTALLED["done"] = True
        return True


def _patch_numpy_dtypes() -> None:
    """Speed only: the interpreter's ``_get_np_dtype`` builds its table of twenty numpy dtypes on
    every call, several times per operation of every program (2-4% of an interpreted contract's
    time); its answer per Triton scalar type is kept instead."""
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._get_np_dtype
    known: dict[str, Any] = {}

    def get_np_dtype(tt_dtype: Any) -> Any:
        scalar = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
        key = "*" if isinstance(scalar, tl.pointer_type) else getattr(scalar, "name", None)
        if not isinstance(key, str):
            return original(tt_dtype)
        found = known.get(key)
        if found is None:
            found = known[key] = original(scalar)
        return found

    interpreter._get_np_dtype = get_np_dtype


def _patch_libdevice() -> None:
    import inspect

    import triton.language.extra.libdevice as libdevice

    fallbacks = _numpy_fallbacks()
    modules = [libdevice]
    with contextlib.suppress(ImportError):
        import triton.language.extra.cuda.libdevice as cuda_libdevice

        modules.append(cuda_libdevice)
    for module in modules:
        for name, member in list(vars(module).items()):
            if name.startswith("_") or not inspect.isfunction(member):
                continue
            if getattr(member, "__module__", "") != module.__name__:
                continue
            replacement = _interpreted_call(name, fallbacks[name]) if name in fallbacks else _unsupported(name)
            setattr(module, name, replacement)


def _patch_float_arguments() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    original = interpreter._implicit_cvt

    def convert(arg: Any) -> Any:
        if isinstance(arg, float):  # natively a float argument is an fp32 scalar (mangle_type: "fp32")
            return tl.tensor(interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
        return original(arg)

    interpreter._implicit_cvt = convert


# The config index each autotuned kernel is pinned to (by id of the Autotuner); default 0.
_PINNED: dict[int, int] = {}


def _patch_autotune(triton: Any) -> None:
    from triton.runtime.autotuner import Autotuner

    original_run = Autotuner.run

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        if len(self.configs) <= 1:
            return original_run(self, *args, **kwargs)
        index = _PINNED.get(id(self), 0)
        configs = self.configs
        self.configs = [configs[index]]  # one config: Autotuner.run launches it without benchmarking
        try:
            return original_run(self, *args, **kwargs)
        finally:
            self.configs = configs

    Autotuner.run = run


def _patch_launches() -> None:
    """Every launch: a bfloat16 tensor argument raises :class:`InterpreterLimit`, and numpy's
    floating-point warnings are off (a kernel overflows to inf silently on a GPU; numpy warned
    "overflow encountered in multiply" into the report of every extreme-value test)."""
    import numpy as np
    import torch
    from triton.runtime import interpreter

    original_call = interpreter.GridExecutor.__call__

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        for value in (*args, *kwargs.values()):
            if isinstance(value, torch.Tensor) and value.dtype == torch.bfloat16:
                raise InterpreterLimit(
                    "a bfloat16 tensor reached a kernel under the Triton interpreter, which truncates float32 to "
                    "bfloat16 instead of rounding (numpy has no bfloat16): its results would be silently wrong; "
                    "check bfloat16 on a GPU"
                )
        with np.errstate(all="ignore"):
            return original_call(self, *args, **kwargs)

    interpreter.GridExecutor.__call__ = call


def _patch_bfloat16_casts() -> None:
    """A cast to or from bfloat16 inside a kernel raises :class:`InterpreterLimit`: the interpreter
    truncates float32 to bfloat16 and casts other dtypes bit by bit (float64 1.0 became 9e-41), so a
    kernel keeping partial sums in bfloat16 got garbage that the suite blamed on its backward."""
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder

    def refusing(original: Callable[..., Any]) -> Callable[..., Any]:
        def cast(self: Any, src: Any, dst_type: Any, *rest: Any) -> Any:
            if tl.bfloat16 in (src.dtype.scalar, dst_type.scalar):
                raise InterpreterLimit(
                    f"a kernel casts {src.dtype.scalar} to {dst_type.scalar} under the Triton interpreter, which "
                    "truncates or reinterprets instead of rounding (numpy has no bfloat16): its results would be "
                    "silently wrong; check it on a GPU"
                )
            return original(self, src, dst_type, *rest)

        return cast

    builder.cast_impl = refusing(builder.cast_impl)
    builder.create_fp_to_fp = refusing(builder.create_fp_to_fp)


# The triton.language modules the running launch patched (an empty tuple between launches).
_PATCHED_LANGS: dict[str, tuple[Any, ...]] = {"langs": ()}
# The language modules patched for the rest of the process (only where no native launch can happen).
_KEPT_PATCHED: list[Any] = []


def _patch_device_function_calls() -> None:
    """Speed only, two costs of the interpreter's per-call patching of triton.language
    (``inspect.getmembers`` over four modules, a new wrapper per builtin, all restored after):

    * a ``@triton.jit`` helper called inside a launch that already patched its language modules
      goes straight to the helper (the interpreter patches again once per program); any other call
      (another module's language, no launch running) keeps the interpreter's path;
    * without CUDA, where nothing in the process can compile a kernel natively (the only code that
      calls the builtins unpatched), a module once patched stays patched: each later launch skips
      the patching and its restore (a tenth of the reference kernels' time). With CUDA each launch
      patches and restores, as the interpreter does."""

    import torch
    from triton.runtime import interpreter

    if not all(hasattr(interpreter, name) for name in ("_patch_lang", "_LangPatchScope", "InterpretedFunction", "InterpreterError")):
        return  # another interpreter layout: leave it as it is
    original_patch = interpreter._patch_lang
    original_call = interpreter.InterpretedFunction.__call__
    keep_patched = not torch.cuda.is_available()

    def languages(fn: Any) -> tuple[Any, ...]:
        # Asked at every launch: identity tests over the kernel module's globals (inspect.ismodule on
        # each value cost 0.3% of the default run).
        found = fn.__globals__.values()
        return tuple(lang for lang in (interpreter.tl, interpreter.tl.core) if any(value is lang for value in found))

    def patch_lang(fn: Any) -> Any:
        langs = languages(fn)
        if not keep_patched:
            scope = original_patch(fn)
            undo = scope.restore
        elif any(lang not in _KEPT_PATCHED for lang in langs):
            original_patch(fn)  # its scope is never restored
            _KEPT_PATCHED.extend(lang for lang in langs if lang not in _KEPT_PATCHED)
            scope, undo = interpreter._LangPatchScope(), None
        else:
            scope, undo = interpreter._LangPatchScope(), None
        before = _PATCHED_LANGS["langs"]
        _PATCHED_LANGS["langs"] = (*before, *langs)

        def restore_and_forget() -> None:
            _PATCHED_LANGS["langs"] = before
            if undo is not None:
                undo()

        scope.restore = restore_and_forget
        return scope

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        patched = _PATCHED_LANGS["langs"]
        if not patched or any(lang not in patched for lang in languages(self.fn)):
            return original_call(self, *args, **kwargs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as error:
            raise interpreter.InterpreterError(repr(error)) from error

    interpreter._patch_lang = patch_lang
    interpreter.InterpretedFunction.__call__ = call


@contextlib.contextmanager
def pinned_config(kernel: Any, index: int) -> Iterator[None]:
    """Run ``kernel`` (an ``@triton.autotune`` kernel) with its config ``index`` only, natively or
    interpreted: the autotuner sees one config and launches it without benchmarking."""
    configs = autotuned_configs(kernel)
    if not 0 <= index < len(configs):
        raise IndexError(f"config {index} of {len(configs)}")
    previous_pin = _PINNED.get(id(kernel))
    _PINNED[id(kernel)] = index
    kernel.configs = [configs[index]]
    cache = dict(getattr(kernel, "cache", {}))
    try:
        yield
    finally:
        kernel.configs = configs
        if hasattr(kernel, "cache"):
            kernel.cache.clear()
            kernel.cache.update(cache)
        if previous_pin is None:
            _PINNED.pop(id(kernel), None)
        else:
            _PINNED[id(kernel)] = previous_pin
