"""Ties between elements of one input: their groups, inputs that break them in every order, and
the rule that judges a gradient there.

At a tie no single gradient is right: ``torch.max(x, dim)`` gives a tied maximum's gradient to
one index, ``torch.amax`` splits it evenly, a blocked kernel may pick the last. Yet for a Function
that is continuous at the case and whose kinks there are the ties themselves, the gradients on
either side of ``x[a] == x[b]`` differ along ``e_a - e_b`` only, so every valid one has the same
sum over each group of equal elements as the reference's. ``grad * (x == max)``, which gives the
full gradient to every tied element, changes that sum; so does a mask that gives it to none.
Where the premise fails (a kink of the Function sits at the tied value as well), the sum moves
with the resamples that break the ties, and the budget grows with it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from conformance.engine.numerics import FLOAT64_ATOL, FLOAT64_RTOL, Comparison, budget_parts, stepped

__all__ = ["TieGroups", "compare_tie_sums", "tie_groups", "tie_slot_cases"]

# Resample pairs that break ties in rank order: in pair s the element of rank s (mod SLOTS) in each
# group moves up one rounding step and the others down, then the mirror image. So each element of
# a group of up to SLOTS is once the group's largest and once its smallest.
SLOTS = 4


@dataclasses.dataclass(frozen=True)
class TieGroups:
    """The groups of equal values of one tensor: ``ids`` (flat, per element), ``sizes`` and
    ``values`` (per group), ``shape`` (the tensor's)."""

    ids: torch.Tensor
    sizes: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, ...]

    def ranks(self) -> torch.Tensor:
        """Each element's rank in its group, in flat order."""
        order = torch.argsort(self.ids, stable=True)
        starts = torch.cumsum(self.sizes, 0) - self.sizes
        ranks = torch.empty_like(self.ids)
        ranks[order] = torch.arange(self.ids.numel()) - starts[self.ids[order]]
        return ranks

    def members(self, group: int, limit: int = 4) -> list[tuple[int, ...]]:
        """The first ``limit`` indices of ``group``'s elements."""
        flat = torch.nonzero(self.ids == group).flatten()[:limit].tolist()
        return [tuple(int(i) for i in torch.unravel_index(torch.tensor(f), self.shape)) for f in flat]

    def spread(self, per_element: torch.Tensor) -> torch.Tensor:
        """``per_element`` (this tensor's shape) with each tied element's value the largest of its group's."""
        flat = per_element.detach().to("cpu", torch.float64).reshape(-1)
        largest = torch.zeros(self.sizes.numel(), dtype=torch.float64).scatter_reduce_(0, self.ids, flat, "amax", include_self=False)
        tied = (self.sizes >= 2)[self.ids]
        return torch.where(tied, largest[self.ids], flat).reshape(per_element.shape)

    def summed(self, values: torch.Tensor) -> torch.Tensor:
        """``values`` (this tensor's shape) summed per group, in float64."""
        flat = values.detach().to("cpu", torch.float64).reshape(-1)
        return torch.zeros(self.sizes.numel(), dtype=torch.float64).index_add_(0, self.ids, flat)


def tie_groups(values: torch.Tensor) -> TieGroups | None:
    """The groups of equal finite values of a floating tensor, or None when no two are equal."""
    if not values.is_floating_point() or values.numel() < 2:
        return None
    flat = values.detach().to("cpu").reshape(-1)
    unique, ids, sizes = torch.unique(flat, return_inverse=True, return_counts=True)
    tied = (sizes >= 2) & torch.isfinite(unique)
    if not bool(tied.any()):
        return None
    return TieGroups(ids=ids, sizes=sizes, values=unique.to(torch.float64), shape=tuple(values.shape))


def tie_slot_cases(
    args: Sequence[Any], grad_outputs: Mapping[int, torch.Tensor], groups: Mapping[int, TieGroups],
) -> Iterator[tuple[list[Any], dict[int, torch.Tensor]]]:
    """Inputs whose ties (``groups``, by argument position) are broken in rank order: in each
    pair one rank of every group moves up one rounding step and the rest of the group down, then
    the mirror image; untied elements stay (see :data:`SLOTS`)."""
    for position, group in groups.items():
        value = args[position]
        tied = (group.sizes >= 2)[group.ids]
        ranks = group.ranks()
        for slot in range(min(SLOTS, int(group.sizes.max()))):
            step = torch.where(tied, torch.where(ranks % SLOTS == slot, 1, -1), 0).reshape(group.shape).to(value.device)
            for moved in stepped(value, step, None):
                yield [moved if k == position else a for k, a in enumerate(args)], dict(grad_outputs)


