"""What the bounds checks of gathers cost (``config.index_checks``, issue 27): an embedding
lookup and a ``gather`` along the last dim, each rendered by one template with the checks on
and off and timed on the same inputs, as JSON with a short table.

The checks are a compare and a branch (C++: ``tw_index``), a compare, a store of a status and a
masked load (the Triton interpreter), or a ``tl.device_assert`` with the kernel compiled in
debug mode (Triton on a GPU); the rows say what each costs against the same kernel unchecked.

Rows: embedding (a Llama-sized vocabulary, rows of ``--dim``), gather, an embedding of a view
(half the table's rows: its index checked against the view's rows), and the one-hot scatter
of nll_loss's backward (``tokens / 8`` rows of the vocabulary), on the C++ template
(cpu target; skipped without a compiler) and, on a machine with a CUDA or ROCm GPU, Triton.
``--dry-run``: toy sizes (CI; the Triton interpreter then stands in for the GPU).

usage: python bench/index_checks.py OUT.json [--dry-run] [--tokens N] [--dim D]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def _problems(tokens: int, vocab: int, dim: int):
    """(name, fn, example args) of the two gathers, lowered to their loop problems."""
    import torch.nn.functional as F
    from torch.fx.experimental.proxy_tensor import make_fx

    from tilewright.compiler.decompositions import decomposition_table
    from tilewright.compiler.graph import FusedNode
    from tilewright.compiler.lower import lower, lower_loop_nodes
    from tilewright.kinds.loop.fusion.schedule import schedule

    g = torch.Generator().manual_seed(0)
    w = torch.randn(vocab, dim, generator=g)
    ids = torch.randint(0, vocab, (tokens,), generator=g)
    x = torch.randn(tokens, dim, generator=g)
    pos = torch.randint(0, dim, (tokens, dim), generator=g)
    # one-hot: nll_loss's backward form (scatter of an (N, 1) index), its index checked in
    # each of the N x vocab lanes; a view's gather: checked against the view's rows
    logits = torch.randn(max(tokens // 8, 1), vocab, generator=g)
    target = torch.randint(0, vocab, (logits.shape[0], 1), generator=g)
    cases = [("embedding", lambda w, i: F.embedding(i, w) * 2.0, (w, ids)),
             ("gather", lambda x, i: x.gather(1, i) + 1.0, (x, pos)),
             ("view_gather", lambda w, i: F.embedding(i // 2, w[: vocab // 2]) * 2.0, (w, ids)),
             ("one_hot", lambda x, t: x.scatter(1, t, -1.0) * 2.0, (logits, target))]
    out = []
    for name, fn, args in cases:
        gm = make_fx(fn, decomposition_table=decomposition_table(), tracing_mode="fake")(*args)
        kg = lower(gm)
        lower_loop_nodes(kg, gm)
        schedule(kg, gm)
        (problem,) = [n.problem for n in kg.nodes if isinstance(n, FusedNode)]
        out.append((name, problem, args))
    return out


def _time(launch, args, device: torch.device, rep: int) -> dict:
    from tilewright.autotune.bench import time_callable

    return time_callable(lambda: launch(*args), device, warmup=2, rep=rep, budget_ms=2000.0,
                         min_rep=5, stable_pct=1.0).as_dict()


def run(dry: bool, tokens: int, dim: int) -> dict:
    import tilewright
    from tilewright.autotune.kinds import make_loop_inputs
    from tilewright.compiler.kernel_factory import TemplateKernelFactory
    from tilewright.templates.cpp import runtime as cpp_runtime
    from tilewright.runtime.targets import detect_target, get_target
    from tilewright.templates import get_template

    if dry:
        tokens, dim = 64, 32
    vocab = 1000 if dry else 32000
    factory = TemplateKernelFactory()
    rows, skipped = [], []
    langs = []
    if cpp_runtime.unavailable_reason() is None:
        langs.append(("cpp", get_target("cpu"), torch.device("cpu")))
    else:
        skipped.append(f"cpp: {cpp_runtime.unavailable_reason()}")
    target = detect_target("cuda") if torch.cuda.is_available() else get_target("cpu")
    if target.backend in ("cuda", "hip"):
        langs.append(("triton", target, torch.device("cuda")))
    elif dry:
        langs.append(("triton", get_target("cpu"), torch.device("cpu")))  # the interpreter
    else:
        skipped.append("triton: no GPU here (the interpreter's timings say nothing)")
    for name, problem, _ in _problems(tokens, vocab, dim):
        for lang, tgt, device in langs:
            template = get_template(f"{lang}.{problem.kind}")
            params = template.space.complete({})
            # the kernel's own inputs (its order, not the function's): indices inside their dims
            x = make_loop_inputs(problem, device, seed=1)
            dev_args = [*x.tensors, *x.sizes]
            times = {}
            for checks in (True, False):
                with tilewright.config.patch(index_checks=checks):
                    rendered = template.render(problem, params, tgt)
                launch = factory.compile(rendered)
                times["on" if checks else "off"] = _time(launch, dev_args, device, 5 if dry else 50)
            on, off = times["on"]["median_ms"], times["off"]["median_ms"]
            rows.append({"op": name, "language": lang, "target": tgt.name, "tokens": tokens, "dim": dim,
                         "vocab": vocab, "params": params, "checks_on": times["on"], "checks_off": times["off"],
                         "overhead_pct": 100.0 * (on - off) / off if off > 0 else None})
    return {"rows": rows, "skipped": skipped, "dry_run": dry, "torch": torch.__version__,
            "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--dim", type=int, default=1024)
    a = ap.parse_args(argv)
    result = run(a.dry_run, a.tokens, a.dim)
    a.out.write_text(json.dumps(result, indent=1))
    for r in result["rows"]:
        print(f"{r['op']:10s} {r['language']:7s} {r['target']:10s} on {r['checks_on']['median_ms']:8.3f} ms  "
              f"off {r['checks_off']['median_ms']:8.3f} ms  overhead {r['overhead_pct']:+.1f}%")
    for s in result["skipped"]:
        print("skipped:", s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
