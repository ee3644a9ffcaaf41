"""Figure 3: the cost of one gradcheck call, as the gradcheck contract makes it, against numel.

Run by benchmarks/run.py in a subprocess (``python benchmarks/gradcheck_cost.py --numels 16,64
--repeats 3``); prints one JSON object. For each input numel n it builds the Case the contract
would draw for a one-input elementwise Function (``square`` from reference_ops: x of shape (n,),
float64, values kept FD_SPACING apart like the contract's), wraps it with
``conformance.engine.evaluate.function_of_tensors`` (the guarded, shielded closure the contract passes to
gradcheck) and times ``torch.autograd.gradcheck`` with the contract's own arguments: eps=FD_EPS,
fast mode with FAST_ATOL/FAST_RTOL when in+out numel > GRADCHECK_FAST_MODE_ELEMENTS, else slow mode with
SLOW_ATOL/SLOW_RTOL (the constants are read from conformance/engine/finite_differences.py). With
``--slow-up-to N`` it also times slow mode for every n <= N, to show what the threshold saves.
torch runs with one intra-op thread, the suite's default (--threads=1).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _case(spec: Any, numel: int, spacing: float) -> Any:
    import torch

    from strategies.cases import Case
    from strategies.recipes import TensorRecipe

    recipe = TensorRecipe(name="x", shape=(numel,), seed=numel, spacing=spacing)
    return Case(spec=spec, device="cpu", dtype=torch.float64, sizes={"n": numel}, batches={"batch": ()},
                recipes=(recipe,), requires_grad=frozenset({"x"}))


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--numels", default="16,64,128,256,512,1024,4096,16384")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--slow-up-to", type=int, default=0)
    parser.add_argument("--function", default="square")
    options = parser.parse_args(argv)

    if "TRITON_INTERPRET" not in os.environ:
        os.environ["TRITON_INTERPRET"] = "1"  # as the plugin does without CUDA, before reference_ops
    import torch

    torch.set_num_threads(1)
    import reference_ops  # noqa: F401  (registers the specs)
    from conformance.engine import finite_differences as contract
    from conformance.engine.evaluate import function_of_tensors
    from conformance.engine.finite_differences import FD_EPS, FD_SPACING
    from conformance.spec import registered

    spec = next(s for s in registered() if s.name == options.function)
    rows = []
    for numel in (int(n) for n in options.numels.split(",")):
        case = _case(spec, numel, FD_SPACING)
        args = case.args(dtype=torch.float64)
        wrt = (args[0],)
        call = function_of_tensors(case, args, [0])
        with torch.no_grad():
            out_numel = sum(o.numel() for o in call(*wrt))
        suite_fast = numel + out_numel > contract.GRADCHECK_FAST_MODE_ELEMENTS
        modes = [suite_fast] + ([False] if suite_fast and numel <= options.slow_up_to else [])
        row: dict[str, Any] = {"numel": numel, "in_out_numel": numel + out_numel, "suite_mode": "fast" if suite_fast else "slow"}
        for fast in modes:
            atol, rtol = (contract.FAST_ATOL, contract.FAST_RTOL) if fast else (contract.SLOW_ATOL, contract.SLOW_RTOL)
            torch.autograd.gradcheck(call, wrt, eps=FD_EPS, atol=atol, rtol=rtol, fast_mode=fast)  # warm-up
            walls, cpus = [], []
            for _ in range(options.repeats):
                wall, cpu = time.perf_counter(), time.process_time()
                torch.autograd.gradcheck(call, wrt, eps=FD_EPS, atol=atol, rtol=rtol, fast_mode=fast)
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
            key = "suite" if fast == suite_fast else "slow"
            row[key] = {"wall": walls, "cpu": cpus}
        rows.append(row)
    print(json.dumps({
        "function": options.function,
        "threshold": contract.GRADCHECK_FAST_MODE_ELEMENTS,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
