"""The constants Hypothesis mixes into the draws: the target package's literals, fixed once.

Without that, importing any module outside site-packages (a plugin, a test's helper, the suite's
own source in a checkout) changes which examples a seed gives."""

from __future__ import annotations

import dataclasses
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from conformance.engine import literals as literals_module
from conformance.engine.literals import HOOKED, drawing_from, package_of, snapshot
from conformance.engine.runner import RunOptions, Target
from conformance.spec import Tensor
from tests.strategies.helpers import make_spec


@pytest.fixture
def packages(tmp_path: Path) -> Iterator[Path]:
    """An importable folder, with every module imported from it forgotten afterwards."""
    before = set(sys.modules)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        for name in set(sys.modules) - before:
            del sys.modules[name]


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_installed_hypothesis_is_hooked() -> None:
    """The hook reaches into Hypothesis internals: an upgrade that moves them fails here, not
    silently in users' runs."""
    assert HOOKED
    assert callable(providers._get_local_constants) and hasattr(providers.CONSTANTS_CACHE, "cache")


def test_a_snapshot_holds_the_package_literals_and_nothing_else(packages: Path) -> None:
    _write(packages, "kernelpkg/__init__.py", "from kernelpkg import ops\n")
    _write(packages, "kernelpkg/ops.py", "from kernelpkg.blocks import BLOCK\nWIDTH = 8191\n")
    _write(packages, "kernelpkg/blocks.py", "BLOCK = 4093\nMODES = ('zeta', 'alpha', 'kappa', 'beta', 'omega', 'delta')\n")
    _write(packages, "elsewhere.py", "OTHER = 3067\n")
    importlib.import_module("kernelpkg")
    importlib.import_module("elsewhere")

    book = snapshot(["kernelpkg", "conformance"])
    kernels = book["kernelpkg"]
    assert kernels.modules == ("kernelpkg", "kernelpkg.blocks", "kernelpkg.ops")
    assert {4093, 8191} <= set(kernels.constants.integers)
    assert 3067 not in kernels.constants.integers  # another package's
    # in a fixed order, not one PYTHONHASHSEED picks
    assert {"zeta", "alpha", "delta"} <= set(kernels.constants.strings)
    assert list(kernels.constants.strings) == sorted(kernels.constants.strings)
    assert book["conformance"].modules == ()  # the suite's own literals are not the target's
    assert not book["conformance"].constants.integers

    spec = dataclasses.replace(make_spec([Tensor("x", "n")]), origin="kernelpkg.ops")
    assert package_of(spec) == "kernelpkg"


def test_drawing_from_swaps_the_constants_for_the_block_only(packages: Path) -> None:
    _write(packages, "swapped.py", "LIMIT = 7919\n")
    importlib.import_module("swapped")
    literals = snapshot(["swapped"])["swapped"]
    original, cache = providers._get_local_constants, providers.CONSTANTS_CACHE
    with drawing_from(literals):
        assert providers._get_local_constants() is literals.constants
        assert providers.CONSTANTS_CACHE is literals.cache
    assert (providers._get_local_constants, providers.CONSTANTS_CACHE) == (original, cache)
    with pytest.raises(ZeroDivisionError), drawing_from(literals):
        raise ZeroDivisionError
    assert (providers._get_local_constants, providers.CONSTANTS_CACHE) == (original, cache)
    with drawing_from(None):  # Hypothesis' own
        assert providers._get_local_constants is original


def _draws(spec: Any, literals: Any, monkeypatch: pytest.MonkeyPatch, *, hooked: bool = True) -> list[int]:
    drawn: list[int] = []

    def check(target: Target, data: Any) -> None:
        drawn.append(data.draw(st.integers(0, 10**6)))
        target.checked()

    target = Target(spec=spec, device="cpu", options=RunOptions(max_examples=300), literals=literals)
    with monkeypatch.context() as patch:
        patch.setattr(literals_module, "HOOKED", hooked)  # unhooked: Hypothesis' own constants
        target.run(check)
    return drawn


def test_a_module_imported_mid_run_leaves_the_draws_alone(packages: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same Target run, before and after another local module loads (what a test's helper, a
    plugin or an edit of the suite does): the same draws, and the package's own literal among
    them. The same runs on Hypothesis' own constants differ, so the comparison can fail."""
    _write(packages, "blockpkg/__init__.py", "BLOCK = 524287\n")
    importlib.import_module("blockpkg")
    spec = dataclasses.replace(make_spec([Tensor("x", "n")]), origin="blockpkg")
    literals = snapshot(["blockpkg"])["blockpkg"]

    fixed_before = _draws(spec, literals, monkeypatch)
    own_before = _draws(spec, literals, monkeypatch, hooked=False)
    _write(packages, "latecomer.py", f"LATE = {[1000 + 37 * i for i in range(400)]!r}\n")
    importlib.import_module("latecomer")
    fixed_after = _draws(spec, literals, monkeypatch)
    own_after = _draws(spec, literals, monkeypatch, hooked=False)

    assert fixed_after == fixed_before
    assert 524287 in fixed_before
    assert own_after != own_before
