"""Repro scripts: a failing example replayed as a standalone ``python repro.py``.

While a property runs, every ``data.draw`` of the contract check is recorded (label and value).
When the test fails, the draws of the failing example are written as Python source into a
script that loads the spec, rebuilds the same :class:`~strategies.cases.Case` values and runs
the *same* contract check once through :func:`conformance.engine.replay.replay` -- so the script
fails with the contract's own message and numbers (second order for gradgradcheck, both layouts
for layouts, ...) and passes once the Function is fixed.

This module records and writes; :mod:`conformance.engine.replay` (above the runner) replays.
``Case`` and the recipe classes (``TensorRecipe``, ``MaskRecipe``, ...) are re-exported here so a
script needs nothing else.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from conformance.engine.report import ContractFailure
from conformance.spec import Spec
from strategies.cases import Case
from strategies.recipes import (
    AdditiveMaskRecipe,
    DerivedRecipe,
    IndexRecipe,
    MaskRecipe,
    OffsetsRecipe,
    Recipe,
    ScalarRecipe,
    TensorRecipe,
)

RECIPE_CLASSES = (TensorRecipe, MaskRecipe, AdditiveMaskRecipe, IndexRecipe, ScalarRecipe, OffsetsRecipe, DerivedRecipe)

__all__ = [
    "RECIPE_CLASSES",
    "AdditiveMaskRecipe",
    "Case",
    "DerivedRecipe",
    "DrawRecorder",
    "IndexRecipe",
    "MaskRecipe",
    "OffsetsRecipe",
    "ReplayData",
    "ReplayExhausted",
    "ReplayMismatch",
    "ReproUnavailable",
    "ScalarRecipe",
    "TensorRecipe",
    "attach_script",
    "script_name",
    "to_source",
    "torch_only_script",
    "write_script",
]


class ReproUnavailable(Exception):
    """A drawn value has no Python source form (the failure report keeps the inline snippet)."""


class ReplayMismatch(Exception):
    """The contract check asked for other draws than the script recorded (the suite changed)."""


class ReplayExhausted(ReplayMismatch):
    """The check went past the point where the example failed and wants draws the failing run
    never made: every check the failing run made now holds."""


try:  # Hypothesis internals: without them every draw goes through data.draw, as it always did
    from hypothesis.control import should_note
    from hypothesis.internal.observability import observability_enabled
except ImportError:  # pragma: no cover
    def should_note() -> bool:
        return True

    def observability_enabled() -> bool:
        return True


class DrawRecorder:
    """Wraps Hypothesis' ``data`` object; records ``(label, value)`` of every draw.

    While Hypothesis generates and shrinks, a draw goes straight to the test case's choice data
    (``data.conjecture_data``): the same choices and spans, without ``data.draw``'s bookkeeping
    per draw -- two copies of the ``random`` module's state to catch strategies that use it
    (none of the suite's do), ~15-20 us a draw. The final run of a failing example, and any run
    Hypothesis observes, draws through ``data.draw``, which notes each drawn value for the report."""

    def __init__(self, data: Any) -> None:
        self._data = data
        self._choices = getattr(data, "conjecture_data", None)
        self.draws: list[tuple[str | None, Any]] = []

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        if self._choices is None or should_note() or observability_enabled():
            value = self._data.draw(strategy, label=label)
        else:
            value = self._choices.draw(strategy)
        self.draws.append((label, value))
        return value

    @property
    def conjecture_data(self) -> Any:
        """The test case's choice data behind the draws (None outside Hypothesis' engine)."""
        return self._choices

    def record(self, value: Any, label: str | None = None) -> None:
        """Record ``value`` as drawn, without drawing: a value the caller knows the draw would give
        (a simplest example's case, kept from an earlier test: :mod:`conformance.engine.simplest`)."""
        self.draws.append((label, value))


class ReplayData:
    """Stands in for Hypothesis' ``data``: hands back recorded draws, in order, checking labels."""

    def __init__(self, draws: Sequence[tuple[str | None, Any]]) -> None:
        self._draws = list(draws)
        self._position = 0

    def draw(self, strategy: Any, label: str | None = None) -> Any:
        if self._position >= len(self._draws):
            raise ReplayExhausted(label)
        recorded_label, value = self._draws[self._position]
        if recorded_label != label:
            raise ReplayMismatch(
                f"draw {self._position + 1} is {label!r} in this version of the suite but {recorded_label!r} "
                "in the script: rerun the test to get a new one"
            )
        self._position += 1
        return value


# ------------------------------------------------------------------------ values as source


def to_source(value: Any) -> str:
    """Python source that evaluates to ``value`` (with ``torch``, ``Case``, the recipe classes,
    ``spec`` in scope); :class:`ReproUnavailable` for values without one."""
    if value is None or isinstance(value, (bool, str)):
        return repr(value)
    if isinstance(value, int):
        return repr(int(value))
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else f"float({str(value)!r})"
    if isinstance(value, torch.dtype):
        return str(value)
    if isinstance(value, tuple):
        inner = ", ".join(to_source(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(to_source(v) for v in value) + "]"
    if isinstance(value, (set, frozenset)):
        items = sorted(to_source(v) for v in value)
        text = "{" + ", ".join(items) + "}" if items else ""
        return f"frozenset({text})" if isinstance(value, frozenset) else (text or "set()")
    if isinstance(value, dict):
        return "{" + ", ".join(f"{to_source(k)}: {to_source(v)}" for k, v in value.items()) + "}"
    if isinstance(value, Case):
        fields = [f"spec=spec, device={value.device!r}, dtype={value.dtype}"]
        for f in dataclasses.fields(value):
            if f.name in ("spec", "device", "dtype"):
                continue
            current = getattr(value, f.name)
            if f.name == "recipes":
                recipes = "".join(f"\n        {_recipe_source(r, value.spec)}," for r in current)
                fields.append(f"recipes=({recipes}\n    )")
            elif _differs_from_default(f, current):
                fields.append(f"{f.name}={to_source(current)}")
        return "Case(\n    " + ",\n    ".join(fields) + ",\n)"
    if isinstance(value, Recipe):
        parts = [repr(value.name)]
        parts += [
            f"{f.name}={to_source(getattr(value, f.name))}"
            for f in dataclasses.fields(value)
            if f.name != "name" and _differs_from_default(f, getattr(value, f.name))
        ]
        return f"{type(value).__name__}({', '.join(parts)})"
    raise ReproUnavailable(f"a drawn {type(value).__name__} ({value!r:.60}) has no source form")


def _recipe_source(recipe: Recipe, spec: Spec) -> str:
    """``recipe`` as source; a Scalar's constant that has none (a function, a config object) is
    read from the spec's own input, which holds that very object."""
    try:
        return to_source(recipe)
    except ReproUnavailable:
        declared = [i for i in spec.inputs if i.name == recipe.name and getattr(i, "value", None) is getattr(recipe, "value", None)]
        if not isinstance(recipe, ScalarRecipe) or not declared:
            raise
        return f"ScalarRecipe({recipe.name!r}, value=next(i.value for i in spec.inputs if i.name == {recipe.name!r}))"


def _differs_from_default(f: dataclasses.Field[Any], current: Any) -> bool:
    if f.default is not dataclasses.MISSING:
        return bool(current != f.default)
    if f.default_factory is not dataclasses.MISSING:
        return bool(current != f.default_factory())
    return True


# ------------------------------------------------------------------------ writing scripts


def script_name(contract: str, spec_name: str, device: str) -> str:
    """``<contract>-<function>-<device>.py`` with anything unsafe in a file name replaced."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", f"{contract}-{spec_name}-{device}") + ".py"


def write_script(
    path: Path,
    *,
    contract: str,
    spec_name: str,
    device: str,
    impl: str,
    draws: Sequence[tuple[str | None, Any]],
    summary: str,
    run_dir: Path,
    judged: Case | None = None,
) -> Path:
    """Write the repro script of one failing example to ``path``; returns it.

    ``run_dir`` is the directory pytest ran in: the script is meant to be run from there, and
    puts it first on ``sys.path`` (as ``python -m pytest`` does) so ``impl`` imports the same way.
    ``judged`` is the case the failing check judged: written out too when the contract derived it
    from the draws (constant rows, one extreme input), so its tensors can be looked at.
    Raises :class:`ReproUnavailable` when a draw cannot be written as source.
    """
    draw_lines = []
    for label, value in draws:
        draw_lines.append(f"    ({label!r}, {_indent(to_source(value))}),")
    judged_source = _derived_case_source(judged, draws)
    if judged_source:
        look = ("The check judged `judged` (below), which the contract derived from the draws; to look at\n"
                "its tensors: args = judged.args(); out = spec.op.call(*args).")
    else:
        look = ("To look at the tensors yourself, take a `Case(...)` of `draws` as `case`:\n"
                "args = case.args(); out = spec.op.call(*args); grads = case.grad_outputs([out]).")
    suite_parent = Path(__file__).resolve().parents[2]
    sys_path = ["os.getcwd()"]
    if not {"site-packages", "dist-packages"} & set(suite_parent.parts):
        # A checkout or vendored copy: import this package from where pytest found it.
        sys_path.append(repr(_relative_or_absolute(suite_parent, run_dir)))
    body = f'''"""Repro of a failing autograd-conformance test.

[{contract}] {spec_name} on {device}: {_docstring_safe(summary)}

Run it from {_docstring_safe(str(run_dir))} (where pytest ran):

    python {_docstring_safe(str(path))}

It rebuilds the failing example (inputs, grad_outputs, layouts) and runs the same contract
check once: exit 1 and the contract's message while the defect is there, exit 0 once fixed,
exit 2 when the check cannot run here.
{look}
"""
import os
import sys

sys.path[:0] = [{", ".join(sys_path)}]

import torch  # noqa: E402

from conformance.engine.replay import load_spec, replay  # noqa: E402
from conformance.engine.repro import (  # noqa: E402, F401
    AdditiveMaskRecipe, Case, DerivedRecipe, IndexRecipe, MaskRecipe, OffsetsRecipe, ScalarRecipe, TensorRecipe,
)

spec = load_spec({impl!r}, {spec_name!r})

draws = [
{chr(10).join(draw_lines)}
]
{judged_source}
replay(spec, {contract!r}, device={device!r}, draws=draws, impl={impl!r})
'''
    compile(body, str(path), "exec")  # a script that does not parse is a bug here, not the user's
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(body)
    return path


def _derived_case_source(judged: Case | None, draws: Sequence[tuple[str | None, Any]]) -> str:
    """``judged = Case(...)`` (with a blank line before it) when the judged case is none of the
    drawn ones; "" when it is one, is unknown, or has no source form (the replay needs only the draws)."""
    if judged is None or any(isinstance(value, Case) and _same_case(value, judged) for _, value in draws):
        return ""
    try:
        return f"\n# The case the failing check judged, derived by the contract from the draws above.\njudged = {to_source(judged)}\n"
    except ReproUnavailable:
        return ""


def _same_case(drawn: Case, judged: Case) -> bool:
    """Equal cases; a Scalar holding an array or tensor compares elementwise, so cases that cannot
    be told equal that way count as different (the judged one is then written out too)."""
    try:
        return drawn is judged or bool(drawn == judged)
    except (ValueError, RuntimeError, TypeError):
        return False


def _indent(text: str) -> str:
    return text.replace("\n", "\n    ")


def _docstring_safe(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"""', "'''")


def _relative_or_absolute(path: Path, start: Path) -> str:
    try:
        return os.path.relpath(path, start)
    except ValueError:  # another drive on Windows
        return str(path)


def attach_script(
    failure: ContractFailure,
    directory: Path,
    *,
    contract: str,
    spec_name: str,
    device: str,
    impl: str,
    draws: Sequence[tuple[str | None, Any]],
    run_dir: Path,
    judged: Case | None = None,
) -> str:
    """Write the repro script of ``failure``'s example into ``directory`` and name it in the
    failure's report; return its path, or ``""`` when it cannot be written (the report then keeps
    its inline snippet and says why)."""
    path = directory / script_name(contract, spec_name, device)
    try:
        write_script(
            path, contract=contract, spec_name=spec_name, device=device, impl=impl, draws=draws,
            summary=failure.summary, run_dir=run_dir, judged=judged,
        )
    except (ReproUnavailable, OSError) as error:
        failure.head += f"\n  (no repro script: {error})"
        return ""
    failure.repro_path = str(path)
    return str(path)


def _literal(value: Any) -> str:
    """Python source that rebuilds ``value`` with torch alone (a tensor's values written out)."""
    if isinstance(value, torch.Tensor):
        data = value.detach().cpu()
        return f"torch.tensor({data.tolist()!r}, dtype={data.dtype}, device={str(value.device)!r})"
    return repr(value)


def torch_only_script(case: Case, grad_outputs: dict[int, torch.Tensor], backend: str) -> str:
    """A script that needs only torch and the Function: it runs ``case`` (values written out, layouts
    contiguous) eagerly and under ``torch.compile(backend=...)`` and prints what differs -- for an
    issue on torch's tracker, where the suite is no help."""
    spec = case.spec
    module = sys.modules.get(spec.op.module)
    source_file = getattr(module, "__file__", None) or spec.source_file or ""
    imports, callee = spec.op.repro_import(source_file)
    if any("conformance" in line for line in imports):  # a file loaded by path: import it with the stdlib
        top = callee.split(".")[0]
        imports = [
            "import importlib.util",
            f"_spec = importlib.util.spec_from_file_location('functions_under_test', {source_file!r})",
            "_module = importlib.util.module_from_spec(_spec)",
            "_spec.loader.exec_module(_module)",
            f"{top} = _module.{top}",
        ]
    args = case.args()
    names = [r.name for r in case.recipes]
    mutated = set(spec.mutates)
    lines = ["import torch", *imports, "", "def inputs():"]
    for name, arg in zip(names, args):
        needs = isinstance(arg, torch.Tensor) and arg.requires_grad
        lines.append(f"    {name} = {_literal(arg)}" + (".requires_grad_()" if needs else ""))
    lines.append(f"    return [{', '.join(names)}]")
    lines += [
        "",
        "",
        f"def run({', '.join(names)}):",
        f"    return {callee}({', '.join(names)})",
        "",
        "",
        f"GRAD_OUTPUTS = {{{', '.join(f'{k}: {_literal(v)}' for k, v in sorted(grad_outputs.items()))}}}",
        "",
        "",
        "def outputs_and_grads(fn):",
        "    args = inputs()",
        "    leaves = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]",
        f"    out = fn(*[a.clone() if name in {sorted(mutated)!r} else a for name, a in zip({names!r}, args)])",
        "    outs = out if isinstance(out, tuple) else (out,)",
        "    pairs = [(outs[k], g) for k, g in GRAD_OUTPUTS.items()]",
        "    grads = torch.autograd.grad([o for o, _ in pairs], leaves, [g for _, g in pairs], allow_unused=True)",
        "    return [o.detach() for o in outs if isinstance(o, torch.Tensor)], grads",
        "",
        "",
        "eager = outputs_and_grads(run)",
        f"compiled = outputs_and_grads(torch.compile(run, backend={backend!r}))",
        "for what, e, c in [(f'output[{i}]', e, c) for i, (e, c) in enumerate(zip(eager[0], compiled[0]))] + [",
        "    (f'grad[{i}]', e, c) for i, (e, c) in enumerate(zip(eager[1], compiled[1]))",
        "]:",
        "    same = (e is None and c is None) or (e is not None and c is not None and torch.equal(e, c))",
        f"    print(what, 'same' if same else f\"DIFFERS: eager {{e}}, compiled (backend={backend!r}) {{c}}\")",
    ]
    return "\n".join(lines)
