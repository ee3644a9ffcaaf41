"""The property runner every contract test uses.

Each collected test (one Function x one contract x one device) receives a :class:`Target`.
``target.run(check)`` wraps ``check(target, data)`` in a Hypothesis test with the run's settings
and a seed derived from (seed option, Function, contract, device) -- never from the node id or
the worker -- so the same seed gives the same examples and verdicts serially and under xdist.
Every example runs under torch's pinned global state (:mod:`conformance.engine.global_state`), so what
ran before it (a spec module that turned grad mode off, another test) cannot change it. A pass
is earned: the check calls :meth:`Target.checked` where it really checked its property, and a
test none of whose examples did is skipped as n/a with the reasons given to
:meth:`Target.not_checked`.

Every conclusion -- passed, failed, blocked, waived, n/a, not run here -- is written once into
the test's ``user_properties`` as a :class:`~conformance.engine.verdict.Verdict`, which the
plugin reads back (also from xdist workers); the messages pytest shows are for people.
"""

from __future__ import annotations

import contextlib
import functools
import re
import zlib
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn, TypeVar

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, reject, seed, settings
from hypothesis import strategies as st
from hypothesis.control import current_build_context
from hypothesis.errors import FlakyFailure, HypothesisException, InvalidArgument

from conformance.engine import simplest
from conformance.engine.defects import (
    BackwardError,
    Blocked,
    Crash,
    Defect,
    ForwardError,
    backward_raised,
    forward_raised,
    raised,
    require_sound,
)
from conformance.engine.evaluate import (
    REFERENCE_BLAME,
    crash_owner,
    execute,
    function_of_tensors,
    raised_in_reference,
    reference_error,
    reference_raised,
)
from conformance.engine.expectations import Expectation, expected_in, unmet
from conformance.engine.finite_differences import (
    blocked_by_wrong_first_derivatives,
    blocked_by_wrong_surrogate_gradients,
)
from conformance.engine.global_state import SUITE_THREADS, pinned_global_state, pinned_values
from conformance.engine.harness import Execution, random_state, why_no_backward
from conformance.engine.literals import Literals, drawing_from, snapshot
from conformance.engine.numerics import at_ordinary_magnitudes, reference_has_no_answer, undeclared_randomness
from conformance.engine.pool import EvaluationPool
from conformance.engine.report import (
    ContractFailure,
    TestContext,
    UpstreamFailure,
    contract_failure,
    fail,
    reset_context,
    set_context,
    suite_frame,
    user_frames,
)
from conformance.engine.repro import DrawRecorder, ReplayData, ReplayMismatch, attach_script
from conformance.engine.seeding import needs_numpy_seeded, numpy_seeded_only_if
from conformance.engine.stack_room import with_room
from conformance.engine.triton_interpreter import interpreter_limit, pinned_config, runs_interpreted
from conformance.engine.verdict import Outcome, Verdict
from conformance.engine.watchdog import (
    DEFAULT_EXAMPLE_TIMEOUT,
    ExampleAborted,
    ExampleTimeout,
    FlightRecorder,
    RunEnding,
    example_deadline,
    one_hard_timer,
    phase_at,
    phase_marks,
)
from conformance.spec import Spec
from conformance.spec.inputs import Scalar
from strategies.cases import LAYOUTS, Case, CaseOptions, case_kinds, cases
from strategies.coverage import Corner, coverage_corners, smaller_corners
from strategies.recipes import ScalarRecipe
from strategies.values import GRAD_OUTPUT_KINDS, MASK_KINDS

__all__ = [
    "VARIED_CASES",
    "RunOptions",
    "Target",
    "example_seed",
]

T = TypeVar("T")

# torch.linalg's error for a matrix singular or not positive-definite in its precision
LINALG_ERROR: type[Exception] = torch.linalg.LinAlgError  # type: ignore[attr-defined]  # not in torch's stubs

# Requires-grad subsets, broadcasting, every layout, mask and grad_output kind: what the contracts
# that own a defect others may meet anywhere (the memory contracts) draw from.
VARIED_CASES = CaseOptions(
    requires_grad="nonempty", broadcast=True, layouts=LAYOUTS, mask_kinds=MASK_KINDS, grad_output_kinds=GRAD_OUTPUT_KINDS
)


@dataclass(frozen=True)
class RunOptions:
    """The run's options that shape every property run (the plugin builds them from its own).

    ``profile_settings`` are the Hypothesis settings of the run's profile (the plugin's
    ``--profile`` table; Hypothesis' defaults when empty); ``max_examples`` overrides theirs; a
    contract's own count and a spec's ``max_examples`` cap both.
    """

    profile_settings: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    max_examples: int | None = None
    seed: int = 0
    impl: str = "reference_ops"
    dtypes: tuple[torch.dtype, ...] | None = None
    example_timeout: float | None = DEFAULT_EXAMPLE_TIMEOUT  # seconds per example; None: unbounded
    threads: int = SUITE_THREADS  # torch's intra-op threads for every evaluation (--threads)
    compile_backends: tuple[str, ...] = ("aot_eager",)  # what the compile contract compiles with
    fail_on: frozenset[str] = frozenset({"defect"})  # the tiers that fail a test (--advice/--upstream=fail add theirs)

    def hypothesis_settings(self, max_examples: int | None = None) -> settings:
        """The run's Hypothesis settings (with ``max_examples`` instead of the run's count): made
        once per count (a settings object validates every value, several per test)."""
        made = self._settings_by_count.get(max_examples)
        if made is None:
            made = self._settings() if max_examples is None else settings(self.hypothesis_settings(), max_examples=max_examples)
            self._settings_by_count[max_examples] = made
        return made

    @functools.cached_property
    def _settings_by_count(self) -> dict[int | None, settings]:
        return {}

    def _settings(self) -> settings:
        # Explicit, so Hypothesis' own "ci" profile (loaded when $CI is set) never leaks in.
        values = {"derandomize": False, **self.profile_settings}
        if self.max_examples is not None:
            values["max_examples"] = self.max_examples
        return settings(
            deadline=None,
            database=None,
            print_blob=False,
            report_multiple_bugs=False,
            # No "explain" phase: it re-runs failures under coverage, slow for kernels.
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            **values,
        )


