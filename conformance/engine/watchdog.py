"""Time budgets and crash records: a hostile Function never takes the run down.

Two mechanisms, both per example:

* :func:`example_deadline` gives each example a time budget. When it runs out, a ``SIGALRM``
  handler raises :class:`ExampleTimeout` in the main thread, naming the phase that was running
  (forward, backward, the reference, gradcheck...) from the interrupted frames; the runner turns
  that into the test's failure and the run goes on. A hang that never returns to Python (a
  native loop, a wedged kernel, a blocked signal) cannot be interrupted that way: when a second
  budget has passed too, ``faulthandler`` writes every thread's stack and ends the process.
  That is a crash. Inside :func:`one_hard_timer` (a test's examples) that timer stays armed from
  example to example and is re-armed only when it would fire too early or more than
  :data:`HARD_SLACK` late (arming it starts a thread, ~50 us: armed per example, 1% of the main job).
* A :class:`FlightRecorder` writes what the process is running (test, case, deadline) to a
  small file before every example, and points faulthandler's fatal-error dump at a file next to
  it. When the process dies -- ``os._exit``, a segfault, the hard deadline -- whoever watches it
  (the ``--isolate`` parent, the xdist controller) reads both and reports the crash as the
  failure of that test, with its case (:func:`describe_crash`).

Signals only reach the main thread and there is no ``SIGALRM`` on Windows: there the soft
deadline is skipped and only the hard one applies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import faulthandler
import functools
import hashlib
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import CodeType, FrameType
from typing import IO, Any

__all__ = [
    "DEFAULT_EXAMPLE_TIMEOUT",
    "ExampleAborted",
    "ExampleTimeout",
    "FlightRecorder",
    "Interrupts",
    "RunEnding",
    "describe_crash",
    "example_deadline",
    "hard_deadline",
    "note_run_ending",
    "one_hard_timer",
    "phase_at",
    "run_endings",
    "run_endings_in",
]

# Seconds one example may take before it fails as a hang. Generous: the slowest example of the
# bundled catalogue at --profile=thorough takes well under a second; an interpreted Triton
# kernel or a large case may take tens of seconds. Lower it (--example-timeout) to find hangs
# quickly; raise it per spec (register(..., timeout=...)) for slow kernels.
DEFAULT_EXAMPLE_TIMEOUT = 300.0
# Inside one_hard_timer, the hard deadline fires between its budget and this much later.
HARD_SLACK = 1.0


class ExampleTimeout(BaseException):
    """An example ran past its budget. A BaseException, so that a Function's own ``except
    Exception`` cannot swallow it and Hypothesis does not shrink (re-run) a hang."""

    def __init__(self, seconds: float, phase: str) -> None:
        super().__init__(f"no result within {seconds:g} s, in {phase}")
        self.seconds = seconds
        self.phase = phase


class ExampleAborted(BaseException):
    """The example must end the test now (a hang, a Function calling ``sys.exit``); carries the
    finished failure report and the act (a :class:`RunEnding`'s). Passes through Hypothesis
    without shrinking."""

    def __init__(self, failure: AssertionError, act: str) -> None:
        super().__init__(str(failure))
        self.failure = failure
        self.act = act


@dataclass(frozen=True)
class PhaseMarks:
    """The code objects that name a phase when found among the frames of a stuck example."""

    user: dict[CodeType, str]  # code -> "forward of MyFn", "the reference", ...
    outer: dict[str, str]  # function name in torch.autograd.gradcheck -> "gradcheck"


def phase_marks(
    name: str, user_code: Mapping[str, Callable[..., Any]], reference: Callable[..., Any] | None,
    surrogate: Callable[..., Any] | None,
) -> PhaseMarks:
    """The phases of one spec: the user's code (phase label -> function, see
    :meth:`conformance.spec.targets.OpAdapter.user_code`), its reference and surrogate."""
    user: dict[CodeType, str] = {}
    for method, func in user_code.items():
        code = _code_of(func)
        if code is not None:
            user.setdefault(code, f"{method} of {name}")
    for label, extra in (("the reference", reference), ("the surrogate", surrogate)):
        code = _code_of(extra)
        if code is not None:
            user.setdefault(code, label)
    return PhaseMarks(user=user, outer={"gradcheck": "gradcheck", "gradgradcheck": "gradgradcheck"})


def _code_of(func: Any) -> CodeType | None:
    func = getattr(func, "__func__", func)
    code = getattr(func, "__code__", None)
    return code if isinstance(code, CodeType) else None


def phase_at(frame: FrameType | None, marks: PhaseMarks, fallback: str) -> str:
    """Which phase ``frame`` (the innermost frame of a stuck example) is in, e.g.
    ``"backward of MyFn (my_ops.py:41), called by gradgradcheck"``; ``fallback`` when no user
    code is on the stack."""
    inner: str | None = None
    outer: str | None = None
    while frame is not None:
        code = frame.f_code
        if inner is None and code in marks.user:
            inner = f"{marks.user[code]} ({Path(code.co_filename).name}:{frame.f_lineno})"
        if outer is None and code.co_name in marks.outer and "autograd" in code.co_filename:
            outer = marks.outer[code.co_name]
        frame = frame.f_back
    if inner is None:
        return f"{outer} (outside the Function)" if outer else fallback
    return f"{inner}, called by {outer}" if outer else inner


def _soft_deadline_usable() -> bool:
    return hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()


@dataclass
class Interrupts:
    """Whether a real Ctrl-C (SIGINT) arrived during the block: a ``KeyboardInterrupt`` without
    one was raised by the Function itself."""

    real: bool = False


@contextlib.contextmanager
def example_deadline(
    seconds: float | None, *, phase: Callable[[FrameType | None], str], stack_file: IO[str] | None = None
) -> Iterator[Interrupts]:
    """Run the block with a budget of ``seconds`` (None: unbounded).

    Past the budget, :class:`ExampleTimeout` is raised where the block is (``phase(frame)``
    names it); at twice the budget (the block never returned to Python, so the exception could
    not be raised), faulthandler dumps the stacks to ``stack_file`` (stderr when None) and ends
    the process. Yields an :class:`Interrupts` that tells a real Ctrl-C from a
    ``KeyboardInterrupt`` the Function raised.
    """
    interrupts = Interrupts()
    with contextlib.ExitStack() as stack:
        if seconds is not None:
            stack.enter_context(hard_deadline(2 * seconds, stack_file))
        if _soft_deadline_usable():
            stack.enter_context(_handling(signal.SIGINT, _noting_interrupt(interrupts, signal.getsignal(signal.SIGINT))))
            if seconds is not None:

                def on_alarm(signum: int, frame: FrameType | None) -> None:
                    raise ExampleTimeout(seconds, phase(frame))

                stack.enter_context(_handling(signal.SIGALRM, on_alarm))
                signal.setitimer(signal.ITIMER_REAL, seconds)
                stack.callback(signal.setitimer, signal.ITIMER_REAL, 0)
        yield interrupts


def _noting_interrupt(interrupts: Interrupts, previous: Any) -> Callable[[int, FrameType | None], None]:
    def on_interrupt(signum: int, frame: FrameType | None) -> None:
        interrupts.real = True
        if callable(previous):
            previous(signum, frame)
        else:
            raise KeyboardInterrupt

    return on_interrupt


@contextlib.contextmanager
def _handling(signum: signal.Signals, handler: Callable[[int, FrameType | None], None]) -> Iterator[None]:
    previous = signal.signal(signum, handler)
    try:
        yield
    finally:
        signal.signal(signum, previous)


@contextlib.contextmanager
def hard_deadline(seconds: float, stack_file: IO[str] | None) -> Iterator[None]:
    """End the process (after dumping every thread's stack) if the block runs ``seconds`` (inside
    :func:`one_hard_timer`: up to :data:`HARD_SLACK` later)."""
    target = stack_file if stack_file is not None else _real_stderr()
    if target is None:  # nowhere faulthandler can write (stderr replaced, no real one): no hard deadline
        yield
        return
    if _HARD_TIMER.users:
        _HARD_TIMER.at_least(seconds, target)
        yield
        return
    faulthandler.dump_traceback_later(seconds, exit=True, file=target)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


class _HardTimer:
    """faulthandler's one timer, kept armed across the blocks of :func:`one_hard_timer`."""

    def __init__(self) -> None:
        self.users = 0
        self.fires_at: float | None = None  # time.monotonic() when it ends the process
        self.target: IO[str] | None = None

    def at_least(self, seconds: float, target: IO[str]) -> None:
        now = time.monotonic()
        fires_at = self.fires_at
        if fires_at is None or target is not self.target or not now + seconds <= fires_at <= now + seconds + HARD_SLACK:
            faulthandler.dump_traceback_later(seconds + HARD_SLACK, exit=True, file=target)
            self.fires_at, self.target = now + seconds + HARD_SLACK, target

    def cancel(self) -> None:
        if self.fires_at is not None:
            faulthandler.cancel_dump_traceback_later()
        self.fires_at = self.target = None


