"""The spec language stays below the strategies: it imports nothing from them (nor from the
engine or the plugin), and every input kind has one validator (spec side) and one drawing
function (strategies side)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance.spec.inputs import INPUT_KINDS, AdditiveMask, Mask
from conformance.spec.validation import validate_input
from strategies.draw import draw_recipe


def test_the_spec_language_imports_no_layer_above_it() -> None:
    above = ("strategies", "conformance.engine", "conformance.plugin")
    code = (
        "import sys, conformance.spec; "
        f"print(sorted(m for m in sys.modules if m.startswith({above!r})))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


@pytest.mark.parametrize("kind", [*INPUT_KINDS, AdditiveMask], ids=lambda kind: kind.__name__)
def test_every_input_kind_has_a_validator_and_a_drawing_function(kind: type) -> None:
    assert validate_input.dispatch(kind) is not validate_input.dispatch(object)
    assert draw_recipe.dispatch(kind) is not draw_recipe.dispatch(object)


def test_an_additive_mask_draws_its_own_recipe_but_is_checked_as_a_mask() -> None:
    assert draw_recipe.dispatch(AdditiveMask) is not draw_recipe.dispatch(Mask)
    assert validate_input.dispatch(AdditiveMask) is validate_input.dispatch(Mask)
