"""CaseOptions (what a contract draws) is frozen and validated when made, echoing the bad value;
contract declarations are validated when their module is imported; every contract declares one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis.errors import InvalidArgument

from conformance.engine.contract import ContractInfo, Requirement, contract, discover
from strategies.cases import LAYOUTS, CaseOptions


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"requires_grad": "some"}, "requires_grad='some' must be one of"),
        ({"max_elements": 0}, "max_elements=0 must be an int >= 1"),
        ({"min_size": -1}, "min_size=-1 must be an int >= 0"),
        ({"min_size": 3, "max_size": 2}, "max_size=2 is below min_size=3"),
        ({"layouts": ("contiguous", "diagonal")}, "layouts=['contiguous', 'diagonal']: ['diagonal']"),
        ({"layouts": "transposed"}, "layouts='transposed' is a string"),
        ({"mask_kinds": ()}, "mask_kinds=[]: empty"),
        ({"dtypes": ()}, "dtypes=() is empty"),
        ({"dtypes": ("float32",)}, "are not torch.dtype"),
        ({"spacing": -1.0}, "spacing=-1.0 must be a number >= 0"),
        ({"block_sizes": (0,)}, "block_sizes=(0,) must be ints >= 1"),
    ],
)
def test_invalid_options_name_the_field_and_echo_the_value(changes: dict[str, object], message: str) -> None:
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        CaseOptions(**changes)  # type: ignore[arg-type]


def test_options_are_frozen_and_replace_validates() -> None:
    options = CaseOptions(broadcast=True, layouts=["contiguous", "transposed"])  # type: ignore[arg-type]
    assert options.layouts == ("contiguous", "transposed")  # sequences become tuples
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.broadcast = False  # type: ignore[misc]
    assert options.replace(dtypes=(torch.float64,)).dtypes == (torch.float64,)
    with pytest.raises(InvalidArgument, match="unknown case options \\['layout'\\]"):
        options.replace(layout="transposed")
    with pytest.raises(InvalidArgument, match="max_elements=0"):
        options.replace(max_elements=0)


def test_every_contract_is_declared_with_its_preset() -> None:
    contracts = discover()
    assert {"opcheck", "compile", "forward_ad", "func", "autocast", "reference", "layouts"} <= set(contracts)
    assert all(isinstance(info, ContractInfo) and info.name == name for name, info in contracts.items())
    # The layouts contract draws every non-contiguous layout (the README lists them, permuted included).
    assert set(contracts["layouts"].case.layouts) == set(LAYOUTS) - {"contiguous"}
    assert contracts["compile"].max_examples == 1
    assert contracts["gradcheck"].case.dtypes == (torch.float64,)


def test_a_contract_declaration_must_match_its_function_and_module() -> None:
    def test_other() -> None:
        pass

    with pytest.raises(ValueError, match="name the function test_grad_meta"):
        contract("grad_meta")(test_other)
    with pytest.raises(TypeError, match="case=.* must be a strategies.cases.CaseOptions"):
        contract("grad_meta", case={"broadcast": True})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="each must be a conformance.engine.contract.Requirement"):
        contract("grad_meta", requires=[lambda target: None])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="max_examples=0 must be an int >= 1"):
        contract("compile", max_examples=0)
    assert repr(Requirement("float64", lambda target: None)) == "Requirement('float64')"
