"""Replaying a repro script's example: the entry point every script written by
:mod:`conformance.engine.repro` calls.

:func:`load_spec` imports the ``--impl`` targets as the plugin does and picks the spec;
:func:`replay` runs one contract check once on the recorded draws, through the same
:class:`~conformance.engine.runner.Target` the test used, and prints the verdict. It sits above
the runner (it builds a ``Target``), while the runner only records and writes scripts.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

import torch
from _pytest.outcomes import OutcomeException

from conformance.engine.contract import contract_of
from conformance.engine.defects import Blocked
from conformance.engine.loader import ImplError, load_impls
from conformance.engine.report import ContractFailure
from conformance.engine.repro import Case, ReplayExhausted, ReplayMismatch
from conformance.engine.runner import RunOptions, Target
from conformance.engine.triton_interpreter import choose_interpreter
from conformance.spec import Spec

__all__ = ["EXIT_FAILED", "EXIT_NOT_CHECKED", "EXIT_PASSED", "load_spec", "replay"]

# Exit statuses of a repro script.
EXIT_PASSED, EXIT_FAILED, EXIT_NOT_CHECKED = 0, 1, 2


def load_spec(impl: str, name: str) -> Spec:
    """The registered spec ``name`` from the ``--impl`` targets ``impl`` (module names or paths).
    Where it cannot be loaded (a script run from another folder than the one pytest ran in), the
    check cannot run here: exit 2 with the reason, never 1 (the defect's code)."""
    choose_interpreter(torch.cuda.is_available())  # as the plugin does, before any kernel import
    try:
        specs = load_impls(impl)
    except ImplError as error:
        _not_checked(f"not checked: {error} (run the script from the folder pytest ran in, as its docstring says)")
    for spec in specs:
        if spec.name == name:
            return spec
    _not_checked(f"not checked: --impl={impl} registers no Function named {name!r}; it registers {[s.name for s in specs]}")


def _not_checked(message: str) -> NoReturn:
    print(message, file=sys.stderr)
    raise SystemExit(EXIT_NOT_CHECKED)


def replay(
    spec: Spec,
    contract: str,
    *,
    device: str,
    draws: Sequence[tuple[str | None, Any]],
    impl: str = "",
    exit: bool = True,
) -> int:
    """Run contract ``contract``'s check once on the recorded ``draws``; print the verdict.

    Returns (or, with ``exit=True``, exits with) 0 when the check passes, 1 with the contract's
    message when it fails, 2 when it cannot run here (e.g. CUDA absent).
    """
    status, message = _replay(spec, contract, device=device, draws=draws, impl=impl)
    print(message, file=sys.stderr if status else sys.stdout)
    if exit:
        raise SystemExit(status)
    return status


def _replay(spec: Spec, contract: str, *, device: str, draws: Sequence[tuple[str | None, Any]], impl: str) -> tuple[int, str]:
    bound = [(label, _bind(value, spec)) for label, value in draws]
    try:
        module = importlib.import_module(f"conformance.test_{contract}")
    except ImportError:
        return EXIT_NOT_CHECKED, f"no contract named {contract!r} in this version of autograd-conformance"
    test: Callable[[Target], None] = getattr(module, f"test_{contract}")
    if device == "cuda" and not torch.cuda.is_available():
        return EXIT_NOT_CHECKED, "not checked: the example runs on CUDA, which is not available here"
    info = contract_of(test)
    target = Target(
        spec=spec, device=device, contract=contract, options=RunOptions(impl=impl or "?"), replay_draws=bound,
        compares_values=info is not None and info.compares_values,
    )
    try:
        test(target)
    except ContractFailure as failure:
        return EXIT_FAILED, failure.report_text(include_repro=False)
    except Blocked as blocked:
        return EXIT_FAILED, f"[{contract}] blocked by {blocked.defect.owner}: {blocked.defect.summary}"
    except ReplayExhausted:
        return EXIT_PASSED, (
            f"passed: [{contract}] {spec.name} on {device} holds on this example (every check the failing run "
            "made; the run stopped there, so later parts of the example were never drawn)"
        )
    except ReplayMismatch as error:
        return EXIT_NOT_CHECKED, f"not checked: {error}"
    except OutcomeException as outcome:  # pytest.skip / xfail inside the contract's own test
        return EXIT_NOT_CHECKED, f"not checked: {outcome.msg}"
    return EXIT_PASSED, f"passed: [{contract}] {spec.name} on {device} holds on this example"


def _bind(value: Any, spec: Spec) -> Any:
    """Recorded values with the loaded spec put into every Case (scripts write ``spec=spec``)."""
    if isinstance(value, Case):
        return dataclasses.replace(value, spec=spec)
    if isinstance(value, tuple):
        return tuple(_bind(v, spec) for v in value)
    if isinstance(value, list):
        return [_bind(v, spec) for v in value]
    return value
