"""``conformance.check``: the suite's contracts as one call inside any test, notebook or script.

It runs what ``pytest conformance --impl=...`` runs for the same Functions -- the same contract
tests, through the same :class:`~conformance.engine.runner.Target`, with the same per-test seeds
(:func:`~conformance.engine.runner.example_seed`), profiles, shrinking, tiers and repro scripts --
in this process, one contract test after another, in the plugin's order. A defect raises
:class:`ConformanceFailure` (an ``AssertionError``), carrying every failed contract's message;
otherwise :func:`check` returns a :class:`CheckResult` with each test's outcome.

Not here: the plugin's crash isolation (``--isolate``, xdist restarts) and expectations files. A
Function that kills its process kills the caller's; run it under the plugin for those.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import os
import re
import shlex
import shutil
import tempfile
import traceback
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from _pytest.outcomes import OutcomeException

from autograd_conformance_plugin import PROFILES
from conformance.engine.contract import ContractInfo, admit, discover
from conformance.engine.literals import Literals, shared_hypothesis_home, snapshot
from conformance.engine.loader import ImplError, load_impls
from conformance.engine.pool import EvaluationPool
from conformance.engine.report import ContractFailure
from conformance.engine.runner import RunOptions, Target
from conformance.engine.verdict import Outcome, Verdict, unreported_defects
from conformance.engine.watchdog import FlightRecorder
from conformance.plugin.devices import choose_triton_interpreter, cuda_usable, no_cuda_reason, worker_gpu
from conformance.plugin.options import parse_options
from conformance.spec import Spec, make_specs, register, registered

__all__ = ["CheckResult", "ConformanceFailure", "ContractResult", "check"]

DEVICES = ("cpu", "cuda", "auto")
CHECKED = frozenset({Outcome.PASSED, Outcome.ADVICE, Outcome.UPSTREAM, Outcome.FAILED, Outcome.ERROR, Outcome.XFAILED})


@dataclass(frozen=True)
class ContractResult:
    """One contract test's verdict: ``contract`` on ``function`` on ``device``."""

    contract: str
    function: str
    device: str
    verdict: Verdict

    @property
    def outcome(self) -> str:
        """The report's word for it: passed, advice, upstream, failed, blocked, waived,
        not_applicable, not_run_here, ..."""
        return self.verdict.outcome.value

    @property
    def failed(self) -> bool:
        return self.verdict.outcome in (Outcome.FAILED, Outcome.ERROR)

    def describe(self) -> str:
        """One line: the test, its outcome and why."""
        why = self.verdict.describe()
        return f"{self.contract}[{self.function}-{self.device}]: {self.outcome}" + (f" -- {why}" if why else "")


@dataclass(frozen=True)
class CheckResult:
    """Every contract test one :func:`check` call ran, in the order it ran them."""

    results: tuple[ContractResult, ...]
    seed: int
    profile: str
    max_examples: int | None

    @property
    def failures(self) -> tuple[ContractResult, ...]:
        """Failed tests, and tests blocked by a defect whose owner did not fail in this call (not
        run, or it passed on its own examples), the defect's only report."""
        return tuple(r for r in self.results if r.failed or self.unreported(r) is not None)

    def unreported(self, result: ContractResult) -> str | None:
        """For a blocked test that reports a defect whose owner did not fail in this call, why
        (one test per such defect, :func:`~conformance.engine.verdict.unreported_defects`); else None."""
        if result.verdict.outcome is not Outcome.BLOCKED:
            return None
        row = {r.contract: (r.verdict.outcome, r.verdict.owner) for r in self.results
               if (r.function, r.device) == (result.function, result.device)}
        found = unreported_defects(row).get(result.contract)
        return found.why if found is not None and found.reporter == result.contract else None

    @property
    def checked(self) -> int:
        """Tests that checked something (passed, or found something); the rest were skipped."""
        return sum(r.verdict.outcome in CHECKED for r in self.results)

    @property
    def passed(self) -> bool:
        """No test failed (advice and upstream findings inform, as in the plugin's default run), and at
        least one checked something: a call whose every test was skipped has shown nothing."""
        return not self.failures and self.checked > 0

    def outcomes(self) -> dict[tuple[str, str, str], str]:
        """(contract, function, device) -> outcome, as the plugin's JSON report keys its cells."""
        return {(r.contract, r.function, r.device): r.outcome for r in self.results}

    def outcome(self, contract: str, function: str | None = None, device: str | None = None) -> str:
        """The outcome of ``contract``; ``function`` and ``device`` pick one when several ran."""
        found = [
            r for r in self.results
            if r.contract == contract and function in (None, r.function) and device in (None, r.device)
        ]
        if len(found) != 1:
            known = sorted({(r.contract, r.function, r.device) for r in self.results})
            raise KeyError(
                f"outcome({contract!r}, function={function!r}, device={device!r}) matches {len(found)} tests, "
                f"but should match one; ran: {known}"
            )
        return found[0].outcome

    def __str__(self) -> str:
        counts: dict[str, int] = {}
        for r in self.results:
            counts[r.outcome] = counts.get(r.outcome, 0) + 1
        head = f"conformance.check: {len(self.results)} contract tests (seed {self.seed}, profile {self.profile}): "
        return "\n".join([head + ", ".join(f"{n} {o}" for o, n in sorted(counts.items())),
                          *(f"  {r.describe()}" for r in self.results)])


