"""The property runner every contract test uses.

Each collected test (one Function x one contract x one device) receives a :class:`Target`.
``target.run(check)`` wraps ``check(target, data)`` in a Hypothesis test with the run's settings
and a seed derived from (seed option, Function, contract, device) -- never from the node id or
the worker -- so the same seed gives the same examples and verdicts serially and under xdist.
"""

from __future__ import annotations

import re
import traceback
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import HypothesisException

from conformance.defects import Blocked, ForwardError
from conformance.report import ContractFailure, TestContext, fail, reset_context, set_context
from conformance.spec import Spec
from strategies.cases import Case, cases

__all__ = ["PROFILES", "STATUS_PROPERTY", "RunOptions", "Target", "example_seed"]

# The key under which a test records a non-plain outcome ("blocked by <contract>", "waived") in
# ``item.user_properties``: it travels with the report, also from xdist workers.
STATUS_PROPERTY = "conformance_status"

PROFILES: dict[str, dict[str, Any]] = {
    # database=None everywhere: a stored failure replayed on one machine only would make
    # verdicts depend on history. The explicit per-test seed makes every profile reproducible.
    "dev": {"max_examples": 10},
    "ci": {"max_examples": 10, "derandomize": False},
    "thorough": {"max_examples": 100},
}


@dataclass(frozen=True)
class RunOptions:
    """The plugin's options that shape every property run."""

    profile: str = "dev"
    max_examples: int | None = None
    seed: int = 0
    impl: str = "reference_ops"
    dtypes: tuple[torch.dtype, ...] | None = None

    def hypothesis_settings(self) -> settings:
        values = dict(PROFILES[self.profile])
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
    nodeid: str = ""
    context: TestContext | None = None
    user_properties: list[tuple[str, object]] = field(default_factory=list)

    def dtypes(self, wanted: Sequence[torch.dtype] | None = None) -> tuple[torch.dtype, ...]:
        """The spec's dtypes, narrowed by ``--dtypes`` and by ``wanted``."""
        chosen = self.spec.dtypes
        if self.options.dtypes is not None:
            chosen = tuple(d for d in chosen if d in self.options.dtypes)
        if wanted is not None:
            chosen = tuple(d for d in chosen if d in wanted)
        return chosen

    def require_float64(self, why: str) -> None:
        """Skip (with the reason) unless the spec lists float64 and ``--dtypes`` keeps it."""
        if not self.spec.supports_float64:
            pytest.skip(f"{self.spec.name!r} does not list torch.float64 in dtypes; {why}")
        if self.options.dtypes is not None and torch.float64 not in self.options.dtypes:
            pytest.skip(f"float64 is excluded by --dtypes; {why}")

    def draw_case(self, data: st.DataObject, **kwargs: Any) -> Case:
        """Draw a case on this target's device (labelled ``case`` in Hypothesis reports)."""
        kwargs.setdefault("dtypes", self.dtypes())
        case = data.draw(cases(self.spec, device=self.device, **kwargs), label="case")
        if self.context is not None:
            self.context.case = case
        return case

    def run(self, check: Callable[[Target, st.DataObject], None], *, max_examples: int | None = None) -> None:
        """Run ``check`` as a Hypothesis property with this run's settings and seed."""
        __tracebackhide__ = True
        run_settings = self.options.hypothesis_settings()
        if max_examples is not None and self.options.max_examples is None:
            run_settings = settings(run_settings, max_examples=max_examples)
        test_seed = example_seed(self.options.seed, self.spec.name, self.contract, self.device)
        self.context = TestContext(
            contract=self.contract,
            spec=self.spec,
            device=self.device,
            nodeid=self.nodeid,
            rerun=f"pytest {self.nodeid!r} --impl={self.options.impl} --seed={self.options.seed}"
            f" --profile={self.options.profile}",
        )

        def property_(data: st.DataObject) -> None:
            token = set_context(self.context)
            try:
                check(self, data)
            except (ContractFailure, Blocked, HypothesisException):
                raise
            except ForwardError as error:
                cause = error.__cause__ or error
                fail(
                    f"forward raised {type(cause).__name__}, but should return outputs [{self.spec.fn.__qualname__}.forward]",
                    f"{type(cause).__name__}: {cause}",
                    _user_frames(cause),
                )
            except Exception as error:
                fail(
                    f"{type(error).__name__} raised while checking this contract [{self.spec.fn.__qualname__}]",
                    f"{type(error).__name__}: {error}",
                    _user_frames(error),
                )
            finally:
                reset_context(token)

        property_.__name__ = property_.__qualname__ = re.sub(r"\W", "_", f"{self.contract}__{self.spec.name}__{self.device}")
        try:
            run_settings(seed(test_seed)(given(data=st.data())(property_)))()
        except Blocked as blocked:
            self.skip_blocked(blocked)

    def skip_blocked(self, blocked: Blocked) -> None:
        """Skip with one labelled line: the owner, the defect, the case and the rerun command."""
        __tracebackhide__ = True
        self.user_properties.append((STATUS_PROPERTY, f"blocked by {blocked.defect.owner}"))
        case = f"; case: {blocked.case.describe()}" if blocked.case is not None else ""
        rerun = f"; rerun: {self.context.rerun}" if self.context is not None and self.context.rerun else ""
        pytest.skip(f"blocked by {blocked.defect.owner}: {blocked.defect.summary}; see {blocked.defect.owner}{case}{rerun}")


def _user_frames(error: BaseException, limit: int = 4) -> str:
    """The innermost frames of ``error``'s traceback outside this suite, Hypothesis and torch:
    where in the user's code it was raised."""
    frames = [
        f for f in traceback.extract_tb(error.__traceback__)
        if not any(part in f.filename for part in ("/conformance/", "/hypothesis/", "/torch/", "/strategies/"))
    ]
    if not frames:
        return ""
    return "raised at:\n" + "".join(traceback.format_list(frames[-limit:])).rstrip()