def compare_tie_sums(
    actual: torch.Tensor, truth: torch.Tensor, baseline: torch.Tensor, dtype: torch.dtype, groups: TieGroups, *,
    resampled: Sequence[tuple[torch.Tensor, torch.Tensor]] = (), k: float, floor_at: float = 0.0,
    terms: torch.Tensor | None = None, accumulation: int = 0, steps: int, float64_tolerance: tuple[float, float] | None = None,
    input_name: str, what: str, where: str,
) -> Comparison | None:
    """The sum of ``actual`` (a gradient with respect to an input with ``groups``) over each group
    of tied elements against the truth's, or None when every sum is within budget.

    The budget of a sum is each member's own plain budget, added up (float64: assert_close's
    tolerance at each member; below: ``k`` times the reference's error plus the floor, as in
    :func:`conformance.engine.numerics.compare_budget`, but without the per-element sensitivity,
    which at a tie is the very jump whose sum is judged), plus ``k`` times how far the sum itself
    moves over ``resampled`` and the reference's own error on the sums. A Function within its
    budget at every element, ties apart, is within it on every sum."""
    truth64 = truth.detach().to("cpu", torch.float64)
    actual64 = actual.detach().to("cpu", torch.float64)
    parts = budget_parts(truth64, baseline, dtype, resampled=resampled, floor_at=floor_at, terms=terms, accumulation=accumulation, steps=steps)
    truth_sums = groups.summed(truth64)
    actual_sums = groups.summed(torch.where(parts.checked, actual64, 0.0))  # a judged group is checked throughout
    if dtype == torch.float64:
        rtol, atol = float64_tolerance if float64_tolerance is not None else (FLOAT64_RTOL, FLOAT64_ATOL)
        per_element = atol + rtol * truth64.abs()
        own = torch.zeros(())
    else:
        per_element = torch.full_like(truth64, k * parts.reference_error + parts.floor)
        own = (groups.summed(baseline) - truth_sums).abs()
    judged = (groups.sizes >= 2) & (groups.summed((~(parts.checked & torch.isfinite(actual64))).to(torch.float64)) == 0)
    moved = torch.zeros_like(truth_sums)
    for other_baseline, other_truth in resampled:
        if tuple(other_truth.shape) == groups.shape:
            moved = torch.maximum(moved, torch.nan_to_num((groups.summed(other_truth) - truth_sums).abs(), nan=0.0, posinf=0.0))
            if dtype != torch.float64 and tuple(other_baseline.shape) == groups.shape:
                own = torch.maximum(own, torch.nan_to_num((groups.summed(other_baseline) - groups.summed(other_truth)).abs(), nan=0.0))
    reference_error = float(torch.where(judged, own, 0.0).max()) if own.ndim else 0.0
    allowed = groups.summed(torch.where(parts.checked, per_element, 0.0)) + k * torch.clamp(moved, min=reference_error)
    error = (actual_sums - truth_sums).abs()
    excess = torch.where(judged, error - allowed, torch.full_like(error, -float("inf")))
    if not bool(judged.any()) or float(excess.max()) <= 0:
        return None
    group = int(excess.argmax())
    size, value = int(groups.sizes[group]), float(groups.values[group])
    got, want = float(actual_sums[group]), float(truth_sums[group])
    at = groups.members(group)
    shown = ", ".join(map(str, at)) + (", ..." if size > len(at) else "")
    summary = (
        f"sum of {what} over the {size} elements where {input_name} == {value:.6g} ({shown})={got:.6g}, but should be "
        f"{want:.6g} like the reference's, within {float(allowed[group]):.3g} [{where}]"
    )
    details = (
        f"{input_name} holds equal values there. Tied elements may split a gradient among themselves in any way (one "
        "index, the last, evenly), but not change its sum: a Function continuous there has the same sum on either side "
        "of the tie. Giving the whole gradient to every tied element (grad * (x == x.max())) or to none changes it.\n"
        f"{what} at those elements: {[float(actual64[i]) for i in at]}; the reference's: {[float(truth64[i]) for i in at]}."
    )
    return Comparison(summary, details)
