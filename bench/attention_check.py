"""The attention rows of bench/device_check.sh: each generated attention kernel against the float64
reference and timed beside ATen (SDPA's flash kernel or eager FlexAttention math) on this
machine's GPU, as JSON, with a short table.

Rows (Llama-3-8B attention: 32 query heads, 8 KV heads, head dim 128, bf16): causal prefill
at 2048, its backward, a decode step (one query, 8192 keys: the split-KV kernel), and a
FlexAttention sliding window (1024) through a block mask with soft-capping; each with and
without tensor descriptors (TMA). ``--dry-run``: the same rows at toy sizes on the CPU
(the Triton interpreter), for CI.

usage: python bench/attention_check.py OUT.json [--dry-run] [--budget-s S]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def rows(dry: bool):
    from tilewright.kinds.attention import AttentionProblem, BlockMaskSpec, mods
    from tilewright.ir import expr as E

    B, H, Hkv, D, S, L = (1, 4, 2, 32, 64, 128) if dry else (1, 32, 8, 128, 2048, 8192)
    window = 32 if dry else 1024
    bm = BlockMaskSpec(32 if dry else 128, 32 if dry else 128)
    common = dict(B=B, H=H, H_kv=Hkv, D=D, Dv=D, dtype="bf16", scale=D ** -0.5)
    softcap = mods.dumps(30.0 * E.op("tanh", mods.score() / 30.0))
    return [
        ("prefill causal", "triton.attention", AttentionProblem(Sq=S, Skv=S, causal=True, empty_lse=0.0, **common)),
        ("backward causal", "triton.attention_bwd",
         AttentionProblem(Sq=S, Skv=S, causal=True, direction="backward", empty_lse=0.0, **common)),
        ("decode 1 x long KV", "triton.attention_decode", AttentionProblem(Sq=1, Skv=L, **common)),
        ("flex sliding window + softcap", "triton.attention",
         AttentionProblem(Sq=S, Skv=S, mask_mod=mods.dumps(mods.sliding_window(window)), score_mod=softcap,
                          block_mask=bm, lse_base="2", op="flex_attention", **common)),
    ]


def check_row(name: str, template_id: str, problem, target, device, desc: bool) -> dict:
    from tilewright.kinds.attention import checks as tuning
    from tilewright.kinds.attention.policy import AttentionPolicy
    from tilewright.autotune.bench import time_callable
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.templates import get_template

    template = get_template(template_id)
    ranked = [p for _, p in AttentionPolicy().ranked(problem, target, template) if bool(p.get("DESC")) == desc]
    row = {"row": name, "template": template_id, "desc": desc, "problem": problem.describe()}
    if not ranked:
        return row | {"status": "refused", "reason": "no legal tile with this DESC on " + target.name}
    params = ranked[0]
    row["params"] = params
    launch = default_factory.compile(template.render(problem, params, target))
    aten_t = get_template("aten.attention")
    aten = default_factory.compile(aten_t.render(problem, {}, target))
    x = tuning.make_inputs(problem, device, seed=0)
    outs = tuning.poisoned(problem, device)
    result = tuning.run(launch, x, outs)
    expected = tuning.reference(problem, x)
    err, tol = tuning.error(problem, result, expected, False)
    row |= {"rel_err": err, "tolerance": tol, "status": "ok" if err <= tol else "wrong"}
    timing = {}
    for label, fn in (("tilewright", launch), ("aten", aten)):
        o = tuning.poisoned(problem, device)
        t = time_callable(lambda fn=fn, o=o: tuning.run(fn, x, o), device, warmup=2, rep=20, budget_ms=2000)
        timing[label] = t.median_ms
    row |= {"ms": timing["tilewright"], "aten_ms": timing["aten"],
            "speedup": timing["aten"] / timing["tilewright"] if timing["tilewright"] else None,
            "tflops": problem.flops / (timing["tilewright"] * 1e9) if timing["tilewright"] else None}
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--budget-s", type=float, default=60.0)
    args = ap.parse_args()
    from tilewright.runtime.targets import detect_target, get_target

    device = torch.device("cpu" if args.dry_run else "cuda")
    target = get_target("cpu") if args.dry_run else detect_target(device)
    start, out = time.time(), []
    for name, template_id, problem in rows(args.dry_run):
        for desc in (False, True):
            if time.time() - start > args.budget_s:
                out.append({"row": name, "desc": desc, "status": "skipped", "reason": "time budget"})
                continue
            try:
                out.append(check_row(name, template_id, problem, target, device, desc))
            except Exception as e:  # noqa: BLE001 - one row's failure is reported, the rest run
                out.append({"row": name, "desc": desc, "status": "failed", "reason": f"{type(e).__name__}: {e}"[:400]})
            Path(args.out).write_text(json.dumps({"target": target.name, "rows": out}, indent=1))
    Path(args.out).write_text(json.dumps({"target": target.name, "rows": out}, indent=1))  # with the skipped
    print(f"{'attention row':34} {'desc':5} {'status':8} {'ms':>9} {'aten ms':>9} {'speedup':>8} {'rel err':>9}")
    for r in out:
        def f(key, fmt):
            return format(r[key], fmt) if isinstance(r.get(key), (int, float)) else "-"
        print(f"{r['row']:34} {str(r['desc']):5} {r['status']:8} {f('ms', '9.4f')} {f('aten_ms', '9.4f')} "
              f"{f('speedup', '8.2f')} {f('rel_err', '9.2e')}")
    return 0 if all(r["status"] in ("ok", "refused", "skipped") for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