class ConformanceFailure(AssertionError):
    """A :func:`check` call found defects. ``str()`` holds each failed contract's whole message
    (case, repro script, rerun), as the plugin's run prints it; ``result`` holds every outcome."""

    def __init__(self, result: CheckResult) -> None:
        self.result = result
        self.failures = result.failures
        if not self.failures:
            reasons = sorted({r.verdict.describe() for r in result.results})
            super().__init__(
                f"none of {len(result.results)} contract tests checked anything, but a check should: "
                + ("; ".join(reasons) if reasons else "no contract and device were selected")
            )
            return
        parts = [f"{len(self.failures)} of {len(result.results)} contract tests failed"]
        for failure in self.failures:
            verdict = failure.verdict
            if verdict.outcome is Outcome.BLOCKED:
                owner_ran = any((r.contract, r.function, r.device) == (verdict.owner, failure.function, failure.device)
                                for r in result.results)
                hint = (f"{result.unreported(failure)}: this test is the defect's only report" if owner_ran
                        else f"{verdict.owner} owns this defect and did not run here: add {verdict.owner!r} to contracts= "
                        "to see whether its own examples reach it")
                text = f"{verdict.describe()} ({hint})"
            else:
                text = verdict.message or verdict.reason or "(no message)"
            parts.append(f"{failure.contract}[{failure.function}-{failure.device}]:\n{text}")
        super().__init__("\n\n".join(parts))


def check(
    target: Any,
    /,
    *,
    contracts: Sequence[str] | None = None,
    skip_contracts: Sequence[str] = (),
    dtypes: Sequence[torch.dtype | str] | None = None,
    device: str = "auto",
    profile: str = "dev",
    max_examples: int | None = None,
    seed: int = 0,
    example_timeout: float | None = None,
    advice: str = "report",
    upstream: str = "report",
    raise_on_failure: bool = True,
    **register_keywords: Any,
) -> CheckResult:
    """Check ``target`` against the suite's contracts, here and now.

    ``target``: a registered Function's name (``"rmsnorm"``), an ``--impl`` value (a module or a
    ``.py`` path: every Function it registers), a :class:`~conformance.Spec`, a registered Function
    itself, or a Function or custom op with ``register``'s keywords (``inputs=``, ``reference=``,
    ...), which are checked without registering it.

    ``dtypes``: with register()'s keywords, the Function's dtypes (register()'s keyword); else the
    plugin's ``--dtypes`` filter. ``contracts`` / ``skip_contracts``, ``device`` (``"cpu"``, ``"cuda"``, ``"auto"``),
    ``profile`` / ``max_examples``, ``seed``, ``example_timeout`` (seconds; 0: none), ``advice`` /
    ``upstream`` (``"report"`` or ``"fail"``) mean what the plugin's options of the same names
    mean, with the same defaults. Raises :class:`ConformanceFailure` when a contract fails (unless
    ``raise_on_failure=False``); returns the :class:`CheckResult` otherwise.
    """
    _reject_unknown_keywords(register_keywords)
    choose_triton_interpreter()  # before any kernel module is imported, as the plugin does
    if register_keywords and dtypes is not None:
        # The spec is made here: dtypes= is register()'s (what the Function supports), not a filter
        # on a spec declared elsewhere (it was: the spec kept float64/float32, silently).
        register_keywords = {**register_keywords, "dtypes": tuple(_as_dtype(d) for d in dtypes)}
        dtypes = None
    specs, impl = _specs_of(target, register_keywords)
    options = _options(
        impl=impl, contracts=contracts, skip_contracts=skip_contracts, dtypes=dtypes, device=device, profile=profile,
        max_examples=max_examples, seed=seed, example_timeout=example_timeout, advice=advice, upstream=upstream,
    )
    known = discover()
    chosen = _chosen_contracts(known, contracts, skip_contracts)
    found: dict[tuple[int, int, int], ContractResult] = {}
    pool = EvaluationPool()  # one Function's tests in a row share their evaluations
    with _run_scope(options.threads) as (flight, repro_dir), worker_gpu() if "cuda" in options.devices else nullcontext():
        literals = snapshot(specs)  # inside the scope: Hypothesis caches each module's constants on disk
        for spec_index, spec in enumerate(specs):
            loaded_by = _repro_impl(spec, impl)
            for device_index, one_device in enumerate(d for d in options.devices if d in spec.devices):
                for info_index, info in enumerate(chosen):
                    verdict = _run_one(
                        info, spec, one_device, replace(options.engine(), impl=loaded_by or "?"), flight=flight,
                        repro_dir=repro_dir if loaded_by else None,
                        rerun=_rerun(target, spec, info.name, one_device, seed, profile, max_examples), pool=pool,
                        literals=literals[spec.name],
                    )
                    found[(info_index, spec_index, device_index)] = ContractResult(info.name, spec.name, one_device, verdict)
    results = [found[key] for key in sorted(found)]  # contract by contract, as documented
    result = CheckResult(tuple(results), seed=seed, profile=profile, max_examples=max_examples)
    if raise_on_failure and not result.passed:
        __tracebackhide__ = True  # pytest shows the calling test's line, not this function's body
        raise ConformanceFailure(result)
    return result


