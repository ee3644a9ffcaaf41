"""Keep the cyclic garbage collector's walks short: what outlives a Function's tests is frozen.

CPython's full collection walks every tracked object. With torch, Dynamo and the suite loaded,
that is 250k to 700k objects, and ~370 ms per walk. The main job made 26 such walks, ~9 s of
its ~145 s (measured). Nearly all of those objects are modules, functions and caches that live
until the run ends.

Between two Functions' tests the run holds nothing of the previous Function: the session drops
its shared evaluations, and the compile contract resets Dynamo after each example. So what
survives a full collection at that point is long-lived. :meth:`Heap.settle` collects it once
and freezes it (:func:`gc.freeze`), and later walks skip it: they see only what the current
Function's tests made.

Cost: an object that is alive at a boundary and only later becomes cyclic garbage is not freed
until the session ends. Then :meth:`Heap.release` unfreezes everything, and the process's next
collection frees it. A process that froze objects itself, or turned the collector off, is left
as it is. So is a child forked for one test (``--isolate``): it ends with its test, and a full
collection there would cost ~0.4 s per test and copy every page it touches.
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

__all__ = ["Heap"]


@dataclass
class Heap:
    """This session's use of :func:`gc.freeze` (see the module docstring)."""

    pid: int  # the process the session runs in (a forked child's tests leave the heap alone)
    owned: bool | None = None  # whether this session may freeze: decided at its first settle
    frozen: bool = False  # whether it has frozen anything since

    @classmethod
    def for_this_process(cls) -> Heap:
        return cls(pid=os.getpid())

    def settle(self) -> None:
        """Collect, then freeze what survived. The session calls it where a new Function's tests
        begin. The first call decides whether this session may freeze at all: not when the
        collector is off or something in the process (a host, an ``--impl`` module) froze objects."""
        if os.getpid() != self.pid:
            return
        if self.owned is None:
            self.owned = gc.isenabled() and gc.get_freeze_count() == 0
        if not self.owned:
            return
        gc.collect()
        gc.freeze()
        self.frozen = True

    def release(self) -> None:
        """Give every object this session froze back to the collector (at the end of the session,
        after pytest's own last collection, which then walks only what the run made since the last
        Function began: ~0.4 s less. A finaliser of frozen garbage that raises is not in pytest's
        unraisable-exception report; it runs at the process's next collection)."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
