"""tilewright's C++ loop kernels against Inductor's C++ kernels and eager, side by side, on the CPU.

    .venv/bin/python bench/cpp_vs_inductor.py [--cases rmsnorm,softmax,...] [--rounds 7]
                                              [--threads 1] [--json FILE] [--quick]

Each case is one function compiled three ways in this process: eager, ``torch.compile`` with
Inductor (its C++ backend), and ``torch.compile(backend="tilewright")`` with
``force_backend="cpp"`` and the graph race off (``graph_race="off"``: the generated graph runs
every call; with the race on a graph that lost to eager's ops would time eager's ops under
tilewright's name) (every loop kernel a ``cpp.*`` template; GEMMs on ATen, as Inductor's
default CPU GEMMs are). Torch and OpenMP run ``--threads`` threads for all three
(``OMP_NUM_THREADS`` is set before torch loads, ``torch.set_num_threads`` before anything
compiles). The three are timed in interleaved rounds, each a short burst of calls (about
``--burst-ms``), so machine drift hits all alike. The headline is the fastest burst's time per
call: on a machine shared with other jobs (this one: 2 cores, load ~10) a long window mostly
measures time slices given to others (a 50 ms window read 5x the fastest burst for the same
kernel); the median burst is reported beside it. Outputs are compared with eager first (‖out − eager‖ /
‖eager‖ per case, at the dtype's bound), so a fast wrong kernel cannot win. First calls
(compile included) are reported too, cold for Inductor only when its cache is empty.

Cases: RMSNorm, softmax and LayerNorm+GELU on [rows, hidden] in fp32 and bf16, and one Llama
decoder block (transformers' ``LlamaDecoderLayer``, RMSNorms, rotary, SDPA, SwiGLU) in fp32
inference; FlexAttention (a causal block mask with soft-capping, and decode: one query, GQA,
2048 keys) and causal SDPA in fp32 and bf16. Prints a table; ``--json`` writes every number.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing


def _cases(quick: bool) -> dict[str, tuple[Callable, Callable[[], list], str]]:
    import torch
    import torch.nn.functional as F

    rows, hidden = (64, 1024) if quick else (512, 4096)

    def make(dtype, *shapes):
        def build():
            g = torch.Generator().manual_seed(0)
            return [torch.randn(*s, generator=g).to(dtype) for s in shapes]
        return build

    def rms(x, w):
        return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)

    def softmax(x):
        return torch.softmax(x, -1)

    def ln_gelu(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5))

    out = {}
    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        out[f"rmsnorm_{name}"] = (rms, make(dt, (rows, hidden), (hidden,)), f"[{rows}, {hidden}]")
        out[f"softmax_{name}"] = (softmax, make(dt, (rows, hidden)), f"[{rows}, {hidden}]")
        out[f"layernorm_gelu_{name}"] = (ln_gelu, make(dt, (rows, hidden), (hidden,), (hidden,)),
                                         f"[{rows}, {hidden}]")
    block, inputs, shape = _llama_block(quick)
    out["llama_block_fp32"] = (block, inputs, shape)
    out.update(_attention_cases(quick))
    return out


def _attention_cases(quick: bool) -> dict[str, tuple[Callable, Callable[[], list], str]]:
    """FlexAttention with a causal block mask and a soft-capping score_mod, flex decode (one
    query, GQA, a long KV) and causal SDPA, in fp32 and bf16."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    B, H, S, D = (1, 2, 128, 32) if quick else (2, 8, 512, 64)
    H_kv, S_kv = (1, 256) if quick else (2, 2048)
    mask = create_block_mask(lambda b, h, m, n: m >= n, 1, 1, S, S, device="cpu")

    def softcap(score, b, h, m, n):
        return 20.0 * torch.tanh(score / 20.0)

    def flex(q, k, v):
        return flex_attention(q, k, v, score_mod=softcap, block_mask=mask)

    def decode(q, k, v):
        return flex_attention(q, k, v, enable_gqa=True)

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def make(dtype, *shapes):
        def build():
            g = torch.Generator().manual_seed(0)
            return [torch.randn(*s, generator=g).to(dtype) for s in shapes]
        return build

    out = {}
    for dt, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
        qkv = [(B, H, S, D)] * 3
        out[f"flex_causal_softcap_{name}"] = (flex, make(dt, *qkv), f"[{B}, {H}, {S}, {D}]")
        out[f"flex_decode_{name}"] = (decode, make(dt, (B, H, 1, D), (B, H_kv, S_kv, D), (B, H_kv, S_kv, D)),
                                      f"[{B}, {H}/{H_kv}, 1/{S_kv}, {D}]")
        out[f"sdpa_causal_{name}"] = (sdpa, make(dt, *qkv), f"[{B}, {H}, {S}, {D}]")
    return out


def _llama_block(quick: bool):
    """One Llama decoder layer with its rotary embedding, fp32, inference."""
    import torch
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    hidden, seq = (256, 32) if quick else (1024, 128)
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 3, num_attention_heads=8,
                      num_key_value_heads=4, max_position_embeddings=4096, attn_implementation="sdpa")
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
            self.rotary = LlamaRotaryEmbedding(cfg)

        def forward(self, x, pos):
            out = self.layer(x, position_embeddings=self.rotary(x, pos), position_ids=pos)
            return out[0] if isinstance(out, tuple) else out

    block = Block().eval()

    def inputs():
        g = torch.Generator().manual_seed(0)
        return [torch.randn(1, seq, hidden, generator=g), torch.arange(seq)[None]]

    def fn(x, pos):
        with torch.no_grad():
            return block(x, pos)

    return fn, inputs, f"[1, {seq}, {hidden}]"