def example_seed(base: int, spec_name: str, contract: str, device: str) -> int:
    """The Hypothesis seed of one test: stable across machines, paths and xdist workers."""
    return zlib.crc32(f"{spec_name}|{contract}|{device}".encode()) ^ (base & 0xFFFFFFFF)


@dataclass
class Target:
    """One registered Function on one device, as seen by one contract test."""

    spec: Spec
    device: str
    contract: str = ""
    options: RunOptions = field(default_factory=RunOptions)
    case_options: CaseOptions = field(default_factory=CaseOptions)  # the contract's preset
    contract_examples: int | None = None  # the contract's own example count: a cap on the run's
    compares_values: bool = False  # the contract's failures may be undeclared randomness (engine.contract)
    randomness_ruled_out: Case | None = field(default=None, repr=False)  # the last case that check cleared
    nodeid: str = ""
    context: TestContext | None = field(default=None, repr=False)
    user_properties: list[tuple[str, object]] = field(default_factory=list, repr=False)
    rerun: str = field(default="", repr=False)  # the command that replays this test
    repro_dir: Path | None = field(default=None, repr=False)  # where a failure's repro script goes
    run_dir: Path | None = field(default=None, repr=False)  # where pytest ran (repro scripts run from there)
    replay_draws: Sequence[tuple[str | None, Any]] | None = field(default=None, repr=False)  # see conformance.engine.repro
    last_draws: list[tuple[str | None, Any]] = field(default_factory=list, repr=False)
    dtype_expectations: tuple[Expectation, ...] = field(default=(), repr=False)  # xfail in that dtype only
    strict_expectations: bool = field(default=False, repr=False)
    flight: FlightRecorder | None = field(default=None, repr=False)  # what a crash report reads back
    concluded: bool = field(default=False, repr=False)  # a verdict was written (see conclude)
    corner: Corner | None = field(default=None, repr=False)  # the coverage phase's, for an example's first case
    corner_pending: bool = field(default=False, repr=False)
    # A random phase after the corners: its engine's first example (every draw at its simplest,
    # the smallest case the corners ran) is rejected once, so each example is a random one.
    skip_simplest: bool = field(default=False, repr=False)
    case_strategies: dict[CaseOptions, st.SearchStrategy[Case]] = field(default_factory=dict, repr=False)
    simplest_cases: dict[CaseOptions, Case] = field(default_factory=dict, repr=False)  # see _simplest_case
    pool: EvaluationPool | None = field(default=None, repr=False)  # evaluations shared with this Function's other tests
    chosen_options: dict[tuple[Any, ...], CaseOptions] = field(default_factory=dict, repr=False)  # see _options_for
    # The constants Hypothesis mixes into the draws (see conformance.engine.literals): the
    # session's, taken when the run started; else taken when this test runs.
    literals: Literals | None = field(default=None, repr=False)
    # The first example a crash owned by another contract blocked: the other examples still run
    # (a defect of this contract's own on cases that do not crash fails the test), and unless one
    # fails the test is blocked by it.
    blocked: Blocked | None = field(default=None, repr=False)

    def dtypes(self, wanted: Sequence[torch.dtype] | None = None) -> tuple[torch.dtype, ...]:
        """The spec's dtypes, narrowed by ``--dtypes`` and by ``wanted``; without bfloat16 for a
        Triton Function under the interpreter (which computes bfloat16 wrongly)."""
        chosen = self.spec.dtypes
        if self.options.dtypes is not None:
            chosen = tuple(d for d in chosen if d in self.options.dtypes)
        if wanted is not None:
            chosen = tuple(d for d in chosen if d in wanted)
        if torch.bfloat16 in chosen and runs_interpreted(self.spec.op, self.device):
            chosen = tuple(d for d in chosen if d != torch.bfloat16)
            if not chosen:
                self.not_run_here(
                    "bfloat16 is the only dtype left, and the Triton interpreter truncates float32 to bfloat16 "
                    "instead of rounding: check it on a GPU"
                )
        return chosen

    @property
    def pinned(self) -> Mapping[str, Any]:
        """torch's global state every example of this test runs under (:mod:`conformance.engine.global_state`)."""
        return pinned_values(threads=self.options.threads)

    def require_float64(self, why: str) -> None:
        """Skip (with the reason) unless the spec lists float64 and ``--dtypes`` keeps it."""
        if not self.spec.supports_float64:
            self.not_applicable(f"{self.spec.name!r} does not list torch.float64 in dtypes; {why}")
        if self.options.dtypes is not None and torch.float64 not in self.options.dtypes:
            self.not_run_here(f"float64 is excluded by --dtypes; {why}")

    def not_applicable(self, reason: str) -> NoReturn:
        """Skip: the contract says nothing about this Function (reported as "n/a")."""
        __tracebackhide__ = True
        self._skip(Verdict(Outcome.NOT_APPLICABLE, reason, rerun=self.rerun))

    def not_run_here(self, reason: str) -> NoReturn:
        """Skip: this machine or these options cannot check it (reported as "not run here")."""
        __tracebackhide__ = True
        self._skip(Verdict(Outcome.NOT_RUN_HERE, reason, rerun=self.rerun))

    def waived(self, reason: str) -> NoReturn:
        """Skip: the spec waives this contract (``register(..., waivers={contract: why})``)."""
        __tracebackhide__ = True
        self._skip(Verdict(Outcome.WAIVED, reason, rerun=self.rerun))

    def per_dtype(self, dtypes: Sequence[torch.dtype], check: Callable[[torch.dtype], T]) -> list[T]:
        """``check(dtype)`` for each of ``dtypes``, for a contract that checks every dtype within
        one example: a dtype whose call crashes where another contract owns the crash (float64 a
        kernel does not support) is left out, and the others are still checked; the test is then
        blocked by that crash unless a defect of its own fails it."""
        results = []
        for dtype in dtypes:
            try:
                results.append(check(dtype))
            except Crash as crash:
                self._unless_crash_blocked(self._crashed, crash)
        return results

    def _unless_crash_blocked(self, judge: Callable[..., None], *args: Any) -> bool:
        """``judge(*args)`` (which fails this contract or blocks it); True where it blocked it by a
        crash another contract owns (kept, :meth:`_kept_crash_block`), so that the caller goes on
        with its other examples or dtypes; any other block propagates."""
        try:
            judge(*args)
        except Blocked as blocked:
            if not self._kept_crash_block(blocked):
                raise
            return True
        return False

    def _kept_crash_block(self, blocked: Blocked) -> bool:
        """Whether ``blocked`` is a crash's, kept (the first one) for the end of the test."""
        if blocked.crash and self.blocked is None:
            self.blocked = blocked
        return blocked.crash

    def skip_blocked(self, blocked: Blocked) -> NoReturn:
        """Skip with one labelled line: the owner, the defect, the case and the rerun command."""
        __tracebackhide__ = True
        case = blocked.case.describe() if blocked.case is not None else ""
        verdict = Verdict(
            Outcome.BLOCKED, blocked.defect.summary, owner=blocked.defect.owner, case=case, rerun=self.rerun
        )
        self._skip(verdict)

    def conclude(self, verdict: Verdict) -> None:
        """Record this test's verdict (a later one replaces it) for the plugin's reports."""
        self.user_properties.append(verdict.as_property())
        self.concluded = True

    def _skip(self, verdict: Verdict) -> NoReturn:
        __tracebackhide__ = True
        self.conclude(verdict)
        pytest.skip(verdict.describe())

    def checked(self) -> None:
        """Count this example as one on which the contract checked its property.

        Every contract calls it where its check has really run; :meth:`run` turns a test whose
        examples never did into a skip with the reasons given to :meth:`not_checked`, never a
        pass."""
        if self.context is not None:
            self.context.checked += 1

    def not_checked(self, reason: str) -> None:
        """Record why this example had nothing to check (the contract then returns)."""
        if self.context is not None:
            self.context.unchecked.setdefault(reason, None)

    def execution(
        self, case: Case, *, dtype: torch.dtype | None = None, requires_grad: frozenset[str] | None = None, rng: str = ""
    ) -> Execution:
        """``execute(case, dtype=dtype, requires_grad=requires_grad)``, shared: the same evaluation
        serves every test of this Function and device that asks for an equal case and options under
        the same RNG regime ``rng`` (the caller's own seeding, named), as long as it is intact
        (:mod:`conformance.engine.pool`); made fresh without a pool."""

        def make() -> Execution:
            return execute(case, dtype=dtype, requires_grad=requires_grad)

        if self.pool is None:
            return make()
        options = (str(dtype or case.dtype), tuple(sorted(case.requires_grad if requires_grad is None else requires_grad)))
        return self.pool.execution(case, make, options=options, rng=rng)

    def preflight(self, case: Case, *, dtype: torch.dtype | None = None) -> Execution:
        """Forward and backward of ``case`` through the probe (:meth:`execution`: shared), stopping
        (failure or "blocked by") on a crash or a structural defect; for contracts that then drive
        the Function themselves."""
        __tracebackhide__ = True
        with random_state(self.spec, case):
            execution = self.execution(case, dtype=dtype)
        require_sound(self.contract, execution)
        return execution

    def judged_once(self, execution: Execution, key: Hashable, judge: Callable[[], T]) -> T:
        """``judge()``, the judgement of ``execution`` that ``key`` names (with this contract), made
        once per evaluation the pool keeps: for an equal case served again (the same tensors,
        intact) it returns what the first judgement returned. A judgement that raises (a failure,
        "blocked by") keeps nothing, so it raises again; an evaluation the pool does not keep (a
        random Function's, one that drew from a generator) is judged every time."""
        kept = execution.judgements
        if kept is None:
            return judge()
        name = (self.contract, key)
        if name not in kept:
            kept[name] = judge()
        result: T = kept[name]
        return result

    def reporting(self) -> bool:
        """Whether a failure of this example is the one reported: Hypothesis' final run of the
        minimal failing example, a replay of recorded draws, or a call outside Hypothesis. A
        contract may leave out work that only words a failure message, never the verdict, on
        every other example (the search and shrinking)."""
        if self.replay_draws is not None:
            return True
        try:
            return bool(current_build_context().is_final)
        except InvalidArgument:  # no Hypothesis example running
            return True

    def backward_ran(self, execution: Execution) -> bool:
        """Whether ``execution`` called backward; if not, records why (:meth:`not_checked`) for
        the contracts that inspect backward, which then return."""
        if execution.recorder.calls:
            return True
        self.not_checked(why_no_backward(execution))
        return False

    def draw_case(
        self, data: st.DataObject, options: CaseOptions | None = None, *, dtypes: Sequence[torch.dtype] | None = None,
        cornered: bool = False,
    ) -> Case:
        """Draw a case on this target's device (labelled ``case`` in Hypothesis reports), from
        ``options`` (default: the contract's preset). Its dtypes: ``dtypes``, else the preset's,
        else the spec's narrowed by ``--dtypes`` (:meth:`dtypes`). A coverage corner shapes an
        example's first case, and with ``cornered`` any later one too (a contract that draws the
        same case once per dtype)."""
        corner = None
        if self.corner is not None and (self.corner_pending or cornered):
            corner = self.corner  # an example's first case only: compile grows later ones
            self.corner_pending = False
        chosen = self._options_for(options, dtypes, corner)
        strategy = self.case_strategies.get(chosen)
        if strategy is None:  # one per options: Hypothesis validates a new strategy object on its first draw
            strategy = self.case_strategies[chosen] = cases(self.spec, chosen, device=self.device)
        if simplest.running():
            case = self._simplest_case(data, chosen, strategy)
        else:
            case = data.draw(strategy, label="case")
            if self.skip_simplest and simplest.only_simplest_choices(data):
                self.skip_simplest = False
                reject()
        if self.context is not None:
            self.context.use_case(case)
        if self.flight is not None:
            self.flight.start_example(case.describe(), self.example_timeout)
        return case

    def _simplest_case(self, data: st.DataObject, chosen: CaseOptions, strategy: st.SearchStrategy[Case]) -> Case:
        """The case a simplest example draws from ``strategy`` (:mod:`conformance.engine.simplest`):
        the same for every test of this Function that draws with equal options, so drawn once
        (~0.5 ms a case) and kept -- unless the spec's own code takes part in the draw
        (``Scalar(from_case=...)``) or a Scalar's drawn value is not plain, immutable data (a
        Function may change a list it is handed; an array's repr rounds)."""
        kept = self.simplest_cases.get(chosen)
        if kept is not None and isinstance(data, DrawRecorder):
            data.record(kept, label="case")
            return kept
        case: Case = data.draw(strategy, label="case")
        if self.spec_draws_plainly and all(r.immutable for r in case.recipes if isinstance(r, ScalarRecipe)):
            self.simplest_cases[chosen] = case
        return case

    @functools.cached_property
    def spec_draws_plainly(self) -> bool:
        """Whether drawing a case runs none of the spec's own code (no ``Scalar(from_case=...)``)."""
        return not any(isinstance(i, Scalar) and i.from_case is not None for i in self.spec.inputs)

    def _options_for(
        self, options: CaseOptions | None, dtypes: Sequence[torch.dtype] | None, corner: Corner | None
    ) -> CaseOptions:
        """The case options a draw uses, made once per (options, dtypes, corner) for all of a
        Function's tests (``chosen_options`` is the session's, kept per Function and device): a
        validated copy per draw cost ~0.6% of the main job, one per test and corner 0.5%."""
        given = options if options is not None else self.case_options
        key = (given, None if dtypes is None else tuple(dtypes), corner)
        chosen = self.chosen_options.get(key)
        if chosen is None:
            chosen = given
            if dtypes is not None:
                chosen = chosen.replace(dtypes=tuple(dtypes))
            elif chosen.dtypes is None:
                chosen = chosen.replace(dtypes=self.dtypes())
            if corner is not None:
                chosen = chosen.replace(corner=corner)
            self.chosen_options[key] = chosen
        return chosen

    def _blocked_by_a_hang(self) -> None:
        """One hang, one failure: once a contract before this one (contract order) found this Function
        hanging on this device (in this process or another of the run), stop with "blocked by" it
        before waiting again. A later contract's hang does not block: this one may meet it first
        in contract order, and owns it then (the matrix blocks the later one)."""
        endings = self.flight.run_endings_of(self.spec.name, self.device) if self.flight is not None else []
        hung = [e for e in endings if e.act == "hang" and e.contract < self.contract]  # contract order: see note_run_ending
        if hung:
            self._skip_blocked_by(hung[0])

    def _unless_an_earlier_ending(self, act: str, failure: ContractFailure) -> None:
        """One act, one failure: note the act that ended this test's example (a hang, an exit, a
        self-raised interrupt) for the run; when a contract before this one (contract order) of this
        Function on this device noted one, skip as blocked by it instead of failing for it again."""
        if self.flight is None:
            return
        first = self.flight.note_run_ending(self.spec.name, self.device, RunEnding(act, self.contract, failure.summary, self._case_text()))
        if first.contract != self.contract:
            self._skip_blocked_by(first)

    def _skip_blocked_by(self, ending: RunEnding) -> NoReturn:
        __tracebackhide__ = True
        self._skip(Verdict(Outcome.BLOCKED, ending.summary, owner=ending.contract, case=ending.case, rerun=self.rerun))

    def draw_varied_case(self, data: st.DataObject) -> Case:
        """A case from the contract's preset (:data:`VARIED_CASES` for the memory contracts, which
        own defects the others may meet anywhere), with extreme values or not."""
        extreme = data.draw(st.booleans(), label="extreme values")
        key = ("varied", self.case_options, extreme)  # one validated copy per Function, not per example
        options = self.chosen_options.get(key)
        if options is None:
            options = self.chosen_options[key] = self.case_options.replace(extreme=extreme)
        return self.draw_case(data, options)

    @property
    def example_timeout(self) -> float | None:
        """Seconds one example may run: the spec's own budget, else the run's."""
        return self.spec.timeout if self.spec.timeout is not None else self.options.example_timeout

    def run(self, check: Callable[[Target, st.DataObject], None], *, max_examples: int | None = None) -> None:
        """Run ``check`` as a Hypothesis property with this run's settings and seed (or once on
        ``replay_draws``); a failure gets a repro script in ``repro_dir``. A spec checking one
        autotune config runs with its kernel pinned to that config. ``max_examples`` caps the
        examples (see :meth:`example_count`)."""
        __tracebackhide__ = True
        pin = self.spec.autotune_pin
        try:
            with pinned_config(*pin) if pin is not None else contextlib.nullcontext():
                with_room(self._run, check, max_examples=max_examples)
        except Exception:
            # An end the runner did not judge (the suite's own bug, a Hypothesis health check):
            # failed, with pytest's report as its reason. pytest's own skips and xfails
            # (BaseException) and KeyboardInterrupt keep pytest's outcome, with no verdict.
            if not self.concluded:
                self.conclude(Verdict(Outcome.FAILED, rerun=self.rerun))
            raise

    def example_count(self, cap: int | None = None) -> int:
        """Examples per test: the run's (profile, ``--max-examples``), capped by ``cap``, the
        contract's own count (compile and autocast are costly per example) and the spec's
        ``max_examples``; neither the profile nor ``--max-examples`` raises a cap."""
        caps = (cap, self.contract_examples, self.spec.max_examples)
        return min([self.options.hypothesis_settings().max_examples, *(c for c in caps if c is not None)])

    def coverage_corners(self, examples: int | None = None) -> tuple[Corner, ...]:
        """The deterministic coverage phase's corners (:mod:`strategies.coverage`) for this test's
        dtypes and element budget. The dtypes and the contract's case kinds are covered pairwise
        with the spec's own factors when those corners leave room for a random example within
        ``examples`` (the test's count: a thorough profile, nearly always); otherwise each of their
        values takes a corner in turn, which never raises the count (ci and dev, mostly)."""
        dtypes = self.case_options.dtypes or self.dtypes()
        budget = self.case_options.max_elements
        if self.spec.max_elements is not None:
            budget = min(budget, self.spec.max_elements)
        kinds = case_kinds(self.spec, self.case_options)
        grad_kinds = self.case_options.grad_output_kinds
        constant_grad_kind = grad_kinds.index("constant") if "constant" in grad_kinds else None

        def corners(pairwise: bool) -> tuple[Corner, ...]:
            return coverage_corners(
                self.spec, dtypes=dtypes, max_elements=budget, max_batch_dims=self.case_options.max_batch_dims,
                kinds=kinds, pairwise_kinds=pairwise, constant_grad_kind=constant_grad_kind,
            )

        one_at_a_time = corners(False)
        if examples is None or len(one_at_a_time) >= examples:  # pairs are never fewer: they cannot fit
            return one_at_a_time
        pairwise = corners(True)
        return pairwise if len(pairwise) < examples else one_at_a_time

    def _phases(self, max_examples: int | None) -> list[tuple[Corner | None, int]]:
        """(corner, examples) runs. Under a profile's count: one example per corner, then random
        examples making up the rest of it (at least one). An explicit count (``--max-examples``) or a
        cap below the profile's (compile, autocast, a spec's ``max_examples``): that many random
        examples and no corners (a corner would take the place of a random example whose other
        draws -- extreme values, layouts -- it leaves at their simplest)."""
        count = self.example_count(max_examples)
        if self.options.max_examples is not None or count < self.options.hypothesis_settings().max_examples:
            return [(None, count)]
        corners = self.coverage_corners(count)
        return [(c, 1) for c in corners] + [(None, max(1, count - len(corners)))]

    def _run(self, check: Callable[[Target, st.DataObject], None], *, max_examples: int | None) -> None:
        __tracebackhide__ = True
        self.context = TestContext(
            contract=self.contract, spec=self.spec, device=self.device, nodeid=self.nodeid, rerun=self.rerun
        )
        property_ = self._property(check)
        if self.replay_draws is not None:
            try:
                self._blocked_by_a_hang()
                property_(ReplayData(self.replay_draws))
                self._raise_blocked()
            except ExampleAborted as aborted:
                raise aborted.failure from None
            self._require_checked()
            return
        test = seed(example_seed(self.options.seed, self.spec.name, self.contract, self.device))(
            given(data=st.data())(property_)
        )
        # No example database: without a key Hypothesis hashes the property's source on every
        # run (~4 ms, a tenth of the main job's CPU at one run per corner).
        test._hypothesis_internal_database_key = None  # type: ignore[attr-defined]

        phases = self._phases(max_examples)

        def run_phase(corner: Corner | None, examples: int) -> None:
            self.corner = corner
            self.skip_simplest = corner is None and len(phases) > 1
            # One @given wrapper for all runs of this test, each with its own count: what the
            # settings decorator sets, set again (it refuses a second; ~0.1 ms a run).
            run_settings = self.options.hypothesis_settings(examples)
            if examples == 1 and not self.skip_simplest and simplest.passes_simplest(property_, run_settings):
                return  # a one-example run (a corner's, compile's): the engine's first example passed (engine.simplest)
            test._hypothesis_internal_use_settings = run_settings  # type: ignore[attr-defined]
            try:
                test()
            except FlakyFailure as flaky:
                raise _intermittent(flaky) from None

        if self.literals is None:
            self.literals = snapshot([self.spec])[self.spec.name]
        try:
            self._blocked_by_a_hang()  # once per test: a read of the run's hang notes
            with drawing_from(self.literals), numpy_seeded_only_if(needs_numpy_seeded(self.spec)), one_hard_timer():
                for corner, examples in phases:
                    try:
                        run_phase(corner, examples)
                    except ContractFailure as at_corner:
                        if corner is None or isinstance(at_corner, UpstreamFailure):
                            raise
                        raise self._at_smaller_sizes(run_phase, corner, at_corner) from None
            self._raise_blocked()
        except Blocked as blocked:
            self.skip_blocked(blocked)
        except UpstreamFailure as found:
            self._upstream(found)
            return
        except (ContractFailure, ExampleAborted) as error:
            # Hypothesis ran the minimal failing example last: its draws are the ones recorded
            # (an aborted example -- a hang, sys.exit -- is not shrunk: it is that example).
            failure = error.failure if isinstance(error, ExampleAborted) else error
            assert isinstance(failure, ContractFailure)
            if isinstance(error, ExampleAborted):
                self._unless_an_earlier_ending(error.act, failure)
            self._fail(failure)
            if failure is not error:
                raise failure from None
            raise
        self._require_checked()
        self._pass()

    def _raise_blocked(self) -> None:
        """After every example ran without a failure of this contract's own: blocked by the first
        example another contract's defect blocked, if any."""
        if self.blocked is not None:
            raise self.blocked

    def _at_smaller_sizes(
        self, run_phase: Callable[[Corner | None, int], None], corner: Corner, failure: ContractFailure
    ) -> ContractFailure:
        """A corner's sizes are forced, so Hypothesis cannot shrink them: after a failure at one,
        its other values are tried at smaller legal sizes and fewer rows (:func:`strategies.coverage.smaller_corners`),
        smallest first. The first that fails is reported instead (a tail dropped above 64 at 65,
        not at 129); else ``failure`` is, with its own case and draws."""
        found = (self.context.case if self.context is not None else None, self.last_draws)
        for candidate in smaller_corners(self.spec, corner):
            try:
                run_phase(candidate, 1)
            except UpstreamFailure:
                continue
            except ContractFailure as smaller_failure:
                return smaller_failure
            except (Exception, pytest.skip.Exception):  # blocked or not applicable: says nothing here
                continue
            # A hang or exit at a smaller size (ExampleAborted) is this test's failure: it propagates.
        if self.context is not None:
            self.context.case = found[0]
        self.last_draws = found[1]
        return failure

    def _fail(self, failure: ContractFailure) -> None:
        """Conclude a contract failure: its repro script, its verdict; an xfail when a dtype
        expectation expects it."""
        __tracebackhide__ = True
        verdict = Verdict(
            Outcome.FAILED, failure.summary, case=self._case_text(), repro=self._repro_script(failure), rerun=self.rerun,
            message=str(failure),
        )
        expected = expected_in(self.dtype_expectations, failure.dtype)
        if expected is None:
            self.conclude(verdict)
            return
        reason = f"expected deviation {expected.label}: {expected.reason}; failed with: {failure.summary}"
        self.conclude(replace(verdict, outcome=Outcome.XFAILED, reason=reason))
        pytest.xfail(reason)

    def _repro_script(self, failure: ContractFailure) -> str:
        if self.repro_dir is None:
            return ""
        return attach_script(
            failure, self.repro_dir, contract=self.contract, spec_name=self.spec.name, device=self.device,
            impl=self.options.impl, draws=self.last_draws, run_dir=self.run_dir or Path.cwd(),
            judged=self.context.case if self.context is not None else None,
        )

    def _case_text(self) -> str:
        return self.context.case.describe() if self.context is not None and self.context.case is not None else ""

    def _upstream(self, found: UpstreamFailure) -> None:
        """Conclude torch's own bug: reported as upstream, a failure only under --upstream=fail."""
        __tracebackhide__ = True
        self._inform(found, Outcome.UPSTREAM, "upstream", repro=self._repro_script(found))

    def _inform(
        self, found: ContractFailure, outcome: Outcome, tier: str, *, repro: str = "", unmet: tuple[str, ...] = ()
    ) -> None:
        """Conclude advice or upstream: its own outcome (the test passes), or a failure when the
        run fails on that tier."""
        __tracebackhide__ = True
        verdict = Verdict(
            outcome, found.summary, case=found.case_text or self._case_text(), repro=repro, rerun=self.rerun,
            message=str(found), unmet_expectations=unmet,
        )
        if tier not in self.options.fail_on:
            self.conclude(verdict)
            return
        self.conclude(replace(verdict, outcome=Outcome.FAILED, tier=tier))
        pytest.fail(f"{found!s}\n  ({tier} fails this run: --{tier}=fail)", pytrace=False)

    def _pass(self) -> None:
        """Conclude a pass (with the advice an example gave, if any); a dtype expectation whose
        dtype was checked and passed is stale (and fails the test if expectations are strict)."""
        __tracebackhide__ = True
        seen = self.context.dtypes_seen if self.context is not None else set()
        stale = unmet(self.dtype_expectations, seen)
        labels = tuple(e.label for e in stale)
        if stale and self.strict_expectations:
            message = (
                f"[{self.contract}] expected deviation {stale[0].label} did not occur: {self.spec.name} passed on "
                f"{stale[0].dtype} examples; remove the entry (strict expectations)"
            )
            self.conclude(Verdict(
                Outcome.FAILED, message, rerun=self.rerun, message=message, unmet_expectations=labels
            ))
            pytest.fail(message, pytrace=False)
        context = self.context
        candidates = () if context is None else ((context.upstream, Outcome.UPSTREAM, "upstream"), (context.advice, Outcome.ADVICE, "advice"))
        noted = [(found, outcome, tier) for found, outcome, tier in candidates if found is not None]
        if noted:  # the one that fails this run (--advice=fail, --upstream=fail) first, else torch's bug
            found, outcome, tier = next((n for n in noted if n[2] in self.options.fail_on), noted[0])
            self._inform(found, outcome, tier, unmet=labels)  # no script: the example passes
            return
        self.conclude(Verdict(Outcome.PASSED, rerun=self.rerun, unmet_expectations=labels))

    def _require_checked(self) -> None:
        """No vacuous passes: when no example checked the property, skip as n/a with the reasons
        the contract gave; a contract that gave none has a bug, which fails loudly."""
        __tracebackhide__ = True
        assert self.context is not None
        if self.context.checked:
            return
        if self.context.interpreter_limits:
            self.not_run_here("the Triton interpreter cannot run it: " + "; ".join(self.context.interpreter_limits))
        if not self.context.unchecked:
            pytest.fail(
                f"[{self.contract}] no example checked anything and the contract gave no reason: a bug in "
                f"autograd-conformance, not in {self.spec.display_name}",
                pytrace=False,
            )
        self.not_applicable("nothing to check: " + "; ".join(self.context.unchecked))

    def _property(self, check: Callable[[Target, st.DataObject], None]) -> Callable[[Any], None]:
        """``check`` with its draws recorded and any raw error turned into a labelled failure."""

        marks = phase_marks(self.spec.display_name, self.spec.op.user_code(), self.spec.reference, self.spec.surrogate)
        own_steps = f"the {self.contract} contract's own steps (outside the Function and its reference)"

        def phase(frame: Any) -> str:
            return phase_at(frame, marks, own_steps)

        def property_(data: Any) -> None:
            self.corner_pending = True
            token = set_context(self.context)
            recorder = DrawRecorder(data)
            self.last_draws = recorder.draws
            stack_file = self.flight.stack_file if self.flight is not None else None
            try:
                # Whatever torch's global state is when the example starts (a spec module may
                # have turned grad mode off at import), it runs under the pinned defaults.
                with example_deadline(self.example_timeout, phase=phase, stack_file=stack_file) as interrupts:
                    try:
                        with pinned_global_state(self.pinned):
                            check(self, recorder)  # type: ignore[arg-type]
                    except KeyboardInterrupt:
                        if interrupts.real:
                            raise  # Ctrl-C: stop the run as usual
                        raise ExampleAborted(contract_failure(
                            f"{self.spec.display_name} raised KeyboardInterrupt itself, but should never "
                            "(it stops the caller's whole program)",
                        ), "interrupt") from None
            except ContractFailure as failure:
                # Reported while handling the Function's error (a contract that caught it itself): an
                # interpreter limit behind that error is the interpreter's gap, not a defect.
                if failure.__context__ is not None and self._interpreter_limited(failure.__context__):
                    return
                if self.compares_values and failure.compares_values:
                    self.blocked_by_undeclared_randomness()
                raise
            except Blocked as blocked:
                if self.compares_values and blocked.defect.owner == "reference" and blocked.case is not None:
                    # reference itself, failing there, would be blocked by this (values that differ
                    # from themselves, or read from outside the tensors): one owner for the chain
                    self.blocked_by_undeclared_randomness(blocked.case)
                if not self._kept_crash_block(blocked):
                    raise
            except (HypothesisException, ReplayMismatch, ExampleAborted):
                raise
            except ExampleTimeout as timeout:
                summary = f"example took longer than {timeout.seconds:g} s, but should finish [hung in {timeout.phase}]"
                raise ExampleAborted(contract_failure(
                    summary,
                    f"time budget: {timeout.seconds:g} s per example (--example-timeout, or register(..., timeout=) "
                    "for a Function that is legitimately slow)",
                    user_frames(timeout),
                ), "hang") from None
            except SystemExit as exiting:
                raise ExampleAborted(contract_failure(
                    f"sys.exit({exiting.code!r}) was called, but a Function should never exit the program "
                    f"[{phase(_innermost_frame(exiting))}]",
                    user_frames(exiting),
                ), "exit") from None
            except Crash as crash:
                self._unless_crash_blocked(self._crashed, crash)
            except Exception as error:
                if self._interpreter_limited(error):
                    return
                if self._unless_crash_blocked(self._crashed_in_user_code, error, phase(_innermost_frame(error))):
                    return
                if raised_in_reference(self.spec, error) and self._unless_crash_blocked(self._reference_raised, error):
                    return  # the reference contract's: this contract's other examples still run
                internal = suite_frame(error)
                if internal:
                    fail(
                        f"{type(error).__name__} raised inside autograd-conformance's own code while checking this contract, "
                        f"not in {self.spec.display_name}'s [{internal}]",
                        f"{type(error).__name__}: {error}",
                        "No frame of the Function's code is in the traceback: most likely a bug of the suite (or a "
                        "reference that is a torch function refusing the drawn case), not a finding about the Function. "
                        "Please report it with the traceback (--tb=long).",
                    )
                fail(
                    f"{type(error).__name__} raised while checking this contract [{self.spec.display_name}]",
                    f"{type(error).__name__}: {error}",
                    user_frames(error),
                )
            finally:
                reset_context(token)

        property_.__name__ = property_.__qualname__ = re.sub(r"\W", "_", f"{self.contract}__{self.spec.name}__{self.device}")
        return property_

    def blocked_by_undeclared_randomness(self, case: Case | None = None) -> None:
        """One defect, one failure: a value that differs from what it is compared with, on a
        Function that gives other values for the same inputs twice without declaring it, is the
        determinism contract's (:func:`conformance.engine.numerics.undeclared_randomness` on
        ``case``, the failing example's by default): raise ``Blocked`` by it. The runner asks on
        every failure of a contract declared ``compares_values``; others ask where they compare."""
        if case is None and self.context is not None:
            case = self.context.case
        if self.contract == "determinism" or case is None or case == self.randomness_ruled_out:
            return  # a contract that asked itself is not asked again by the runner for the same failure
        with pinned_global_state(self.pinned):
            defect = undeclared_randomness(case)
        if defect is not None and defect.owner != self.contract:  # layouts' own finding stands
            raise Blocked(defect, case)
        self.randomness_ruled_out = case

    def blocked_by_wrong_gradients(self, case: Case, found: str) -> None:
        """One defect, one failure: a gradient found wrong (``found``) on ``case`` that is also wrong
        in float64 on the same inputs by the gradcheck contract's own rules (finite differences, or
        the declared surrogate's gradient) is gradcheck's defect: raise ``Blocked`` by it. A value
        that differs from itself is determinism's first. Nothing is blocked without float64."""
        self.blocked_by_undeclared_randomness(case)
        if torch.float64 not in self.dtypes():
            return
        exact = case.with_dtype(torch.float64)
        if self.spec.surrogate is not None:
            execution = self.preflight(case, dtype=torch.float64)
            blocked_by_wrong_surrogate_gradients(exact, execution.grads, execution.grad_outputs_before, found=found)
            return
        args = exact.args()
        wrt_positions = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor) and a.requires_grad]
        call = function_of_tensors(exact, args, wrt_positions)
        blocked_by_wrong_first_derivatives(exact, call, [args[i] for i in wrt_positions], found=found)

    def _crashed(self, crash: Crash, owner: str | None = None) -> None:
        """A forward or backward that raised: the failure of the contract that owns the crash
        (:func:`conformance.engine.evaluate.crash_owner`), a "blocked by" line for any other."""
        __tracebackhide__ = True
        cause = crash.__cause__ or crash
        if self._interpreter_limited(cause) or self._outside_the_domain(crash):
            return
        if isinstance(crash, BackwardError):
            summary = crash.summary
        else:
            summary = forward_raised(cause, self.spec.display_name)
        if owner is None:
            owner = crash_owner(crash.case, self.contract, cause) if crash.case is not None else self.contract
        if owner != self.contract:
            raise Blocked(Defect(owner, summary), crash.case, crash=True)
        fail(summary, f"{type(cause).__name__}: {cause}", user_frames(cause), case=crash.case)

    def _reference_raised(self, error: BaseException) -> NoReturn:
        """The spec's reference (or surrogate) raised while this contract used it: the reference
        contract's finding where the drawn case alone makes it raise (blocked by it here), else
        this contract's, worded as the spec's error (a case the contract derived: other
        magnitudes, a dtype)."""
        __tracebackhide__ = True
        case = self.context.case if self.context is not None else None
        summary = reference_raised(self.spec, error)
        if self.contract != "reference" and case is not None and reference_error(case) is not None:
            raise Blocked(Defect("reference", summary), case, crash=True)
        fail(summary, f"{type(error).__name__}: {error}", REFERENCE_BLAME, user_frames(error), case=case, compares_values=False)

    def _outside_the_domain(self, crash: Crash) -> bool:
        """Whether ``crash`` is a forward that raised on a case outside the op's domain, where the
        example checks nothing: the spec's reference has no answer there either
        (:func:`conformance.engine.numerics.reference_has_no_answer`: an inverse of the singular
        matrix an expanded layout draws), or torch.linalg declared a matrix singular or not
        positive-definite in the case's precision at large magnitudes, on a case that runs at
        ordinary ones (a Cholesky of a a^T + n I whose n I is below rounding at 3e4)."""
        if not isinstance(crash, ForwardError) or crash.case is None:
            return False
        case, cause = crash.case, crash.__cause__ or crash
        why = reference_has_no_answer(case)
        if why is not None:
            why = f"the spec's reference has no answer either: {why}"
        elif isinstance(cause, LINALG_ERROR) and at_ordinary_magnitudes(case) != case:
            try:
                execute(at_ordinary_magnitudes(case), backward=False)
            except ForwardError:
                return False  # raises at every magnitude: a crash
            why = f"torch.linalg finds the matrix numerically singular at these magnitudes in {str(case.dtype).removeprefix('torch.')}"
        if why is None:
            return False
        self.not_checked(
            f"forward raised {raised(cause)} on a case outside the op's domain ({why}); leave such inputs out with a "
            "Tensor domain= or a Derived input to check more"
        )
        return True

    def blocked_if_owned_elsewhere(self, error: BaseException) -> None:
        """For a contract that words an error it met itself: when ``error`` was raised inside the
        Function's own forward or backward and the drawn case alone reproduces it, raise
        ``Blocked`` by the contract that owns that crash (:func:`conformance.engine.evaluate.crash_owner`);
        return when the error is this contract's finding, as the runner's own wording does."""
        __tracebackhide__ = True
        marks = phase_marks(self.spec.display_name, self.spec.op.user_code(), self.spec.reference, self.spec.surrogate)
        self._crashed_in_user_code(error, phase_at(_innermost_frame(error), marks, ""))

    def _crashed_in_user_code(self, error: BaseException, where: str) -> None:
        """An error raised inside the Function's forward or backward while the contract drove it
        itself: when the drawn case alone reproduces it, it is a crash with an owner (the runner
        blocks this contract by it); otherwise it is this contract's finding."""
        __tracebackhide__ = True
        case = self.context.case if self.context is not None else None
        kind = {"forward": ForwardError, "backward": BackwardError}.get(where.split(" of ", 1)[0])
        if case is None or kind is None:
            return
        owner = crash_owner(case, self.contract, error)
        if owner == self.contract:
            return
        crash = kind(f"{type(error).__name__}: {error}", case)
        if isinstance(crash, BackwardError):
            crash.summary = backward_raised(error, self.spec.display_name)
        crash.__cause__ = error
        self._crashed(crash, owner)

    def _interpreter_limited(self, error: BaseException) -> bool:
        """Whether ``error`` is a Triton interpreter limit (bfloat16, a libdevice function without a
        fallback): such an example is not checked, and the test never fails for it."""
        limit = interpreter_limit(error)
        if limit is None:
            return False
        if self.context is not None:
            self.context.interpreter_limits.setdefault(str(limit), None)
        return True


def _intermittent(flaky: FlakyFailure) -> BaseException:
    """What a Function that failed once, and not when Hypothesis ran the same example again,
    found: the first failure or block it raised (reading memory it does not own, a race, noise),
    told as intermittent; Hypothesis' own error when it was something else."""
    # The contract's own failure first: a block among the origins must not hide it.
    first = next((e for e in flaky.exceptions if isinstance(e, ContractFailure)), None) or next(
        (e for e in flaky.exceptions if isinstance(e, Blocked)), None
    )
    if isinstance(first, ContractFailure):
        first.head = (
            f"{first.head}\n  intermittent: it did not fail again when the same example ran a second time (memory "
            "read outside the Function's tensors, a race, or randomness)"
        )
        first.args = (first.head,)
        return first
    if isinstance(first, Blocked):
        return first
    return flaky


def _innermost_frame(error: BaseException) -> Any:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


