"""Per-call overhead of a race-off compiled graph on the CPU (issue 29), one torch thread.

    PYTHONPATH=. .venv/bin/python bench/call_overhead.py [--cases tiny,mlp,gpt2] [--rounds 30]

Two tables per case, each side's median per-call time (the timed thread's CPU time, sides
interleaved, ``--calls`` calls a round):

* the whole model: eager, Dynamo's floor (``backend=lambda gm, ex: gm``), ``aot_eager``,
  Inductor and tilewright with the graph race off. What tilewright adds over Dynamo and
  aot_autograd is ``tilewright - aot_eager`` (both run aot_autograd's runtime wrappers).
* the first graph alone: tilewright's compiled callable (``compiled``), the same behind the
  backend's run-time fallback guard (``guarded``), and aot_autograd's graph run on ATen
  (``aten_graph``: the same ops before tilewright lowers them), called with the same inputs.

``tiny`` (two 16-wide linears on 4 rows) is almost all overhead; on a shared machine a
side's median moves by 10-30% between runs, so compare sides within one run.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _model(case: str) -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    if case == "tiny":
        return torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU(), torch.nn.Linear(16, 16),
                                   torch.nn.ReLU()).eval(), torch.randn(4, 16)
    if case == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256),
                                   torch.nn.ReLU()).eval(), torch.randn(64, 256)
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=1000, n_positions=64, n_embd=128, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    lm = GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids).logits
    return Logits().eval(), torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(0))


def _time(sides: dict[str, Callable[[], Any]], rounds: int, calls: int) -> dict[str, float]:
    per: dict[str, list[float]] = {k: [] for k in sides}
    for _ in range(rounds):
        for k, fn in sides.items():
            t0 = time.thread_time_ns()
            for _ in range(calls):
                fn()
            per[k].append((time.thread_time_ns() - t0) / calls / 1e3)
    return {k: statistics.median(v) for k, v in per.items()}


def _print(case: str, med: dict[str, float], base: str) -> None:
    for k, us in med.items():
        print(f"{case:5s} {k:11s} {us:9.1f} us   - {base} {us - med[base]:+8.1f} us")


def run_case(case: str, rounds: int, calls: int) -> None:
    import torch
    from torch._functorch.aot_autograd import make_boxed_func

    import tilewright.compiler.backend as backend
    from tilewright._config import config

    graphs: list[tuple[Callable, Callable, Any]] = []
    guard = backend._run_or_fall_back

    def keep(compiled, gm, kind):  # the first graph's callables, for the second table
        guarded = guard(compiled, gm, kind)
        graphs.append((compiled, guarded, gm))
        return guarded

    def race_off(gm, example_inputs, **kwargs):
        with config.patch(graph_race="off"):
            return backend.tilewright_backend(gm, example_inputs, **kwargs)

    model, x = _model(case)
    backend._run_or_fall_back = keep
    try:
        sides = {"eager": model,
                 "floor": torch.compile(copy.deepcopy(model), backend=lambda gm, ex: gm),
                 "aot_eager": torch.compile(copy.deepcopy(model), backend="aot_eager"),
                 "inductor": torch.compile(copy.deepcopy(model), backend="inductor"),
                 "tilewright": torch.compile(copy.deepcopy(model), backend=race_off)}
        with torch.no_grad():
            ref = model(x).double()
            for k, m in sides.items():
                out = m(x)
                m(x)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                assert err < 1e-4, f"{case} {k}: rel err {err:.2e}"
    finally:
        backend._run_or_fall_back = guard
    with torch.no_grad():
        _print(case, _time({k: (lambda m=m: m(x)) for k, m in sides.items()}, rounds, calls), "aot_eager")
        compiled, guarded, gm = graphs[0]
        seen: list[list] = []
        inner = graphs[0][1].__closure__  # the guard's closure holds the compiled callable
        cell = next(c for c in inner if c.cell_contents is compiled)
        cell.cell_contents = lambda args: (seen.append(list(args)), compiled(args))[1]
        sides["tilewright"](x)
        cell.cell_contents = compiled
        args, aten = seen[0], make_boxed_func(gm.forward)
        _print(case, _time({"aten_graph": lambda: aten(list(args)), "compiled": lambda: compiled(list(args)),
                            "guarded": lambda: guarded(list(args))}, rounds, calls), "aten_graph")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default="tiny,mlp,gpt2")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--calls", type=int, default=50, help="calls per side per round")
    ns = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    for case in ns.cases.split(","):
        run_case(case, ns.rounds, ns.calls)


if __name__ == "__main__":
    main()