def _calls_per_burst(fn: Callable[[], Any], burst_s: float) -> int:
    t0 = time.perf_counter()
    fn()
    return max(1, int(burst_s / max(time.perf_counter() - t0, 1e-7)))


def _burst(fn: Callable[[], Any], n: int) -> float:
    """Seconds per call over ``n`` calls in a row."""
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n


def _rel(out, ref) -> float:
    import torch

    outs = out if isinstance(out, (tuple, list)) else [out]
    refs = ref if isinstance(ref, (tuple, list)) else [ref]
    worst = 0.0
    for o, r in zip(outs, refs):
        if isinstance(o, torch.Tensor):
            o, r = o.detach().double(), r.detach().double()
            worst = max(worst, ((o - r).norm() / r.norm().clamp_min(1e-30)).item())
    return worst


def run(names: list[str], rounds: int, burst_ms: float, quick: bool) -> dict:
    import torch

    import tilewright
    from tilewright.compiler.report import collect_reports

    cases = _cases(quick)
    results = []
    for name in names:
        fn, make, shape = cases[name]
        args = make()
        bound = 2e-2 if any(a.dtype == torch.bfloat16 for a in args if a.is_floating_point()) else 1e-4
        torch._dynamo.reset()
        eager = fn(*args)
        t0 = time.perf_counter()
        inductor = torch.compile(fn)
        ind_out = inductor(*args)
        ind_first = time.perf_counter() - t0
        t0 = time.perf_counter()
        with tilewright.config.patch(force_backend="cpp", graph_race="off"), collect_reports() as graphs:
            tw = torch.compile(fn, backend="tilewright")
            tw_out = tw(*args)
        tw_first = time.perf_counter() - t0
        kernels = [(k.kind, k.winner) for g in graphs for k in g.kernels]
        errors = {"inductor": _rel(ind_out, eager), "tilewright_cpp": _rel(tw_out, eager)}
        variants = {"eager": lambda: fn(*args), "inductor": lambda: inductor(*args),
                    "tilewright_cpp": lambda: tw(*args)}
        for v in variants.values():  # warm
            _burst(v, 3)
        calls = {v: _calls_per_burst(call, burst_ms / 1e3) for v, call in variants.items()}
        samples: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(rounds):
            for v, call in variants.items():
                samples[v].append(_burst(call, calls[v]) * 1e6)
        best = {v: min(s) for v, s in samples.items()}
        med = {v: statistics.median(s) for v, s in samples.items()}
        results.append({
            "case": name, "shape": shape, "us": best, "us_median": med, "calls_per_burst": calls,
            "tilewright_over_inductor": best["tilewright_cpp"] / best["inductor"],
            "tilewright_over_eager": best["tilewright_cpp"] / best["eager"],
            "first_call_s": {"inductor": ind_first, "tilewright_cpp": tw_first},
            "rel_error_vs_eager": errors, "error_bound": bound,
            "correct": all(e <= bound for e in errors.values()),
            "tilewright_loop_kernels": kernels,
        })
        torch._dynamo.reset()
    return {"cases": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    p.add_argument("--rounds", type=int, default=100, help="interleaved bursts per variant")
    p.add_argument("--burst-ms", type=float, default=2.0, help="time of one burst of calls")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="small shapes (a smoke run)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # before torch (and its OpenMP) loads
    import torch

    torch.set_num_threads(args.threads)
    from tilewright.templates.cpp import runtime as cpp

    names = [n for n in args.cases.split(",") if n] or list(_cases(args.quick))
    out = run(names, args.rounds, args.burst_ms, args.quick)
    tc = cpp.toolchain()
    out["config"] = {"threads": args.threads, "torch": torch.__version__, "compiler": tc.version,
                     "flags": list(tc.flags), "libmvec": tc.libmvec, "machine": platform.machine(),
                     "cpu": next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                                  if ln.startswith("model name")), platform.processor()),
                     "rounds": args.rounds, "burst_ms": args.burst_ms, "quick": args.quick,
                     "statistic": "fastest burst, µs per call"}
    print("µs per call (fastest of interleaved bursts)")
    print(f"{'case':24} {'shape':18} {'eager µs':>10} {'inductor µs':>12} {'tw cpp µs':>10} {'tw/ind':>7} "
          f"{'tw/eager':>8} {'first ind s':>11} {'first tw s':>10} ok")
    for r in out["cases"]:
        us = r["us"]
        print(f"{r['case']:24} {r['shape']:18} {us['eager']:10.1f} {us['inductor']:12.1f} "
              f"{us['tilewright_cpp']:10.1f} {r['tilewright_over_inductor']:7.2f} {r['tilewright_over_eager']:8.2f} "
              f"{r['first_call_s']['inductor']:11.1f} {r['first_call_s']['tilewright_cpp']:10.1f} "
              f"{'yes' if r['correct'] else 'NO ' + str(r['rel_error_vs_eager'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0 if all(r["correct"] for r in out["cases"]) else 1


if __name__ == "__main__":
    sys.exit(main())
