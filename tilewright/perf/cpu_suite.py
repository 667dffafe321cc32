"""``tilewright bench run --suite cpu``: eager, Inductor and tilewright on the CPU, side by side.

Where the GEMM suites time one problem's kernels, this suite times whole functions and models as
a user runs them: a few kernels (RMSNorm, softmax, LayerNorm + GELU), one Llama decoder block,
and the demo's models (MiniLM, Llama inference and a training step, a Qwen3-MoE training step).
Per case, in one process:

* **first call**: the compile and first call of each backend, on its own copy of the model;
  tilewright with an empty tuning cache (``cache_dir`` a fresh folder), Inductor *cold* (its FX
  graph and autograd caches off, a fresh ``TORCHINDUCTOR_CACHE_DIR``). An ``aot_eager`` compile
  of the case runs first, untimed, so one-time imports and Dynamo's own warm-up land on neither.
* **steady state**: eager (recorded as ``aten``, the gate's reference: PyTorch running op by op),
  tilewright and Inductor timed interleaved, round by round
  (:func:`tilewright.perf.run.time_side_by_side`), with ``cpu_threads`` torch threads (1 by
  default, as the GEMM suites: a thread pool on a busy host times the scheduler), by the CPU
  time of the thread with one thread (:func:`thread_ms`), else wall time. Whatever kernel
  the tuner picked is what runs: new CPU templates show up here with no change to the suite.
* **the graph race** (:mod:`tilewright.compiler.race`): tilewright's model is called until each
  graph's race is decided before timing, and the row lists each graph's outcome (``race``).
* **ATen calls per call**, eager's and tilewright's, profiler-counted
  (:mod:`tilewright.compiler.dispatches`), and the relative error of tilewright's result against
  eager's.

Rows are in the format ``bench compare`` gates: ``paired_vs_aten`` is tilewright's time over
eager's, round by round, so machine drift cancels. ``paired_vs_inductor`` and
``first_call_vs_inductor`` are recorded beside it, not gated. The ``cpu-ci`` variant is the
three kernels and the block at small sizes, without Inductor unless asked: what CI runs.
"""

from __future__ import annotations

import contextlib
import copy
import os
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

from tilewright._config import config
from tilewright.perf.run import (
    FORMAT, _torch_threads, _write, environment, paired_ratio, time_side_by_side,
)
from tilewright.runtime.targets import get_target


@dataclass
class Setup:
    """One case, built: ``make()`` returns a fresh model (or function) with the same weights
    each time; ``step(model)`` is one call (a training step runs forward and backward) and
    returns the value compared against eager's; ``fullgraph`` as ``torch.compile`` takes it."""

    make: Callable[[], Any]
    step: Callable[[Any], torch.Tensor]
    fullgraph: bool = False


@dataclass(frozen=True)
class Case:
    name: str
    describe: str
    build: Callable[[], Setup]


# -- the cases ----------------------------------------------------------------------------------
def _kernel(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> Setup:
    return Setup(make=lambda: fn, step=lambda f: f(*args), fullgraph=True)


def _randn(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)), dtype=dtype)


def _rms_norm(rows: int, hidden: int) -> Setup:
    x, w = _randn(rows, hidden), _randn(hidden)

    def rms_norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w
    return _kernel(rms_norm, x, w)


def _softmax(rows: int, cols: int) -> Setup:
    def softmax(x):
        return torch.softmax(x, -1)
    return _kernel(softmax, _randn(rows, cols))


def _layer_norm_gelu(rows: int, hidden: int) -> Setup:
    x, w, b = _randn(rows, hidden), _randn(hidden), _randn(hidden + 1)[:hidden]

    def layer_norm_gelu(x, w, b):
        return F.gelu(F.layer_norm(x, (x.shape[-1],), w, b))
    return _kernel(layer_norm_gelu, x, w, b)