_HARD_TIMER = _HardTimer()


@contextlib.contextmanager
def one_hard_timer() -> Iterator[None]:
    """Within the block, :func:`hard_deadline` keeps faulthandler's timer armed between blocks
    (a test's examples, and Hypothesis' work between them) instead of arming and cancelling it
    around each; cancelled when the block ends, so nothing is armed between tests (a debugger)."""
    _HARD_TIMER.users += 1
    try:
        yield
    finally:
        _HARD_TIMER.users -= 1
        if not _HARD_TIMER.users:
            _HARD_TIMER.cancel()


def _real_stderr() -> IO[str] | None:
    """A stderr with a file descriptor (faulthandler needs one; a captured sys.stderr has none)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (OSError, ValueError, AttributeError):
            continue
    return None


class FlightRecorder:
    """What this process is running, kept in a file that outlives the process.

    ``<dir>/<name>.json`` holds the running test and example; ``<dir>/<name>.stack`` receives
    faulthandler's dumps (fatal signals, the hard deadline). Both are rewritten per test.
    """

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.record_path = directory / f"{name}.json"
        self.stack_path = directory / f"{name}.stack"
        self._record_fd = os.open(self.record_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.stack_file: IO[str] = open(self.stack_path, "w+", encoding="utf-8")  # kept open: faulthandler writes to it
        self._test_json = "{"
        self._written = 0

    def catch_fatal_signals(self) -> None:
        """Send faulthandler's fatal-signal dumps (segfault, abort) to the stack file."""
        faulthandler.enable(file=self.stack_file, all_threads=True)

    def start_test(self, nodeid: str, contract: str, function: str, device: str, rerun: str) -> None:
        test = {"nodeid": nodeid, "contract": contract, "function": function, "device": device, "rerun": rerun}
        self._test_json = json.dumps(test)[:-1] + ", "  # encoded once per test, completed per case
        self.stack_file.seek(0)
        self.stack_file.truncate()
        self.stack_file.flush()
        # Truncated once per test: a child forked for an earlier one (--isolate) may have left a
        # longer record than this process knows of.
        os.ftruncate(self._record_fd, 0)
        self._written = 0
        self.start_example("", None)

    def start_example(self, case: str, timeout: float | None) -> None:
        now = time.time()
        deadline = now + timeout if timeout is not None else None
        example = json.dumps({"case": case, "started": now, "deadline": deadline})
        self._write(f"{self._test_json}{example[1:]}".encode())

    def note_run_ending(self, function: str, device: str, ending: RunEnding) -> RunEnding:
        return note_run_ending(self.record_path.parent, function, device, ending)

    def run_endings_of(self, function: str, device: str) -> list[RunEnding]:
        return run_endings_in(self.record_path.parent, function, device)

    def _write(self, data: bytes) -> None:
        # Padded with spaces over a longer earlier record of this test (still one JSON document):
        # one system call per case drawn, not a truncate and a write.
        os.pwrite(self._record_fd, data.ljust(self._written), 0)
        self._written = max(self._written, len(data))

    def close(self) -> None:
        os.close(self._record_fd)
        self.stack_file.close()