# ----------------------------------------------------------------------------- the target


def _as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` from itself, ``"float32"`` or ``"torch.float32"``."""
    found = getattr(torch, dtype.removeprefix("torch."), None) if isinstance(dtype, str) else dtype
    if not isinstance(found, torch.dtype):
        raise TypeError(f"dtypes entry {dtype!r} is not a torch dtype")
    return found


def _reject_unknown_keywords(register_keywords: dict[str, Any]) -> None:
    """A keyword neither check() nor register() takes (``contract=`` for ``contracts=``): a
    TypeError naming it and the closest keyword either takes."""
    registers = [name for name in inspect.signature(register).parameters if name != "fn"]
    own = [name for name in inspect.signature(check).parameters if name not in ("target", "register_keywords")]
    for key, value in register_keywords.items():
        if key in registers:
            continue
        close = difflib.get_close_matches(key, own + registers, n=1)
        raise TypeError(
            f"check() got an unknown keyword {key}={value!r}" + (f"; did you mean {close[0]}=?" if close else "")
            + f". check() takes {', '.join(own)}; with a Function or custom op also register()'s {', '.join(registers)}"
        )


def _custom_op_name(target: Any) -> str | None:
    """``"namespace::name"`` of a custom op given as its ``CustomOpDef``, ``torch.ops.namespace.name``
    or one of its overloads; None for anything else."""
    for attribute in ("_qualname", "_qualified_op_name"):
        name = getattr(target, attribute, None)
        if isinstance(name, str) and "::" in name:
            return name
    schema = getattr(target, "_schema", None)
    name = getattr(schema, "name", None)
    return name if isinstance(name, str) and "::" in name else None


def _specs_of(target: Any, register_keywords: dict[str, Any]) -> tuple[list[Spec], str]:
    """The specs ``target`` names, and the ``--impl`` value repro scripts load them by."""
    if register_keywords:
        if isinstance(target, (str, Spec)):
            raise TypeError(
                f"check({target!r}, {', '.join(f'{k}=' for k in register_keywords)}): register() keywords go with a "
                "Function or custom op, not with a registered name or a Spec"
            )
        specs = make_specs(target, **register_keywords)
        return specs, ""
    if isinstance(target, Spec):
        return [target], ""
    if isinstance(target, str):
        named = [s for s in registered() if s.name == target or s.name.startswith(target + ":")]
        if named:
            return named, ""
        try:
            return load_impls(target, search_paths=[Path.cwd()]), target
        except ImplError as error:
            names = sorted(s.name for s in registered())
            raise ValueError(
                f"check({target!r}): no Function is registered under that name (registered: {names}), and as an "
                f"--impl value: {error}"
            ) from None
    same = [s for s in registered() if target in (s.fn, s.op.function)]
    qualname = _custom_op_name(target)
    if not same and qualname is not None:  # a custom op: its CustomOpDef, torch.ops.ns.name or its .default
        same = [s for s in registered() if s.op.kind == "custom op" and s.op.display_name == qualname]
    if same:
        return same, ""
    raise TypeError(
        f"check({target!r}): not a registered Function, a name or a Spec; pass register()'s keywords to check it "
        "unregistered, e.g. check(MyFunction, inputs=[Tensor('x', 'n')], reference=torch.sin)"
    )


def _repro_impl(spec: Spec, impl: str) -> str:
    """What a repro script loads ``spec`` by: the ``--impl`` value given, else the module that
    registered it (by path when it was imported by path); "" for a spec no module registers."""
    if impl:
        return impl
    if not any(s is spec for s in registered()) or spec.origin == "__main__":
        return ""
    if spec.origin.startswith("_conformance_impl_") and spec.registered_at:
        return spec.registered_at.rpartition(":")[0]
    return spec.origin


def _rerun(target: Any, spec: Spec, contract: str, device: str, seed: int, profile: str, max_examples: int | None) -> str:
    """The command that replays one test: the calling pytest test (same seed, same examples), else
    the ``check`` call narrowed to it."""
    current = os.environ.get("PYTEST_CURRENT_TEST")
    if current:
        return shlex.join(["python", "-m", "pytest", current.rpartition(" (")[0] or current])
    count = f", max_examples={max_examples}" if max_examples is not None else ""
    narrowed = f"contracts=[{contract!r}], device={device!r}, seed={seed}, profile={profile!r}{count}"
    if isinstance(target, str) or any(s is spec for s in registered()):
        return f"conformance.check({target if isinstance(target, str) else spec.name!r}, {narrowed})"
    return f"the same conformance.check(...) call with {narrowed}"


# ----------------------------------------------------------------------------- the options


def _options(*, impl: str, contracts: Sequence[str] | None, skip_contracts: Sequence[str], dtypes: Any, device: str,
             profile: str, max_examples: int | None, seed: int, example_timeout: float | None, advice: str,
             upstream: str) -> Any:
    """The plugin's :class:`~conformance.plugin.options.RunOptions` for these keywords (so every
    default is the plugin's), or ``ValueError`` / ``TypeError`` echoing the bad value."""
    _one_of("device", device, DEVICES)
    _one_of("profile", profile, tuple(PROFILES))
    _one_of("advice", advice, ("report", "fail"))
    _one_of("upstream", upstream, ("report", "fail"))
    for name, value in (("seed", seed), ("max_examples", max_examples)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise TypeError(f"{name}={value!r} must be an int")
    values: dict[str, Any] = {
        "impl": impl or "?", "device": device, "profile": profile, "max_examples": max_examples, "seed": seed,
        "dtypes": _dtype_names(dtypes), "contracts": _names("contracts", contracts or ()),
        "skip_contracts": _names("skip_contracts", skip_contracts), "advice": advice, "upstream": upstream,
    }
    if example_timeout is not None:
        values["example_timeout"] = example_timeout
    try:
        return parse_options(values, run_dir=Path.cwd())
    except pytest.UsageError as error:
        raise ValueError(re.sub(r"--([a-z][a-z-]*)", lambda m: m.group(1).replace("-", "_"), str(error))) from None


def _one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} must be one of {', '.join(repr(c) for c in choices)}")


def _names(name: str, values: Iterable[str]) -> tuple[str, ...]:
    if isinstance(values, str):
        raise TypeError(f"{name}={values!r} must be a list of names, e.g. [{values!r}]")
    names = tuple(values)
    bad = [v for v in names if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{name}={list(names)!r}: {bad!r} are not names (str)")
    return names


def _dtype_names(dtypes: Any) -> tuple[str, ...]:
    if dtypes is None:
        return ()
    if isinstance(dtypes, (str, torch.dtype)):
        raise TypeError(f"dtypes={dtypes!r} must be a list, e.g. [{dtypes!r}]")
    names = []
    for dtype in dtypes:
        name = str(dtype).removeprefix("torch.")
        if not isinstance(getattr(torch, name, None), torch.dtype) or not getattr(torch, name).is_floating_point:
            raise ValueError(f"dtypes={list(dtypes)!r}: {dtype!r} is not a floating torch dtype (e.g. torch.float32)")
        names.append(name)
    return tuple(names)


def _chosen_contracts(known: dict[str, ContractInfo], contracts: Sequence[str] | None,
                      skip_contracts: Sequence[str]) -> list[ContractInfo]:
    """The contracts to run, in the plugin's order (by module name)."""
    for name, given in (("contracts", contracts or ()), ("skip_contracts", skip_contracts)):
        unknown = [c for c in given if c not in known]
        if unknown:
            raise ValueError(f"{name}={list(given)!r}: unknown contracts {unknown}; choose from {', '.join(sorted(known))}")
    if contracts is not None and not list(contracts):
        raise ValueError("contracts=[] chooses no contract; leave it out (None) to run every contract")
    wanted = set(known if contracts is None else contracts) - set(skip_contracts)
    if not wanted:
        raise ValueError(f"skip_contracts={list(skip_contracts)!r} leaves no contract of contracts={contracts!r} to run")
    return [known[name] for name in sorted(known) if name in wanted]


# ----------------------------------------------------------------------------- running


@contextmanager
def _run_scope(threads: int) -> Iterator[tuple[FlightRecorder, Path]]:
    """The run's torch threads (the caller's come back after), a flight recorder (one hang, one
    failure: the other contracts are blocked by it) and a folder for repro scripts (kept when a
    failure wrote one: the failure's message names it)."""
    from hypothesis import configuration

    user_threads = torch.get_num_threads()
    previous_home = vars(configuration).get("__hypothesis_home_directory")
    forget_home = None
    if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):  # no .hypothesis/ in the caller's folder
        home, forget_home = shared_hypothesis_home()
        configuration.set_hypothesis_home_dir(home)
    flight_dir = Path(tempfile.mkdtemp(prefix="conformance-check-flight-"))
    flight = FlightRecorder(flight_dir, "check")
    repro_dir = Path(tempfile.mkdtemp(prefix="conformance-check-repro-"))
    torch.set_num_threads(threads)
    try:
        yield flight, repro_dir
    finally:
        torch.set_num_threads(user_threads)
        flight.close()
        shutil.rmtree(flight_dir, ignore_errors=True)
        if not any(repro_dir.iterdir()):
            repro_dir.rmdir()  # kept only when it holds a failure's script
        if forget_home is not None:
            configuration.set_hypothesis_home_dir(previous_home)
            forget_home()


def _run_one(info: ContractInfo, spec: Spec, device: str, options: RunOptions, *, flight: FlightRecorder,
             repro_dir: Path | None, rerun: str, pool: EvaluationPool | None = None,
             literals: Literals | None = None) -> Verdict:
    """One contract test, as the plugin runs it (a repro script only where ``repro_dir`` is
    given: a spec some module registers): its verdict."""
    properties: list[tuple[str, object]] = []
    target = Target(
        spec=spec, device=device, contract=info.name, options=options,
        case_options=info.case, contract_examples=info.max_examples, compares_values=info.compares_values,
        nodeid=f"check::{info.name}[{spec.name}-{device}]",
        user_properties=properties, rerun=rerun, repro_dir=repro_dir, run_dir=Path.cwd(), flight=flight, pool=pool,
        literals=literals,
    )
    flight.start_test(target.nodeid, info.name, spec.name, device, rerun)
    test = getattr(importlib.import_module(info.module), f"test_{info.name}")
    ended: BaseException | None = None
    try:
        if device == "cuda" and not cuda_usable():
            target.not_run_here(no_cuda_reason())
        admit(target, info)
        test(target)
    except (OutcomeException, ContractFailure, Exception) as error:  # the verdict is in `properties`
        ended = error
    verdict = Verdict.of(properties)
    if verdict is None:  # ended without the runner's verdict: pytest.fail of the suite itself
        message = getattr(ended, "msg", None) or "".join(traceback.format_exception(ended)) if ended else ""
        return Verdict(Outcome.FAILED, str(message).splitlines()[0] if message else "", rerun=rerun, message=str(message))
    if verdict.outcome is Outcome.FAILED and not verdict.message and ended is not None and not isinstance(ended, OutcomeException):
        text = "".join(traceback.format_exception(ended))  # the suite's own error: its traceback
        return replace(verdict, reason=verdict.reason or f"{type(ended).__name__}: {ended}", message=text)
    return verdict
