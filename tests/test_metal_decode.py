"""Apple's decode paths on the Metal backend, as far as Linux can prove them: the grouped gemv
(MoE decode: a few tokens per expert) and the split-row reductions (one long row over many
threadgroups). Every shader passes the host syntax check and runs on the host
(``tests/metal_host.py``: OS threads, SIMD-group exchanges) into NaN-poisoned outputs, against
float64 references; the policy's choice for decode shapes on the ``mps`` target is checked.

What this cannot show (no Mac here): Apple's compiler's verdict and the speed."""

from __future__ import annotations

import pytest
import torch
from metal_host import host_launcher

from tilewright.grouped import GroupedGemmProblem
from tilewright.problem import EpilogueInput, EpilogueOp
from tilewright.runtime.metal_check import check_shader
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template
from tilewright.templates.metal.split_reduce import schedule

MPS = get_target("mps")
GEMV = get_template("metal.grouped_gemv")
TILED = get_template("metal.grouped_gemm")
TORCH = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ACT = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu, "relu": torch.relu}


def rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


# ragged offsets for a decode step: an empty first group, one-token groups, an empty group in
# the middle, a group of 11 tokens (two passes of 8 rows), and rows past the last offset
OFFSETS = [0, 1, 2, 2, 13, 14, 17]


def _grouped_reference(a, b, offs, glu="", epilogue=None):
    """float64: per group g, rows offs[g-1]:offs[g] of a @ b[g]; then act(gate) * up when
    ``glu``; then ``epilogue(value, g, rows)``. Rows past offs[-1] stay NaN."""
    out_n = b.shape[2] // 2 if glu else b.shape[2]
    out = torch.full((a.shape[0], out_n), float("nan"), dtype=torch.float64)
    start = 0
    for g, end in enumerate(offs.tolist()):
        if end > start:
            acc = a[start:end].double() @ b[g].double()
            if glu:
                acc = ACT[glu](acc[:, :out_n]) * acc[:, out_n:]
            out[start:end] = epilogue(acc, g, slice(start, end)) if epilogue else acc
        start = end
    return out


def _run(problem, params, a, b, offs, *eps):
    r = GEMV.render(problem, params, MPS)
    check_shader(r.meta["shader"])
    mod = host_launcher(r)
    out = torch.full((problem.M, problem.out_n), float("nan"), dtype=TORCH[problem.out_dtype])
    got = mod.launch(a, b, offs, *eps, out=out)
    assert got is out
    (threads,), (group,) = mod._library.calls[-1]
    assert (threads, group) == (r.meta["threads"], r.meta["group_size"])
    return out


@pytest.mark.parametrize("dtype,layout_b,rows", [("bf16", "col", 8), ("fp16", "col", 4), ("fp32", "row", 8)])
def test_grouped_gemv_matches_float64_on_ragged_decode_groups(dtype, layout_b, rows):
    M, K, N, G = 19, 70, 24, len(OFFSETS)
    g = torch.Generator().manual_seed(7)
    a = torch.randn(M, K, generator=g).to(TORCH[dtype])
    b = (torch.randn(G, N, K, generator=g).to(TORCH[dtype]).transpose(1, 2) if layout_b == "col"
         else torch.randn(G, K, N, generator=g).to(TORCH[dtype]))
    offs = torch.tensor(OFFSETS, dtype=torch.int32)
    p = GroupedGemmProblem("2d3d", G, M, N, K, dtype, layout_b=layout_b)
    for cols in (1, 4, 8):
        out = _run(p, {"BLOCK_M": rows, "BLOCK_N": cols, "num_warps": cols}, a, b, offs)
        ref = _grouped_reference(a, b, offs)
        used = OFFSETS[-1]
        assert not out[:used].isnan().any() and out[used:].isnan().all(), "rows past offs[-1] are not written"
        assert rel(out[:used], ref[:used]) < (1e-5 if dtype == "fp32" else 1e-2), (cols, rows)
        # the one-token groups, row by row
        for row, grp in ((0, 1), (13, 5)):
            assert out[row].double().allclose(a[row].double() @ b[grp].double(), rtol=2e-2, atol=2e-2)


