"""The contract registry: what each contract is, what it draws, and what it needs of a target.

A contract is one test function in one ``conformance/test_<name>.py`` module, declared with
:func:`contract`::

    @contract("grad_meta", case=CaseOptions(broadcast=True))
    def test_grad_meta(conformance_target: Target) -> None:
        conformance_target.run(check_grad_meta)

The declaration travels on the function itself (no module-level registry to mutate): the
session reads it from each collected item into ``item.stash`` (with the Function and device of
that item), so nothing is ever parsed back out of a node id. ``case`` is the frozen
:class:`~strategies.cases.CaseOptions` preset its examples are drawn from; ``requires`` are
:class:`Requirement` s checked before the first example (unmet: the test is skipped as n/a or
not run here, with the reason). :func:`discover` lists every contract of the suite.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from conformance.engine.runner import Target
from strategies.cases import CaseOptions

__all__ = [
    "CONTRACT_ATTRIBUTE", "SOME_DTYPE", "ContractInfo", "Requirement", "admit", "contract", "contract_of", "discover", "float64",
]

CONTRACT_ATTRIBUTE = "__conformance_contract__"
PACKAGE_DIR = Path(__file__).resolve().parent.parent  # conformance/: the contract modules

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Requirement:
    """Something a contract needs of its target before any example runs.

    ``check(target)`` returns nothing when the need is met; otherwise it calls
    ``target.not_applicable(reason)`` (the contract says nothing about this target) or
    ``target.not_run_here(reason)`` (this machine or these options cannot check it)."""

    name: str
    check: Callable[[Target], None]

    def __repr__(self) -> str:
        return f"Requirement({self.name!r})"


@dataclass(frozen=True)
class ContractInfo:
    """One contract's declaration (see :func:`contract`)."""

    name: str
    case: CaseOptions = field(default_factory=CaseOptions)
    requires: tuple[Requirement, ...] = ()
    module: str = ""
    max_examples: int | None = None  # the contract's own example count: caps the profile's and --max-examples
    compares_values: bool = False  # its failures may be undeclared randomness (see contract())


def contract(
    name: str, *, case: CaseOptions | None = None, requires: Sequence[Requirement] = (), max_examples: int | None = None,
    compares_values: bool = False,
) -> Callable[[F], F]:
    """Declare the decorated ``test_<name>`` function as contract ``name``.

    case: the :class:`CaseOptions` its examples are drawn from (``target.draw_case(data)``).
    requires: :class:`Requirement` s checked, in order, before the first example.
    max_examples: the most examples per test for a contract each example of which is costly
    (compile), whatever the profile or ``--max-examples`` asks; a smaller count still lowers it.
    compares_values: its failures compare the values of two evaluations, or of one with a truth: on
    a Function that gives other values for the same inputs twice, undeclared, such a failure is
    the determinism contract's defect, and the test is blocked by it (the runner asks on failure).
    The name must match the function (``test_<name>``) and its module (``test_<name>.py``): one
    module per contract, so ``--contracts=<name>`` and the file a reader opens agree."""
    if not isinstance(name, str) or not name.isidentifier():
        raise ValueError(f"contract name {name!r} must be an identifier, e.g. 'grad_meta'")
    if case is not None and not isinstance(case, CaseOptions):
        raise TypeError(f"case={case!r} must be a strategies.cases.CaseOptions")
    if max_examples is not None and (isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1):
        raise ValueError(f"max_examples={max_examples!r} must be an int >= 1 (or None for the profile's)")
    bad = [r for r in requires if not isinstance(r, Requirement)]
    if bad:
        raise TypeError(f"requires={bad!r}: each must be a conformance.engine.contract.Requirement")

    def declare(test: F) -> F:
        if test.__name__ != f"test_{name}":
            raise ValueError(f"contract {name!r} is declared on {test.__name__}; name the function test_{name}")
        module = test.__module__.rsplit(".", 1)[-1]
        if module != f"test_{name}":
            raise ValueError(f"contract {name!r} lives in {test.__module__}; put it in conformance/test_{name}.py")
        info = ContractInfo(
            name=name, case=case if case is not None else CaseOptions(), requires=tuple(requires),
            module=test.__module__, max_examples=max_examples, compares_values=compares_values,
        )
        setattr(test, CONTRACT_ATTRIBUTE, info)
        return test

    return declare


def contract_of(function: Any) -> ContractInfo | None:
    """The declaration on a collected test function, or None for any other test."""
    info = getattr(function, CONTRACT_ATTRIBUTE, None)
    return info if isinstance(info, ContractInfo) else None


def discover() -> dict[str, ContractInfo]:
    """Every contract of the suite, by name: imports each ``conformance/test_*.py``."""
    found: dict[str, ContractInfo] = {}
    for path in sorted(PACKAGE_DIR.glob("test_*.py")):
        module = importlib.import_module(f"{PACKAGE_DIR.name}.{path.stem}")
        name = path.stem[len("test_"):]
        info = contract_of(getattr(module, path.stem, None))
        if info is None:
            raise RuntimeError(f"{path} has no @contract({name!r}, ...) test_{name} function")
        found[info.name] = info
    return found


def admit(target: Target, info: ContractInfo) -> None:
    """Before the first example: skip, with the reason, a test this target cannot run -- every
    dtype excluded by ``--dtypes``, a waiver of the spec, an unmet requirement of the contract."""
    spec = target.spec
    if not target.dtypes():
        target.not_run_here(f"--dtypes excludes every dtype {spec.name!r} lists ({', '.join(str(d) for d in spec.dtypes)})")
    reason = spec.waivers.get(info.name)
    if reason is not None:
        target.waived(f"waived by spec {spec.name!r}: {reason}")
    for requirement in info.requires:
        requirement.check(target)  # skips (n/a or not run here) when unmet


def float64(why: str) -> Requirement:
    """float64 among the spec's dtypes (else n/a) and kept by ``--dtypes`` (else not run here)."""
    return Requirement("float64", lambda target: target.require_float64(why))


def _some_dtype(target: Target) -> None:
    if not target.dtypes():
        target.not_run_here("every dtype of this spec is excluded by --dtypes")


SOME_DTYPE = Requirement("a dtype kept by --dtypes", _some_dtype)
