"""The run's options, typed and checked once: :class:`RunOptions`.

The start-up plugin (``autograd_conformance_plugin``) owns the options table -- flags, ini keys,
kinds, choices, defaults -- since it must describe them without importing the suite; it reads
each value once (command line, else ini file, else default) and hands the plain values here.
:func:`parse_options` checks what the table cannot (ranges, CUDA, a writable report folder) and
builds the frozen :class:`RunOptions` every other module of the plugin reads. Every problem is a
:class:`pytest.UsageError` that echoes the bad value and says how to fix it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from autograd_conformance_plugin import OPTIONS, PROFILES, OptionValue
from conformance.engine import runner
from conformance.plugin.devices import cuda_findings, cuda_usable

__all__ = ["RunOptions", "parse_options", "parse_shard", "report_base"]

_DEFAULTS: Mapping[str, OptionValue] = {option.name: option.default for option in OPTIONS}


@dataclass(frozen=True)
class RunOptions:
    """Every option of one run, typed (see the table in ``autograd_conformance_plugin``)."""

    impl: str
    devices: tuple[str, ...]  # --device: auto is ("cpu", "cuda")
    gpus_per_worker: int
    profile: str
    max_examples: int | None
    seed: int
    dtypes: tuple[str, ...] | None  # names; None: every dtype the spec lists
    contracts: tuple[str, ...]  # empty: every contract
    skip_contracts: tuple[str, ...]
    expectations: str | None
    strict_expectations: bool
    example_timeout: float | None  # None: no limit
    threads: int
    compile_backends: tuple[str, ...]
    isolate: bool
    report: Path | None  # the reports' base path, resolved against where pytest ran
    shard: tuple[int, int] | None = None  # (K, N) of --shard=K/N, 1 <= K <= N; None: the whole run
    advice: str = "report"  # --advice: report | fail
    upstream: str = "report"  # --upstream: report | fail
    author_coverage: bool = False  # --author-coverage: what of each Function's code no example ran

    @property
    def default_threads(self) -> bool:
        return self.threads == _DEFAULTS["threads"]

    def torch_dtypes(self) -> tuple[torch.dtype, ...] | None:
        if self.dtypes is None:
            return None
        return tuple(getattr(torch, name) for name in self.dtypes)

    def engine(self) -> runner.RunOptions:
        """What the runner needs of them."""
        return runner.RunOptions(
            profile_settings=PROFILES[self.profile],
            max_examples=self.max_examples,
            seed=self.seed,
            impl=self.impl,
            dtypes=self.torch_dtypes(),
            example_timeout=self.example_timeout,
            threads=self.threads,
            compile_backends=self.compile_backends,
            fail_on=frozenset({"defect"} | {tier for tier in ("advice", "upstream") if getattr(self, tier) == "fail"}),
        )

    def repro_dir(self) -> Path | None:
        """Where repro scripts go when a report is written (PATH.repro/)."""
        return None if self.report is None else Path(f"{self.report}.repro")


def parse_options(values: Mapping[str, OptionValue], *, run_dir: Path) -> RunOptions:
    """:class:`RunOptions` from the start-up plugin's values (by option name; a missing one takes
    its default); ``run_dir`` is where pytest ran (relative paths are resolved against it)."""
    merged = {**_DEFAULTS, **values}
    unknown = sorted(set(values) - set(_DEFAULTS))
    if unknown:
        raise ValueError(f"parse_options: unknown options {unknown}")
    max_examples = _optional_int(merged, "max_examples")
    if max_examples is not None and max_examples < 1:
        raise pytest.UsageError(f"--max-examples={max_examples} must be >= 1")
    device = _text(merged, "device")
    if device == "cuda" and not cuda_usable():
        # A GPU job that silently skips everything would pass while testing nothing.
        raise pytest.UsageError(
            f"--device=cuda, but CUDA is not usable here: {cuda_findings()}. Run on a machine with a working "
            "CUDA driver and a CUDA build of torch, or pass --device=cpu (or auto)"
        )
    threads = _int(merged, "threads")
    if threads < 1:
        raise pytest.UsageError(f"--threads={threads} must be >= 1 (torch intra-op threads per process)")
    gpus_per_worker = _int(merged, "gpus_per_worker")
    if gpus_per_worker < 1:
        raise pytest.UsageError(f"--gpus-per-worker={gpus_per_worker} must be >= 1")
    dtypes = _names(merged, "dtypes")
    report = merged["report"]
    options = RunOptions(
        impl=_text(merged, "impl"),
        devices=("cpu", "cuda") if device == "auto" else (device,),
        gpus_per_worker=gpus_per_worker,
        profile=_text(merged, "profile"),
        max_examples=max_examples,
        seed=_int(merged, "seed"),
        dtypes=dtypes or None,
        contracts=_names(merged, "contracts"),
        skip_contracts=_names(merged, "skip_contracts"),
        expectations=None if merged["expectations"] is None else _text(merged, "expectations"),
        strict_expectations=bool(merged["strict_expectations"]),
        example_timeout=_timeout(merged),
        threads=threads,
        compile_backends=_names(merged, "compile_backends"),
        isolate=bool(merged["isolate"]),
        report=None if report is None else run_dir / report_base(_text(merged, "report")),
        shard=None if merged["shard"] is None else parse_shard(_text(merged, "shard")),
        advice=_text(merged, "advice"),
        upstream=_text(merged, "upstream"),
        author_coverage=bool(merged["author_coverage"]),
    )
    if options.report is not None:
        _check_report_path(str(report), options.report)
    return options


def parse_shard(text: str) -> tuple[int, int]:
    """``"K/N"`` -> (K, N), slice K (from 1) of N."""
    index, slash, count = text.partition("/")
    if not (slash and index.strip().isdigit() and count.strip().isdigit()):
        raise pytest.UsageError(f"--shard={text!r} is not K/N (slice K of N, counted from 1); pass e.g. --shard=2/3")
    k, n = int(index), int(count)
    if not 1 <= k <= n:
        raise pytest.UsageError(f"--shard={text!r}: K must be between 1 and N ({n}); pass e.g. --shard=1/{max(n, 1)}")
    return k, n


def check_contract_names(options: RunOptions, known: list[str]) -> None:
    """--contracts and --skip-contracts name contracts of the suite (known once it is imported)."""
    for flag, names in (("--contracts", options.contracts), ("--skip-contracts", options.skip_contracts)):
        unknown = [c for c in names if c not in known]
        if unknown:
            raise pytest.UsageError(f"{flag}: unknown contracts {unknown}; choose from {', '.join(sorted(known))}")


def _text(values: Mapping[str, OptionValue], name: str) -> str:
    value = values[name]
    if not isinstance(value, str):
        raise TypeError(f"option {name!r}: expected a str, got {value!r}")
    return value


def _int(values: Mapping[str, OptionValue], name: str) -> int:
    value = values[name]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"option {name!r}: expected an int, got {value!r}")
    return value


def _optional_int(values: Mapping[str, OptionValue], name: str) -> int | None:
    return None if values[name] is None else _int(values, name)


def _names(values: Mapping[str, OptionValue], name: str) -> tuple[str, ...]:
    value = values[name]
    if not isinstance(value, tuple) or not all(isinstance(item, str) for item in value):
        raise TypeError(f"option {name!r}: expected a tuple of str, got {value!r}")
    return value


def _timeout(values: Mapping[str, OptionValue]) -> float | None:
    value = values["example_timeout"]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"option 'example_timeout': expected a number, got {value!r}")
    seconds = float(value)
    if not 0 <= seconds < float("inf"):
        raise pytest.UsageError(
            f"--example-timeout={value!r} is not a number of seconds >= 0; pass e.g. --example-timeout=60 (0: no limit)"
        )
    return seconds or None


REPORT_SUFFIXES = (".json", ".md", ".html")


def report_base(raw: str) -> str:
    """The PATH of PATH.json/.md/.html: ``run.json`` names the same three files as ``run``
    (run.json, run.md, run.html -- never run.json.json)."""
    for suffix in REPORT_SUFFIXES:
        if raw.endswith(suffix) and len(raw) > len(suffix) and not raw.endswith("/" + suffix):
            return raw[: -len(suffix)]
    return raw


def _check_report_path(raw: str, base: Path) -> None:
    """--conformance-report's folder is created and must be writable before the run, not after it."""
    problem = None
    try:
        base.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=base.parent, prefix=".conformance-report-probe-"):
            pass
    except OSError as error:
        problem = f"cannot write into {str(base.parent)!r} ({type(error).__name__}: {error})"
    for suffix in REPORT_SUFFIXES:
        if problem is None and Path(f"{base}{suffix}").is_dir():
            problem = f"{str(base) + suffix!r} is a directory"
    if problem is None and Path(f"{base}.repro").exists() and not Path(f"{base}.repro").is_dir():
        problem = f"{str(base) + '.repro'!r} (the repro scripts' folder) is a file"
    if problem is not None:
        raise pytest.UsageError(
            f"--conformance-report={raw}: {problem}; pass a path in a writable folder, "
            "e.g. --conformance-report=reports/conformance"
        )