class LlamaBlock(torch.nn.Module):
    """One Llama decoder layer with its rotary embedding (transformers' own modules)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, intermediate: int):
        super().__init__()
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=heads,
                          num_key_value_heads=kv_heads, max_position_embeddings=512,
                          attn_implementation="sdpa")
        self.layer = LlamaDecoderLayer(cfg, layer_idx=0)
        self.rotary = LlamaRotaryEmbedding(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        out = self.layer(x, position_embeddings=self.rotary(x, pos), position_ids=pos)
        return out[0] if isinstance(out, tuple) else out


def _llama_block(batch: int, seq: int, hidden: int) -> Setup:
    torch.manual_seed(0)
    block = LlamaBlock(hidden, heads=max(1, hidden // 32), kv_heads=max(1, hidden // 64),
                       intermediate=2 * hidden).eval()
    x = _randn(batch, seq, hidden)

    def step(m):
        with torch.no_grad():
            return m(x)
    return Setup(make=lambda: copy.deepcopy(block), step=step)


def _demo_minilm() -> Setup:
    from tilewright.demo import models

    model = models.load_minilm()
    feats = models.minilm_inputs(model)

    def step(m):
        with torch.no_grad():
            return m(dict(feats))["sentence_embedding"]
    return Setup(make=lambda: copy.deepcopy(model), step=step, fullgraph=True)


def _demo_llama_bf16() -> Setup:
    from tilewright.demo import models

    model, ids = models.build_llama(torch.bfloat16).eval(), models.llama_inputs(batch=2, seq=16)

    def step(m):
        with torch.no_grad():
            return m(input_ids=ids).logits
    return Setup(make=lambda: copy.deepcopy(model), step=step)


def _train_step(model: torch.nn.Module, ids: torch.Tensor) -> Setup:
    def step(m):
        out = m(input_ids=ids, labels=ids)
        out.loss.backward()
        return out.loss.detach()
    return Setup(make=lambda: copy.deepcopy(model), step=step)


def _demo_llama_train() -> Setup:
    from tilewright.demo import models

    return _train_step(models.build_llama(torch.float32), models.llama_inputs())


def _demo_qwen3_moe_train() -> Setup:
    from tilewright.demo import models
    from tilewright.demo.run import MOE_LAYERS

    return _train_step(models.build_qwen3_moe(torch.bfloat16, layers=MOE_LAYERS), models.qwen3_moe_inputs())


KERNEL_CASES = (
    Case("cpu.rms_norm", "RMSNorm, fp32 (1024, 1024)", lambda: _rms_norm(1024, 1024)),
    Case("cpu.softmax", "softmax over the last dim, fp32 (1024, 1024)", lambda: _softmax(1024, 1024)),
    Case("cpu.layer_norm_gelu", "LayerNorm then GELU, fp32 (1024, 1024)", lambda: _layer_norm_gelu(1024, 1024)),
    Case("cpu.llama_block", "one Llama decoder layer, fp32, 2x64 tokens, hidden 256",
         lambda: _llama_block(2, 64, 256)),
)
DEMO_CASES = (
    Case("demo.minilm", "all-MiniLM-L6-v2 inference (real weights), 4 sentences", _demo_minilm),
    Case("demo.llama_bf16", "demo Llama (2 layers) bf16 inference, 2x16 tokens", _demo_llama_bf16),
    Case("demo.llama_train", "demo Llama fp32 training step (forward + backward), 2x24", _demo_llama_train),
    Case("demo.qwen3_moe_train", "demo Qwen3-MoE bf16 training step (1 layer, 8 experts)",
         _demo_qwen3_moe_train),
)
CI_CASES = (
    Case("cpu.rms_norm", "RMSNorm, fp32 (256, 512)", lambda: _rms_norm(256, 512)),
    Case("cpu.softmax", "softmax over the last dim, fp32 (256, 512)", lambda: _softmax(256, 512)),
    Case("cpu.layer_norm_gelu", "LayerNorm then GELU, fp32 (256, 512)", lambda: _layer_norm_gelu(256, 512)),
    Case("cpu.llama_block", "one Llama decoder layer, fp32, 1x32 tokens, hidden 128",
         lambda: _llama_block(1, 32, 128)),
)

MODEL_SUITES: dict[str, tuple[tuple[Case, ...], bool]] = {
    "cpu": (KERNEL_CASES + DEMO_CASES, True),
    "cpu-ci": (CI_CASES, False),
}
"""Suite name -> (cases, whether Inductor is compiled and timed beside by default)."""


# -- running ---------------------------------------------------------------------------------------
@contextlib.contextmanager
def _inductor_cold() -> Iterator[None]:
    """Inductor without its FX graph and autograd caches, its compile cache in a fresh folder."""
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="tw-inductor-") as folder:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = folder
        try:
            with torch._inductor.config.patch(fx_graph_cache=False), \
                    torch._functorch.config.patch(enable_autograd_cache=False):
                yield
        finally:
            if old is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = old


def _first_call(setup: Setup, backend: str, cold: Callable[[], Any]) -> tuple[Any, Callable[[], Any], float]:
    """(compiled model, its step, seconds of compile + first call)."""
    import torch._dynamo

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    model = torch.compile(setup.make(), backend=backend, fullgraph=setup.fullgraph)
    with cold():
        t0 = time.perf_counter()
        setup.step(model)
        seconds = time.perf_counter() - t0
    return model, (lambda: setup.step(model)), seconds


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    o, r = out.detach().double(), ref.detach().double()
    return ((o - r).norm() / r.norm().clamp_min(1e-30)).item()


def _choices(reports: list) -> str:
    """What the tuner picked for the loop kernels and GEMMs, as counts per template."""
    counts = Counter(k.winner.split("[")[0] for r in reports for k in r.kernels)
    counts.update(g.winner.split("[")[0] for r in reports for g in r.gemms)
    return ", ".join(f"{n} {t}" for t, n in counts.most_common())


def bench_case(case: Case, inductor: bool, cpu_threads: int, tune_dir: Path) -> dict[str, Any]:
    """One row of the results (see the module docstring)."""
    from tilewright.compiler.dispatches import counting
    from tilewright.compiler.report import collect_reports

    row: dict[str, Any] = {"id": case.name, "describe": case.describe, "impls": {}}
    with _torch_threads(cpu_threads):
        setup = case.build()
        eager_model = setup.make()
        ref = setup.step(eager_model)
        _first_call(setup, "aot_eager", contextlib.nullcontext)  # Dynamo's one-time costs
        with collect_reports() as reports, config.patch(cache_dir=str(tune_dir / case.name)):
            tw_model, tw_step, tw_first = _first_call(setup, "tilewright", contextlib.nullcontext)
            runs = {"aten": [lambda: setup.step(eager_model)], "tilewright": [tw_step]}
            row["impls"]["tilewright"] = {"first_call_s": tw_first, "rel_err": _rel_err(tw_step(), ref)}
            for _ in range(3 + 2 * config.graph_race_rounds):  # steady state: the graph race decided
                tw_step()
            row["impls"]["aten"] = {"rel_err": 0.0}
            if inductor:
                _, ind_step, ind_first = _first_call(setup, "inductor", _inductor_cold)
                runs["inductor"] = [ind_step]
                row["impls"]["inductor"] = {"first_call_s": ind_first, "rel_err": _rel_err(ind_step(), ref)}
            times, errors = time_side_by_side(runs, torch.device("cpu"), pair=("tilewright", "aten"),
                                              clock=thread_ms if cpu_threads == 1 else None)
            with counting(reports) as ours:
                tw_step()
            with counting() as theirs:
                setup.step(eager_model)
    for name, ts in times.items():
        t = timing_summary_plain(ts)
        row["impls"][name] |= t
    for name, err in errors.items():
        row["impls"][name] = {"error": err}
    row["impls"]["tilewright"]["dispatches"] = ours.total
    row["impls"]["aten"]["dispatches"] = theirs.total
    row["choice"] = _choices(reports)
    row["race"] = [{"graph": f"{r.kind} {r.graph_id}", **r.race} for r in reports if r.race]
    row["graphs"] = len(reports)
    if "tilewright" in times and "aten" in times:
        row["paired_vs_aten"] = paired_ratio(times["tilewright"], times["aten"])
        row["speedup_vs_aten"] = row["impls"]["aten"]["ms"] / row["impls"]["tilewright"]["ms"]
    if "tilewright" in times and "inductor" in times:
        row["paired_vs_inductor"] = paired_ratio(times["tilewright"], times["inductor"])
        row["first_call_vs_inductor"] = tw_first / row["impls"]["inductor"]["first_call_s"]
    return row


def thread_ms(fn: Callable[[], object]) -> float:
    """CPU time of the calling thread over one call, ms. With one torch thread every op runs on
    it, and on a busy host (this project's 2 cores carry ~10 jobs) wall time would mostly
    measure waiting for a core: measured, medians of wall time spread 3-5x between runs where
    thread time stays within ~10%."""
    t0 = time.thread_time()
    fn()
    return (time.thread_time() - t0) * 1e3


def timing_summary_plain(times: list[float]) -> dict[str, Any]:
    """``{ms, spread_ms, reps}`` of one implementation's times (no FLOP or byte count here)."""
    from tilewright.autotune.bench import summarise

    t = summarise(times)
    return {"ms": t.median_ms, "spread_ms": t.spread_ms, "reps": t.reps}


def run_model_suite(suite: str, *, inductor: bool | None = None, cpu_threads: int = 1,
                    out: Path | None = None, time_budget_s: float | None = None,
                    cases: tuple[str, ...] | None = None,
                    on_progress: Callable[[str, dict], None] | None = None) -> dict[str, Any]:
    """Run a model suite (``cpu``, ``cpu-ci``); returns (and writes to ``out`` after every case)
    the results document, in the format of :func:`tilewright.perf.run.run_suite`'s.

    Args:
        inductor: time Inductor beside (default: the suite's own default).
        cpu_threads: torch threads for everything in a case, compile and tuning included.
        time_budget_s: start no new case after this long (the rest are listed as skipped).
        cases: only the cases with these names.

    Raises:
        KeyError: an unknown suite.
    """
    all_cases, default_inductor = MODEL_SUITES[suite]
    inductor = default_inductor if inductor is None else inductor
    doc: dict[str, Any] = {"format": FORMAT, "suite": suite, "created": time.time(), "complete": False,
                           "env": environment(get_target("cpu"), torch.device("cpu")),
                           "settings": {k: v for k, v in config.as_dict().items() if k.startswith("bench_")}
                           | {"cpu_threads": cpu_threads, "inductor": inductor, "reference": "eager",
                              "clock": "thread CPU time" if cpu_threads == 1 else "wall"},
                           "results": [], "skipped": []}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="tw-bench-cpu-") as tune_dir:
        for case in all_cases:
            if cases is not None and case.name not in cases:
                continue
            if time_budget_s is not None and time.monotonic() - t0 > time_budget_s:
                doc["skipped"].append(case.name)
                continue
            try:
                row = bench_case(case, inductor, cpu_threads, Path(tune_dir))
            except Exception as e:  # noqa: BLE001 - one case failing is a result
                row = {"id": case.name, "describe": case.describe, "impls": {},
                       "error": f"{type(e).__name__}: {e}"[:300]}
            doc["results"].append(row)
            _write(out, doc)
            if on_progress is not None:
                on_progress(case.name, row)
    doc["complete"] = not doc["skipped"]
    doc["seconds"] = time.monotonic() - t0
    _write(out, doc)
    return doc