@dataclass(frozen=True)
class RunEnding:
    """An act that ends an example's test, not just the example, met by ``contract``: a hang
    (``act="hang"``), ``sys.exit`` (``"exit"``), a KeyboardInterrupt the Function raised itself
    (``"interrupt"``), or a process death (``"death"``: ``os._exit``, a segfault)."""

    act: str
    contract: str
    summary: str
    case: str


@functools.lru_cache(maxsize=1024)  # asked before every test
def _endings_dir(directory: Path, function: str, device: str) -> Path:
    digest = hashlib.sha256(f"{function}|{device}".encode()).hexdigest()[:24]
    return directory / "endings" / digest


def note_run_ending(directory: Path, function: str, device: str, ending: RunEnding) -> RunEnding:
    """Note in the run's flight folder (shared by every process of the run) that ``ending.contract``
    met ``ending`` on ``function`` and ``device`` (a contract's first note stays), and return the
    Function's first ending in contract order noted so far: this one, or an earlier contract's, by
    which this test is then blocked. One act, one failure, the same serially and under xdist:
    tests run in contract order within a Function, and where two workers met the act at once, the
    run's matrix keeps the first contract's failure (:func:`run_endings`)."""
    folder = _endings_dir(directory, function, device)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"function": function, "device": device, **dataclasses.asdict(ending)}
    try:
        with open(folder / f"{ending.contract}.json", "x", encoding="utf-8") as file:
            json.dump(record, file)
    except FileExistsError:
        pass
    return run_endings_in(directory, function, device)[0]