def test_grouped_gemv_fuses_the_swiglu_and_the_epilogue():
    # the MoE gate_up projection: silu(gate) * up, then a per-expert bias and a residual
    M, K, N, G = 19, 64, 2 * 20, len(OFFSETS)
    g = torch.Generator().manual_seed(8)
    a = torch.randn(M, K, generator=g).bfloat16()
    b = torch.randn(G, N, K, generator=g).bfloat16().transpose(1, 2)
    bias = torch.randn(G, N // 2, generator=g).bfloat16()
    res = torch.randn(N // 2, M, generator=g).t()  # fp32, transposed storage: read through strides
    offs = torch.tensor(OFFSETS, dtype=torch.int32)
    p = GroupedGemmProblem("2d3d", G, M, N, K, "bf16", layout_b="col", glu="silu",
                           epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu"), EpilogueOp("add", input=1)),
                           epilogue_inputs=(EpilogueInput("BN", "bf16"), EpilogueInput("MN", "fp32")))
    out = _run(p, {"BLOCK_M": 8, "BLOCK_N": 4, "num_warps": 4}, a, b, offs, bias, res)
    ref = _grouped_reference(a, b, offs, glu="silu",
                             epilogue=lambda v, grp, rows: ACT["gelu"](v + bias[grp].double()) + res[rows].double())
    used = OFFSETS[-1]
    assert out.shape == (M, N // 2) and out[used:].isnan().all()
    assert rel(out[:used], ref[:used]) < 1e-2


def test_grouped_gemv_fp8_weights_with_their_scales():
    # torch._scaled_grouped_mm's form: e4m3 tokens and expert weights, a per-token scale (M)
    # and a per-expert, per-column scale (BN), fp32, applied to the fp32 sum; bf16 out
    M, K, N, G = 19, 48, 16, len(OFFSETS)
    g = torch.Generator().manual_seed(9)
    a = (torch.randn(M, K, generator=g) * 3).to(torch.float8_e4m3fn)
    b = (torch.randn(G, N, K, generator=g) * 3).to(torch.float8_e4m3fn).transpose(1, 2)
    sa = torch.rand(M, generator=g) + 0.5
    sb = torch.rand(G, N, generator=g) / 10
    offs = torch.tensor(OFFSETS, dtype=torch.int32)
    p = GroupedGemmProblem("2d3d", G, M, N, K, "fp8e4m3", out_dtype="bf16", layout_b="col", op="scaled_grouped_mm",
                           epilogue=(EpilogueOp("mul", input=0), EpilogueOp("mul", input=1)),
                           epilogue_inputs=(EpilogueInput("M", "fp32"), EpilogueInput("BN", "fp32")))
    r = GEMV.render(p, {"BLOCK_M": 8, "BLOCK_N": 8, "num_warps": 8}, MPS)
    assert "device const uchar* b [[buffer(1)]]" in r.meta["shader"] and "tw_e4m3(bg[" in r.meta["shader"]
    out = _run(p, {"BLOCK_M": 8, "BLOCK_N": 8, "num_warps": 8}, a, b, offs, sa, sb)
    ref = _grouped_reference(a.double(), b.double(), offs,
                             epilogue=lambda v, grp, rows: v * sa[rows, None].double() * sb[grp].double())
    used = OFFSETS[-1]
    assert out[used:].isnan().all() and rel(out[:used], ref[:used]) < 1e-2
    # uint8 tensors holding the codes are accepted as well (MPS has no float8 tensors)
    again = torch.full_like(out, float("nan"))
    host_launcher(r).launch(a.view(torch.uint8), b.view(torch.uint8), offs, sa, sb, out=again)
    assert torch.equal(again[:used], out[:used])


def test_grouped_gemv_with_every_group_empty_or_bad_offsets_writes_nothing_out_of_bounds():
    p = GroupedGemmProblem("2d3d", 3, 9, 8, 16, "fp32")
    a, b = torch.randn(9, 16), torch.randn(3, 16, 8)
    params = {"BLOCK_M": 8, "BLOCK_N": 4, "num_warps": 4}
    assert _run(p, params, a, b, torch.zeros(3, dtype=torch.int32)).isnan().all()
    # decreasing and too-large offsets are clamped: group 1 empty, group 2 rows 5..8
    out = _run(p, params, a, b, torch.tensor([5, 2, 40], dtype=torch.int32))
    ref = _grouped_reference(a, b, torch.tensor([5, 5, 9], dtype=torch.int32))
    assert rel(out, ref) < 1e-5


def test_grouped_gemv_refuses_what_it_cannot_run_naming_why():
    assert "2d2d case" in GEMV.supports(GroupedGemmProblem("2d2d", 2, 16, 16, 16, "bf16"), MPS).reason
    assert "mps target only" in GEMV.supports(GroupedGemmProblem("2d3d", 2, 16, 16, 16, "bf16"),
                                              get_target("h200")).reason
    p = GroupedGemmProblem("2d3d", 2, 16, 16, 16, "bf16")
    assert "num_warps must equal BLOCK_N" in GEMV.check({"BLOCK_N": 4, "num_warps": 8}, p, MPS)
    # decode-sized problems only are proposed: 512 tokens over 8 experts is the tiled kernel's
    assert GEMV.seed_params(GroupedGemmProblem("2d3d", 8, 512, 64, 64, "bf16"), MPS) == []
    assert GEMV.seed_params(GroupedGemmProblem("2d3d", 128, 8, 64, 64, "bf16"), MPS)


# -- the policy chooses them for decode shapes on the mps target ----------------------------------
def _winner(problem):
    from tilewright.autotune.select import select
    from tilewright.compiler.kernel_factory import default_factory

    return select(problem, MPS, default_factory).winner.template_id


def test_the_policy_chooses_the_grouped_gemv_for_decode_and_the_tiled_kernel_for_prefill():
    # Qwen3-30B-A3B's experts (128, top-8), one decode token: 8 rows over 128 groups
    for p in (GroupedGemmProblem("2d3d", 128, 8, 1536, 2048, "bf16", layout_b="col"),
              GroupedGemmProblem("2d3d", 128, 8, 2 * 768, 2048, "bf16", layout_b="col", glu="silu"),
              GroupedGemmProblem("2d3d", 8, 4, 512, 2048, "fp16", layout_b="col")):
        assert _winner(p) == "metal.grouped_gemv", p.describe()
    # prefill: 4096 rows over 128 experts (32 each) is a weight-reuse problem, the tiled kernel's
    assert _winner(GroupedGemmProblem("2d3d", 128, 4096, 1536, 2048, "bf16", layout_b="col")) == "metal.grouped_gemm"


def test_explain_shows_the_grouped_gemv_winning_a_decode_step(capsys):
    from tilewright.cli.main import main

    assert main(["explain", "8", "1536", "2048", "--dtype", "bf16", "--groups", "128", "--target", "mps"]) == 0
    out = capsys.readouterr().out
    assert "metal.grouped_gemv[" in out and "metal.grouped_gemm[" in out
    assert "winner: metal.grouped_gemv[" in out


def test_grouped_launchers_compile_their_shader_on_the_first_launch(monkeypatch):
    # bug: the tiled grouped GEMM's launcher called the library without ever compiling it
    # (`_library` stayed None on a Mac); the host tests set `_library` themselves, so missed it
    import tilewright.templates.metal.grouped as tiled
    import tilewright.templates.metal.grouped_gemv as gemv

    compiled = []

    class Lib:
        def __getattr__(self, name):
            return lambda *args, **kw: None

    monkeypatch.setattr(torch.mps, "compile_shader", lambda src: (compiled.append(src), Lib())[1], raising=False)
    p = GroupedGemmProblem("2d3d", 2, 4, 8, 16, "fp32")
    for mod in (tiled.grouped_gemm_kernel(p), gemv.grouped_gemv_kernel(p)):
        mod.require_metal_runtime = lambda: None
        mod.launch(torch.randn(4, 16), torch.randn(2, 16, 8), torch.tensor([1, 4], dtype=torch.int32))
        assert compiled[-1] == mod.SHADER and mod._library is not None
    assert len(compiled) == 2


# -- split-row reductions ---------------------------------------------------------------------------
SPLIT = get_template("metal.split_reduction")
VOCAB = 128256  # Llama 3's vocabulary: one decode step's logits row


def _loop_problem(fn, *args, dynamic=None):
    from tilewright.compiler.capture import ModelSpec, capture_kernels

    caps = capture_kernels(ModelSpec(fn, args, {}, "t", **({"dynamic": dynamic} if dynamic else {})))
    (p,) = [c.problem for c in caps if getattr(c.problem, "kind", "") == "reduction"]
    return p


def _split_run(problem, params, *inputs, sizes=()):
    from tilewright.autotune.kinds import poisoned_loop_outputs

    r = SPLIT.render(problem, params, MPS)
    check_shader(r.meta["shader"])
    mod = host_launcher(r)
    outs = mod.launch(*inputs, *sizes, outs=tuple(poisoned_loop_outputs(problem.with_sizes(
        **{s.name: v for s, v in zip(problem.kernel.size_symbols(), sizes)}) if sizes else problem, "cpu")))
    assert mod._library.launched == r.meta["kernels"] and len(r.meta["kernels"]) == r.meta["launches"]
    return outs, r


def _logits(rows: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Logits with masked (-inf) entries: scattered ones, and a masked run longer than any chunk."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, VOCAB, generator=g) * 4
    x[:, 1000:60000] = float("-inf")
    x[:, torch.randint(0, VOCAB, (5000,), generator=g)] = float("-inf")
    return x.to(dtype)


@pytest.mark.parametrize("op,dtype", [("softmax", torch.float32), ("log_softmax", torch.bfloat16)])
def test_split_row_softmax_over_a_128256_vocabulary_with_masked_logits(op, dtype):
    x = _logits(1, dtype, seed=11)
    fn = getattr(torch, op)
    p = _loop_problem(lambda v: fn(v.float(), -1), x)
    # one pass of partials (the max, and the sum of exp(x - max) after it), then the outputs
    assert [(len(plain), len(sums)) for plain, sums in schedule(p.kernel).passes] == [(1, 1)]
    for params in SPLIT.seed_params(p, MPS)[:2]:
        (out,), r = _split_run(p, params, x)
        assert r.meta["launches"] == 2  # the online form: partial max and sum, then the outputs
        ref = fn(x.double(), -1)
        finite = ref.isfinite()
        assert torch.equal(out.isfinite(), finite), "masked entries come out 0 / -inf exactly where torch's do"
        assert rel(out[finite], ref[finite]) < 1e-5, params


def test_a_fully_masked_row_gives_nan_as_torch_does_and_its_neighbours_stay_right():
    x = _logits(3, torch.float32, seed=12)
    x[1] = float("-inf")
    p = _loop_problem(lambda v: torch.softmax(v, -1), x)
    (out,), _ = _split_run(p, {"SPLIT": 4, "num_warps": 8}, x)
    assert torch.softmax(x[1:2], -1).isnan().all() and out[1].isnan().all()
    for row in (0, 2):
        ref = torch.softmax(x[row].double(), -1)
        assert rel(out[row], ref) < 1e-5


def test_split_row_reductions_of_every_kind_match_float64():
    # sums, NaN-propagating max/min, argmax ties across chunks, Welford's mean and variance,
    # any/all (one kernel, one pass) and an int64 sum (a tree: no 64-bit SIMD shuffles): few
    # rows of 9000, split 8 ways
    g = torch.Generator().manual_seed(13)
    x = torch.randn(3, 9000, generator=g)
    x[1, 4321] = float("nan")
    x[2, 100] = x[2, 8000] = 50.0  # an argmax tie in chunk 0 and chunk 7: the lower index wins
    n = torch.randint(-1000, 1000, (3, 9000), generator=g)

    def floats(v):
        return (v.sum(-1), v.amax(-1), v.amin(-1), v.argmax(-1), v.mean(-1), v.var(-1),
                (v > 3.5).any(-1), (v > -9.0).all(-1))

    for fn, inp in ((floats, x), (lambda i: i.sum(-1), n)):
        p = _loop_problem(fn, inp)
        outs, _ = _split_run(p, {"SPLIT": 8, "num_warps": 8}, inp)
        ref = load_reference(p)(inp)
        assert len(outs) == len(ref)
        for o, w in zip(outs, ref):
            if o.dtype.is_floating_point:
                assert torch.equal(o.isnan(), w.isnan()) and rel(o.nan_to_num(), w.nan_to_num()) < 1e-5
            else:
                assert torch.equal(o.to(w.dtype), w)
    assert int(floats(x)[3][2]) == 100  # the tie the kernel had to break torch's way
    assert int(_split_run(_loop_problem(lambda v: v.argmax(-1), x), {"SPLIT": 8, "num_warps": 8}, x)[0][0][2]) == 100


def load_reference(problem):
    """The problem in float64 through the ATen template's reference form."""
    from tilewright.runtime.loader import load_module
    from tilewright.templates.aten.loops import render_torch

    mod = load_module(render_torch(problem), name=f"tw_split_ref_{problem.stable_hash()[:8]}", interpret=False)
    return lambda *inputs: mod.launch(*inputs, reference=True)


def test_a_row_shorter_at_run_time_leaves_chunks_empty_and_stays_right():
    # a dynamic row length: the kernel chosen at 9000 runs a row of 700 with 8 chunks of 88
    x = torch.randn(2, 9000)
    p = _loop_problem(lambda v: torch.log_softmax(v, -1), x, dynamic={0: [1]})
    assert p.kernel.size_symbols()
    short = torch.randn(2, 700)
    short[0, :300] = float("-inf")
    (out,), _ = _split_run(p, {"SPLIT": 16, "num_warps": 8}, short, sizes=(700,))
    ref = torch.log_softmax(short.double(), -1)
    finite = ref.isfinite()
    assert torch.equal(out.isfinite(), finite) and rel(out[finite], ref[finite]) < 1e-5


def test_the_policy_splits_few_long_rows_and_keeps_many_rows_whole():
    for shape, want in (((1, VOCAB), "metal.split_reduction"), ((4, VOCAB), "metal.split_reduction"),
                        ((64, 4096), "metal.reduction"), ((1, 2048), "metal.reduction")):
        p = _loop_problem(lambda v: torch.softmax(v.float(), -1), torch.randn(*shape).bfloat16())
        assert _winner(p) == want, shape
    assert SPLIT.seed_params(_loop_problem(lambda v: v.sum(-1), torch.randn(64, 8192)), MPS) == []


def test_split_row_refusals_name_the_knob():
    p = _loop_problem(lambda v: torch.softmax(v, -1), torch.randn(1, 8192))
    assert "smaller SPLIT" in SPLIT.check({"SPLIT": 128, "num_warps": 8}, p, MPS)
    assert "persistent" not in (SPLIT.check({"SPLIT": 8, "num_warps": 8}, p, MPS) or "")
    assert "mps target only" in SPLIT.supports(p, get_target("h200")).reason


def test_aot_for_mps_builds_the_split_row_log_softmax_of_an_lm_head(tmp_path):
    # a decode step's lm_head + log_softmax: the logits row goes to the split-row kernel, whose
    # shader (both kernel functions) passes the check in `tilewright aot --target mps`
    import json

    from tilewright.compiler import aot
    from tilewright.compiler.capture import ModelSpec

    class Head(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lm_head = torch.nn.Linear(64, VOCAB // 8, bias=False)

        def forward(self, h):
            return torch.log_softmax(self.lm_head(h).float(), -1)

    report = aot.build(ModelSpec(Head(), (torch.randn(1, 64),), name="head"), ["mps"], tmp_path)
    assert report.ok
    kernels = json.loads((tmp_path / "manifest.json").read_text())["kernels"]
    split = [k for k in kernels if k["template"] == "metal.split_reduction"]
    assert split and all(k["status"] == "built" for k in split)
    shader = (tmp_path / "kernels" / split[0]["artifacts"]["metal"]).read_text()
    assert "kernel void tw_split_reduction_p0(" in shader and "kernel void tw_split_reduction_p1(" in shader


# -- issue 22's "done when": a model's decode kernels on the mps target ----------------------------
class DecodeHead(torch.nn.Module):
    """A decode step's lm_head over Llama 3's vocabulary and its log-softmax (one row)."""

    def __init__(self, hidden: int = 64):
        super().__init__()
        self.lm_head = torch.nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, h):
        return torch.log_softmax(self.lm_head(h).float(), -1)


def decode_head():
    """``(model, args)`` for ``tilewright explain --model test_metal_decode:decode_head``."""
    return DecodeHead().eval(), (torch.randn(1, 64),)


@pytest.mark.parametrize("spec,winner", [
    ("tilewright.demo.models:qwen3_moe_shapes", "metal.grouped_gemv["),  # 16 tokens, top-8 of 128 experts
    ("test_metal_decode:decode_head", "metal.split_reduction["),          # 1 x 128256 log-softmax
])
def test_a_models_decode_kernels_on_mps_choose_the_grouped_gemv_and_the_split_row_softmax(spec, winner, capsys):
    from tilewright.cli.main import main

    assert main(["explain", "--model", spec, "--kernel", "all", "--target", "mps"]) == 0
    out = capsys.readouterr().out
    assert "winner: " + winner in out, out[-2000:]


# -- on a Mac (skipped here: no Mac has run these kernels yet) --------------------------------------
@pytest.mark.skipif(not torch.backends.mps.is_available(), reason="needs macOS with MPS")
def test_on_a_mac_the_grouped_gemv_and_the_split_row_softmax_match_float64():
    from tilewright.templates.metal.grouped_gemv import grouped_gemv_kernel
    from tilewright.runtime.loader import load_module

    M, K, N, G = 19, 70, 24, len(OFFSETS)
    a = torch.randn(M, K).bfloat16()
    b = torch.randn(G, N, K).bfloat16().transpose(1, 2)
    offs = torch.tensor(OFFSETS, dtype=torch.int32)
    mod = grouped_gemv_kernel(GroupedGemmProblem("2d3d", G, M, N, K, "bf16", layout_b="col"))
    out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="mps")
    mod.launch(a.to("mps"), b.to("mps"), offs.to("mps"), out=out)
    used = OFFSETS[-1]
    assert rel(out.cpu()[:used], _grouped_reference(a, b, offs)[:used]) < 1e-2

    x = _logits(1, torch.float32, seed=21)
    p = _loop_problem(lambda v: torch.softmax(v, -1), x)
    r = SPLIT.render(p, SPLIT.seed_params(p, MPS)[0], MPS)
    split = load_module(r.source, name="tw_split_on_mps", interpret=False)
    (got,) = split.launch(x.to("mps"), outs=(torch.full(x.shape, float("nan"), device="mps"),))
    ref = torch.softmax(x.double(), -1)
    finite = ref.isfinite()
    assert torch.equal(got.cpu().isfinite(), finite) and rel(got.cpu()[finite], ref[finite]) < 1e-5
