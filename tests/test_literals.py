"""The constants Hypothesis mixes into the draws: the target package's literals, fixed once.

Without that, importing any module outside site-packages (a plugin, a test's helper, the suite's
own source in a checkout) changes which examples a seed gives."""

from __future__ import annotations

import dataclasses
import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.internal.conjecture import providers

from conformance.engine import literals as literals_module
from conformance.engine.literals import HOOKED, drawing_from, snapshot
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


KERNEL_FUNCTION = """
import torch
from kernelpkg.blocks import BLOCK, launch
from kernelpkg import configs
import helpers_elsewhere

class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return launch(x) * 8191

    @staticmethod
    def backward(ctx, g):
        return g * 8191
"""


def _spec_of(module_name: str, origin: str) -> Any:
    function = importlib.import_module(module_name).Scale
    return dataclasses.replace(make_spec([Tensor("x", "n")], name=f"scale_{origin}"), fn=function, origin=origin)


def test_a_snapshot_holds_the_literals_of_the_functions_own_code(packages: Path) -> None:
    _write(packages, "kernelpkg/__init__.py", "")
    _write(packages, "kernelpkg/ops.py", KERNEL_FUNCTION)
    _write(packages, "kernelpkg/blocks.py", "from helpers_kernel import launch\nBLOCK = 4093\nMODES = ('zeta', 'alpha', 'kappa', 'beta', 'omega', 'delta')\n")
    _write(packages, "kernelpkg/configs.py", "WARPS = 6151\n")
    _write(packages, "kernelpkg/unused.py", "UNUSED = 2039\n")
    _write(packages, "helpers_kernel.py", "def launch(x):\n    return x * 3023\n")
    _write(packages, "helpers_elsewhere.py", "import test_helpers_checks\nNEAR = 1019\n")
    _write(packages, "test_helpers_checks.py", "CHECKED = 5003\n")
    _write(packages, "registering.py", "from kernelpkg.ops import Scale\nREGISTERED = 7001\n")
    _write(packages, "elsewhere.py", "OTHER = 3067\n")
    for name in ("kernelpkg.unused", "elsewhere"):  # loaded, but nothing of the Function's names them
        importlib.import_module(name)

    spec = _spec_of("registering", origin="registering")
    assert spec.op.module == "kernelpkg.ops"
    literals = snapshot([spec])[spec.name]
    assert literals.modules == (
        "helpers_elsewhere", "helpers_kernel", "kernelpkg", "kernelpkg.blocks", "kernelpkg.configs", "kernelpkg.ops",
        "registering",
    )  # reached by import statements, a class, a function imported from another module; not a test file
    integers = set(literals.constants.integers)
    assert {7001, 8191, 4093, 6151, 3023, 1019} <= integers
    assert not integers & {2039, 3067, 5003}
    # in a fixed order, not one PYTHONHASHSEED picks
    assert {"zeta", "alpha", "delta"} <= set(literals.constants.strings)
    assert list(literals.constants.strings) == sorted(literals.constants.strings)
    # the suite's own modules are never the Function's code
    assert not [name for name in literals.modules if name.partition(".")[0] in ("conformance", "strategies")]


def test_specs_with_the_same_code_share_their_literals(packages: Path) -> None:
    _write(packages, "sharedpkg/__init__.py", "")
    _write(packages, "sharedpkg/ops.py", KERNEL_FUNCTION.replace("kernelpkg", "sharedpkg"))
    _write(packages, "sharedpkg/blocks.py", "BLOCK = 4093\ndef launch(x):\n    return x\n")
    _write(packages, "sharedpkg/configs.py", "")
    _write(packages, "helpers_elsewhere.py", "NEAR = 1019\n")
    first, second = _spec_of("sharedpkg.ops", origin="sharedpkg.ops"), _spec_of("sharedpkg.ops", origin="sharedpkg.ops")
    second = dataclasses.replace(second, name="scale_again")
    book = snapshot([first, second])
    assert book[first.name] is book[second.name]


def test_drawing_from_swaps_the_constants_for_the_block_only(packages: Path) -> None:
    _write(packages, "swapped.py", "LIMIT = 7919\n")
    importlib.import_module("swapped")
    spec = dataclasses.replace(make_spec([Tensor("x", "n")]), origin="swapped")
    literals = snapshot([spec])[spec.name]
    assert 7919 in literals.constants.integers
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
    literals = snapshot([spec])[spec.name]

    fixed_before = _draws(spec, literals, monkeypatch)
    own_before = _draws(spec, literals, monkeypatch, hooked=False)
    _write(packages, "latecomer.py", f"LATE = {[1000 + 37 * i for i in range(400)]!r}\n")
    importlib.import_module("latecomer")
    fixed_after = _draws(spec, literals, monkeypatch)
    own_after = _draws(spec, literals, monkeypatch, hooked=False)

    assert fixed_after == fixed_before
    assert 524287 in fixed_before
    assert own_after != own_before


def test_a_spec_made_outside_register_has_no_code_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its origin says ``__main__``: under pytest that is pytest's module, under an xdist worker
    one without a file. Neither is the user's code, and neither stops the run."""
    spec = make_spec([Tensor("x", "n")])
    assert spec.origin == "__main__"
    monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))  # no __file__, as in a worker
    assert "__main__" not in snapshot([spec])[spec.name].modules
    pytest_main = types.ModuleType("__main__")
    pytest_main.__file__ = str(Path(pytest.__file__).parent / "__main__.py")
    monkeypatch.setitem(sys.modules, "__main__", pytest_main)
    assert "__main__" not in snapshot([spec])[spec.name].modules


def test_a_librarys_function_brings_none_of_the_librarys_literals(packages: Path) -> None:
    """A Function torch defines, registered from the user's module: the user's literals only, not
    those of the ~700 torch modules its module imports (9 s and 5,700 constants before)."""
    import torch.utils.checkpoint

    _write(packages, "adapter.py", "import torch.utils.checkpoint\nCHUNKS = 6007\n")
    importlib.import_module("adapter")
    spec = dataclasses.replace(
        make_spec([Tensor("x", "n")]), fn=torch.utils.checkpoint.CheckpointFunction, origin="adapter"
    )
    assert spec.op.module == "torch.utils.checkpoint"
    literals = snapshot([spec])[spec.name]
    assert literals.modules == ("adapter",)
    assert 6007 in literals.constants.integers