def run_endings_in(directory: Path, function: str, device: str) -> list[RunEnding]:
    """The endings noted for ``function`` on ``device``, in contract order."""
    return _read_endings(_endings_dir(directory, function, device).glob("*.json"))


def run_endings(directory: Path) -> dict[tuple[str, str], list[RunEnding]]:
    """Every ending noted in the run, per (function, device), each list in contract order."""
    found: dict[tuple[str, str], list[Path]] = {}
    for path in (directory / "endings").glob("*/*.json"):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        found.setdefault((str(record.get("function", "")), str(record.get("device", ""))), []).append(path)
    return {row: _read_endings(paths) for row, paths in found.items()}


def _read_endings(paths: Iterable[Path]) -> list[RunEnding]:
    endings = []
    for path in paths:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # being written by another process: its writer reports it
            continue
        endings.append(RunEnding(*(str(record.get(key, "")) for key in ("act", "contract", "summary", "case"))))
    return sorted(endings, key=lambda ending: ending.contract)


@dataclass(frozen=True)
class Crash:
    """What a dead process was running, read back from its flight record."""

    nodeid: str
    contract: str
    function: str
    device: str
    case: str
    rerun: str
    summary: str
    details: str
    hung: bool = False  # ended by the hard deadline (a hang outside Python), not by a fatal signal

    def noted(self, directory: Path) -> RunEnding:
        """Note this crash as the Function's run ending (:func:`note_run_ending`); the ending
        noted first, this one's or another contract's."""
        ending = RunEnding("hang" if self.hung else "death", self.contract, self.summary, self.case)
        return note_run_ending(directory, self.function, self.device, ending)


def describe_crash(directory: Path, name: str, *, exit_status: str = "") -> Crash | None:
    """The crash of process ``name`` from its flight record, or None when it has none.

    ``exit_status`` is what the watcher knows about the death ("killed by SIGSEGV", "exited
    with code 3"); the stack dump tells a hard timeout from a fatal signal.
    """
    try:
        record = json.loads((directory / f"{name}.json").read_text(encoding="utf-8") or "{}")
    except (OSError, ValueError):
        return None
    if not record.get("nodeid"):
        return None
    try:
        stack = (directory / f"{name}.stack").read_text(encoding="utf-8", errors="replace")
    except OSError:
        stack = ""
    if stack.startswith("Timeout ("):
        summary = "the example did not return within its time budget, so the process was ended (a hang outside Python)"
    else:
        summary = "the process died while running this test" + (f" ({exit_status})" if exit_status else "")
    details = _innermost_frames(stack)
    return Crash(
        nodeid=record["nodeid"], contract=record.get("contract", "?"), function=record.get("function", "?"),
        device=record.get("device", "?"), case=record.get("case", ""), rerun=record.get("rerun", ""), summary=summary, details=details,
        hung=stack.startswith("Timeout ("),
    )


def _innermost_frames(stack: str, limit: int = 6) -> str:
    """The test thread's innermost frames from a faulthandler dump (they name the phase): the
    thread running this suite's runner, else the first one dumped."""
    blocks: list[list[str]] = []
    for line in stack.splitlines():
        if line.startswith(("Current thread", "Thread")) and "most recent call first" in line:
            blocks.append([])
        elif blocks and line.startswith("  File "):
            blocks[-1].append(line.strip())
    blocks = [b for b in blocks if b]
    if not blocks:
        return ""
    frames = next((b for b in blocks if any("runner.py" in f for f in b)), blocks[0])
    return "innermost frames (most recent first):\n" + "\n".join(f"  {f}" for f in frames[:limit])
