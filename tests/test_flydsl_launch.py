"""The FlyDSL launchers: each template module's ``launch(...)`` maps torch tensors onto its
``@flyc.jit`` host function and runs it on the current stream (tilewright.templates.flydsl.launch).

No gfx950 here, so nothing is launched. What is proven instead:

- the argument mapping and the stream handling, by calling every template's ``launch`` with
  user-shaped CPU tensors (a transposed weight, a broadcast bias, a residual with odd strides,
  padded rows, ragged groups) under FlyDSL's compile-only mode with a recording stand-in for the
  launch (``record_launches(compile=True)``, tests/flydsl_record.py): each recorded call is
  checked against the host function's signature, mapped back onto the caller's tensors, and
  traced and compiled for gfx950 by FlyDSL itself; the stream is the one the launcher asked
  for the tensors' device, packed by FlyDSL's own Stream argument;
- the runtime's rules (the stream on a GPU device, the signature check, the compiled-function
  cache, the refusals off a gfx950) with torch's device calls stubbed;
- that a compiled model on gfx950 is offered FlyDSL GEMM, grouped GEMM and MX GEMM candidates
  (``tilewright explain``, for one problem and for a model's kernels), and that without
  FlyDSL's toolchain they stay ``aot_only``, refused by ``supports`` with the language's reason.

The instruction checks of every template's build, through the same ``launch``, are in
tests/test_flydsl_{gemm,mx_gemm,loops,topk}.py (``compile_aot`` calls ``launch``).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tilewright.errors import EnvironmentMismatchError, InvalidInputError
from tilewright.grouped import GroupedGemmProblem
from tilewright.problem import EpilogueInput, EpilogueOp, GemmProblem
from tilewright.templates.flydsl import runtime as fly
from tilewright.templates.flydsl import launch as rt
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template, templates_for

GFX950 = get_target("hip:gfx950")
HERE = Path(__file__).parent

DENSE = GemmProblem(M=70, N=136, K=256, dtype="bf16", layout_b="col",
                    epilogue=(EpilogueOp("add", input=0), EpilogueOp("gelu"), EpilogueOp("add", input=1)),
                    epilogue_inputs=(EpilogueInput("N", "bf16"), EpilogueInput("MN", "fp32")))
MOE = GroupedGemmProblem(case="2d3d", G=4, M=50, N=128, K=256, dtype="bf16", layout_b="col",
                         epilogue=(EpilogueOp("add", input=0), EpilogueOp("silu")),
                         epilogue_inputs=(EpilogueInput("BN", "bf16"),))
MX = GemmProblem(M=48, N=64, K=256, dtype="mxfp4", out_dtype="bf16", layout_b="col", scale_layout="row",
                 epilogue=(EpilogueOp("add", input=0),), epilogue_inputs=(EpilogueInput("N", "bf16"),))


@pytest.fixture
def toolchain():
    why = fly.toolchain_problem()
    if why:
        pytest.skip(f"FlyDSL compile-only toolchain not ready: {why}")


def _pointwise_problem():
    from tilewright.compiler.capture import ModelSpec, capture_kernels

    caps = capture_kernels(ModelSpec(lambda x, y: torch.nn.functional.silu(x) * y,
                                     (torch.randn(29, 74), torch.randn(74)), {}, "t"))
    (p,) = [c.problem for c in caps if getattr(c.problem, "kind", "") == "pointwise"]
    return p


def _cases(tmp_path: Path) -> list[dict]:
    from tilewright.kernels.rms_norm import reference_loop_problem
    from tilewright.templates.flydsl.topk import TopkProblem

    def source(name, template, problem, params):
        path = tmp_path / f"{name}.py"
        path.write_text(get_template(template).render(problem, params, GFX950).source)
        return str(path)

    rms = reference_loop_problem(torch.bfloat16, torch.bfloat16, 1e-6)
    return [
        dict(name="gemm", source=source("gemm", "flydsl.gemm", DENSE,
                                        dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, num_stages=2)),
             build="a = torch.randn(70, 256).bfloat16(); w = torch.randn(136, 256).bfloat16()\n"
                   "bias = torch.randn(136).bfloat16(); res = torch.randn(136, 70).t()",
             call="mod.launch(a, w.t(), bias.expand(70, 136), res)"),
        dict(name="grouped", source=source("grouped", "flydsl.grouped_gemm", MOE,
                                           dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, num_stages=2)),
             build="a = torch.randn(50, 256).bfloat16(); w = torch.randn(4, 128, 256).bfloat16()\n"
                   "offs = torch.tensor([10, 10, 31, 50], dtype=torch.int32); bias = torch.randn(4, 128).bfloat16()\n"
                   "out = torch.full((50, 128), float('nan')).bfloat16()",
             call="mod.launch(a, w.transpose(1, 2), offs, bias, out=out)"),
        dict(name="mx", source=source("mx", "flydsl.mx_gemm", MX,
                                      dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=256, num_stages=2)),
             build="a = torch.randint(0, 256, (48, 128), dtype=torch.uint8)\n"
                   "b = torch.randint(0, 256, (64, 128), dtype=torch.uint8)\n"
                   "sa = torch.randint(120, 130, (48, 8), dtype=torch.uint8).view(torch.float8_e8m0fnu)\n"
                   "sb = torch.randint(120, 130, (64, 8), dtype=torch.uint8).view(torch.float8_e8m0fnu)\n"
                   "bias = torch.randn(64).bfloat16()",
             call="mod.launch(a, b, bias.expand(48, 64), a_scale=sa, b_scale=sb)"),
        dict(name="reduction", source=source("reduction", "flydsl.reduction", rms,
                                             dict(XBLOCK=1, RBLOCK=128, num_warps=2)),
             build="xp = torch.randn(5, 320).bfloat16(); x = xp[:, :300]; w = torch.randn(300).bfloat16()\n"
                   "out = torch.empty(5, 300).bfloat16()",
             call="mod.launch(x, w, 5, 300, outs=(out,))"),
        dict(name="pointwise", source=source("pointwise", "flydsl.pointwise", _pointwise_problem(),
                                             dict(XBLOCK=256, num_warps=4)),
             build="x = torch.randn(74, 29).t(); y = torch.randn(148)[::2]",
             call="mod.launch(x, y)"),
        dict(name="topk", source=source("topk", "flydsl.topk", TopkProblem(E=100, k=6, dtype="fp16"), {"ROWS": 2}),
             build="xp = torch.randn(37, 128).half(); x = xp[:, :100]",
             call="mod.launch(x)"),
    ]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict:
    """Every template's launch, recorded and compiled for gfx950 in one child process."""
    if fly.toolchain_problem():
        pytest.skip(f"FlyDSL compile-only toolchain not ready: {fly.toolchain_problem()}")
    tmp = tmp_path_factory.mktemp("flydsl_launch")
    cases = tmp / "cases.json"
    cases.write_text(json.dumps(_cases(tmp)))
    proc = subprocess.run([sys.executable, str(HERE / "flydsl_record.py"), str(cases)],
                          env=fly.compile_env("gfx950", tmp / "dump"), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RECORD "))
    report = {c["name"]: c for c in json.loads(line[len("RECORD "):])}
    report["_isas"] = sorted(str(p) for p in (tmp / "dump").glob("*/*final_isa.s"))
    return report


def _one(report: dict, name: str) -> dict:
    case = report[name]
    assert case["asked"] == ["cpu"], "the launcher asks for the stream of its tensors' device, once"
    (launch,) = case["launches"]
    assert launch["problems"] == [], launch["problems"]
    assert launch["annotations"][-1] == "Stream" and launch["args"][-1] == {"stream": 0xBEEF}
    return {p: a for p, a in zip(launch["params"], launch["args"])}


def test_every_launch_was_compiled_for_gfx950_by_flydsl(recorded):
    assert len(recorded["_isas"]) == 6  # one kernel per case, traced from the recorded call
    for isa in recorded["_isas"]:
        assert "gfx950" in Path(isa).read_text()[:20000]


def test_gemm_launch_maps_a_transposed_weight_a_bias_and_a_strided_residual(recorded):
    args = _one(recorded, "gemm")
    assert args["A"] == dict(shape=[70, 256], stride=[256, 1], dtype="torch.bfloat16", device="cpu", of="a", offset=0)
    assert args["B"]["of"] == "w" and args["B"]["shape"] == [136, 256] and args["B"]["stride"] == [256, 1]
    assert args["C"]["of"] == "result0" and args["C"]["shape"] == [70, 136]
    assert args["E0"]["of"] == "bias" and (args["se0_m"], args["se0_n"]) == (0, 1)
    # the fp32 residual read in place through its strides: element (m, n) at m * 1 + n * 70
    assert args["E1"]["of"] == "res" and args["E1"]["dtype"] == "torch.float32"
    assert (args["se1_m"], args["se1_n"]) == (1, 70)
    assert (args["M"], args["N"], args["K"]) == (70, 136, 256)


def test_grouped_launch_maps_offsets_and_a_per_group_bias(recorded):
    args = _one(recorded, "grouped")
    assert args["A"]["of"] == "a" and args["B"]["of"] == "w" and args["B"]["shape"] == [4, 128, 256]
    assert args["C"]["of"] == "out" and args["OFFS"]["of"] == "offs" and args["OFFS"]["dtype"] == "torch.int32"
    assert args["E0"]["of"] == "bias" and (args["se0_b"], args["se0_m"], args["se0_n"]) == (128, 0, 1)
    assert (args["T"], args["N"], args["K"], args["G"]) == (50, 128, 256, 4)


def test_mx_launch_maps_bytes_and_e8m0_scales_without_copies(recorded):
    args = _one(recorded, "mx")
    for param, name, shape in (("A", "a", [48, 128]), ("B", "b", [64, 128]), ("SA", "sa", [48, 8]),
                               ("SB", "sb", [64, 8])):
        assert args[param]["of"] == name and args[param]["shape"] == shape and args[param]["dtype"] == "torch.uint8"
    assert args["C"]["of"] == "result0" and args["C"]["dtype"] == "torch.bfloat16"
    assert (args["se0_m"], args["se0_n"]) == (0, 1) and (args["M"], args["N"], args["K"]) == (48, 64, 256)


def test_loop_launches_pass_padded_rows_and_strided_inputs_in_place(recorded):
    red = _one(recorded, "reduction")
    assert red["in0"]["of"] == "xp" and red["in0"]["stride"] == [320, 1] and red["in1"]["of"] == "w"
    assert red["out0"]["of"] == "out" and (red["xnumel"], red["rnumel"]) == (5, 300)
    pw = _one(recorded, "pointwise")
    assert pw["in0"]["of"] == "x" and pw["in0"]["stride"] == [1, 29]  # the transposed view as it is
    # y[::2] has no unit-stride dim (FlyDSL's layouts need one): a contiguous copy goes in
    assert pw["in1"]["of"] is None and pw["in1"]["shape"] == [74] and pw["in1"]["stride"] == [1]
    assert pw["out0"]["of"] == "result0" and pw["xnumel"] == 29 * 74


def test_topk_launch_reads_padded_rows_in_place(recorded):
    args = _one(recorded, "topk")
    assert args["X"]["of"] == "xp" and args["X"]["stride"] == [128, 1]
    assert args["Values"]["of"] == "result0" and args["Indices"]["dtype"] == "torch.int64"
    assert (args["T"], args["E"]) == (37, 100)


# -- the runtime's rules, with torch's device calls stubbed ------------------------------------------
class _Stream:
    def __init__(self, handle: int):
        self.cuda_stream = handle


def test_the_stream_is_torchs_current_stream_of_the_tensors_device(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: (asked.append(d), _Stream(7 + d.index))[1])
    dev = torch.device("cuda", 2)
    assert rt.current_stream(dev).cuda_stream == 9 and asked == [dev]
    assert rt.current_stream(torch.device("cpu")) is None  # placeholders: FlyDSL's default queue


class _Ann:
    def __init__(self, name: str):
        self.__name__ = name


def _host(*names: str):
    """A stand-in host function whose parameters carry FlyDSL-named annotations."""
    def host(*args):
        pass
    import inspect

    params = [inspect.Parameter(f"p{i}", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=_Ann(n))
              for i, n in enumerate(names)]
    host.__signature__ = inspect.Signature(params)
    return host


def test_call_problems_name_each_mismatch(monkeypatch):
    host = _host("Tensor", "Int32", "Stream")
    cpu = torch.device("cpu")
    assert rt.call_problems(host, (torch.zeros(3), 4, None), cpu) == []
    assert "2 arguments for 3" in rt.call_problems(host, (torch.zeros(3), 4), cpu)[0]
    problems = rt.call_problems(host, (torch.zeros(4)[::2], 2**31, "s"), cpu)
    assert len(problems) == 3 and "unit-stride" in problems[0] and "outside Int32" in problems[1]
    assert "stream" in problems[2]
    assert "a tensor expected" in rt.call_problems(host, (3, 4, None), cpu)[0]
    assert "an int expected" in rt.call_problems(host, (torch.zeros(3), 4.0, None), cpu)[0]
    # on a GPU the stream must be the device's current one
    monkeypatch.setattr(torch.cuda, "current_stream", lambda d: _Stream(5))
    gpu = torch.device("cuda", 0)
    host = _host("Int32", "Stream")
    assert rt.call_problems(host, (1, _Stream(5)), gpu) == []
    assert "current stream" in rt.call_problems(host, (1, _Stream(6)), gpu)[0]
    assert "current stream" in rt.call_problems(host, (1, None), gpu)[0]


@pytest.mark.skipif(importlib.util.find_spec("flydsl") is None,
                    reason="flydsl is not installed: these refusals are the ones past the package")
def test_off_a_gfx950_the_launch_is_refused_naming_why(monkeypatch):
    monkeypatch.delenv("COMPILE_ONLY", raising=False)
    assert "cpu" in rt.device_problem(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", None)
    assert "ROCm build" in rt.device_problem(torch.device("cuda", 0))
    monkeypatch.setattr(torch.version, "hip", "6.4")
    monkeypatch.setattr(rt, "device_arch", lambda d: "gfx942")
    assert "gfx942" in rt.device_problem(torch.device("cuda", 0))
    monkeypatch.setattr(fly, "available", lambda: False)
    assert "pip install" in rt.device_problem(torch.device("cuda", 0))
    with pytest.raises(EnvironmentMismatchError, match="flydsl is not installed"):
        rt.run(lambda A, stream=None: None, [torch.zeros(2)], torch.device("cpu"))


def test_flydsl_is_refused_where_cutedsl_mlir_is_loaded(monkeypatch):
    # bug guarded: importing FlyDSL after CuTeDSL compiled a kernel in the same process aborted
    # it (a test worker died: "Fatal Python error: Aborted"); now the launch is refused by name
    import types

    monkeypatch.delitem(sys.modules, "flydsl._mlir", raising=False)
    monkeypatch.setitem(sys.modules, "cutlass._mlir", types.ModuleType("cutlass._mlir"))
    monkeypatch.setattr(fly, "available", lambda: True)
    assert "CuTeDSL's MLIR" in fly.mlir_conflict()
    monkeypatch.setattr(torch.version, "hip", "6.4")
    monkeypatch.setattr(rt, "device_arch", lambda d: "gfx950")
    assert "CuTeDSL's MLIR" in rt.device_problem(torch.device("cuda", 0))
    monkeypatch.setenv("COMPILE_ONLY", "1")
    with pytest.raises(EnvironmentMismatchError, match="CuTeDSL's MLIR"):
        rt.run(lambda A, stream=None: None, [torch.zeros(2)], torch.device("cpu"))


def test_compiled_once_per_specialisation_then_called_directly(monkeypatch):
    import types

    compiles, calls = [], []

    class Compiled:
        def __call__(self, *call):
            calls.append(call)

    fake = types.SimpleNamespace(compile=lambda entry, *call: (compiles.append(call), Compiled())[1])
    monkeypatch.setitem(sys.modules, "flydsl.compiler", fake)
    monkeypatch.setitem(sys.modules, "flydsl", types.SimpleNamespace(compiler=fake))
    monkeypatch.delenv("COMPILE_ONLY", raising=False)
    monkeypatch.setattr(rt, "device_problem", lambda d: None)
    monkeypatch.setattr(rt, "call_problems", lambda e, c, d: [])
    monkeypatch.setattr(rt, "_ensure_rocm_env", lambda d: None)
    monkeypatch.setattr(rt, "_compiled", {})

    def host(A, M, stream=None):
        pass

    dev = torch.device("cpu")
    rt.run(host, [torch.zeros(4, 3), 4], dev)          # compiles (and FlyDSL runs it once)
    rt.run(host, [torch.zeros(8, 3), 8], dev)          # same specialisation: called directly
    rt.run(host, [torch.zeros(3, 4).t(), 4], dev)      # another unit-stride dim: compiles again
    assert [c[1] for c in compiles] == [4, 4] and [c[1] for c in calls] == [8]


def ran_in_a_fresh_process(request) -> bool:
    """Run this test again in a fresh pytest process when CuTeDSL's MLIR is loaded in this one
    (an earlier test of the same worker compiled a CuTeDSL kernel): importing FlyDSL here would
    abort the worker (``fly.mlir_conflict``). True when it ran there and passed."""
    if fly.mlir_conflict() is None or os.environ.get("TILEWRIGHT_TEST_FRESH_PROCESS"):
        return False
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           request.node.nodeid], cwd=Path(__file__).parents[1], capture_output=True, text=True,
                          env={**os.environ, "TILEWRIGHT_TEST_FRESH_PROCESS": "1"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return True


def test_the_launchers_refuse_bad_inputs_naming_the_fix(tmp_path, request):
    # the module imports FlyDSL: checked in-process only where it is installed
    pytest.importorskip("flydsl")
    if ran_in_a_fresh_process(request):
        return
    from tilewright.runtime.loader import load_module

    r = get_template("flydsl.gemm").render(DENSE, dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64), GFX950)
    mod = load_module(r.source, name="tw_fly_gemm_refusals", interpret=False)
    a, w = torch.randn(70, 256).bfloat16(), torch.randn(136, 256).bfloat16()
    with pytest.raises(InvalidInputError, match="2 epilogue inputs"):
        mod.launch(a, w.t())
    with pytest.raises(InvalidInputError, match="bfloat16 operands"):
        mod.launch(a.float(), w.t(), torch.zeros(136), torch.zeros(70, 136))
    with pytest.raises(InvalidInputError, match="multiple of BLOCK_K"):
        mod.launch(a[:, :200], w[:, :200].t(), torch.zeros(136), torch.zeros(70, 136))
    with pytest.raises(EnvironmentMismatchError, match="ROCm gfx950 GPU; these tensors are on cpu"):
        mod.launch(a, w.t(), torch.zeros(136).bfloat16(), torch.zeros(70, 136))


# -- a compiled model on gfx950 is offered them ------------------------------------------------------
def test_explain_on_gfx950_lists_flydsl_gemm_grouped_and_mx(toolchain, monkeypatch, capsys):
    from tilewright.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv, template in ((["256", "512", "1024", "--dtype", "bf16"], "flydsl.gemm"),
                           (["64", "512", "1024", "--dtype", "bf16", "--groups", "8"], "flydsl.grouped_gemm"),
                           (["256", "512", "1024", "--dtype", "mxfp4"], "flydsl.mx_gemm")):
        assert main(["explain", *argv, "--target", "gfx950"]) == 0
        assert template + "[" in capsys.readouterr().out, argv


def test_explain_refuses_groups_it_cannot_build_naming_why(capsys):
    from tilewright.cli.main import main

    assert main(["explain", "8", "64", "64", "--groups", "0"]) == 2
    assert "--groups 0: give the number of experts" in capsys.readouterr().out
    assert main(["explain", "8", "64", "64", "--groups", "4", "--dtype", "mxfp4"]) == 2
    assert "--groups takes --dtype fp32, fp16 or bf16, not mxfp4" in capsys.readouterr().out


def test_a_compiled_models_candidates_on_gfx950_include_flydsl_gemm_grouped_and_mx(toolchain, monkeypatch, capsys):
    # issue 22's "done when": the kernels tilewright makes of a model (the Qwen3-30B-A3B decode
    # GEMMs: dense projections, the experts' grouped GEMMs; the MXFP4 variant's dense ones),
    # each selected for gfx950 in explain --model, list the FlyDSL templates as candidates
    from tilewright.cli.main import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for spec, templates in (("tilewright.demo.models:qwen3_moe_shapes", ("flydsl.gemm[", "flydsl.grouped_gemm[")),
                            ("tilewright.demo.models:qwen3_moe_shapes_mxfp4", ("flydsl.mx_gemm[",))):
        assert main(["explain", "--model", spec, "--kernel", "all", "--target", "gfx950"]) == 0
        out = capsys.readouterr().out
        for template in templates:
            assert template in out, (spec, template)


def test_without_the_toolchain_flydsl_stays_aot_only_with_the_reason(monkeypatch):
    # the reason is the language's availability check, the one supports() refuses with
    monkeypatch.setattr(fly, "toolchain_problem", lambda: "flydsl is not installed: pip install -e '.[flydsl]'")
    for tid in ("flydsl.gemm", "flydsl.grouped_gemm", "flydsl.mx_gemm", "flydsl.reduction", "flydsl.topk"):
        t = get_template(tid)
        assert t.aot_only and "pip install" in t.aot_only_reason
        assert t.aot_only_reason == t.language.check()
    refused = get_template("flydsl.gemm").supports(DENSE, GFX950)
    assert not refused and "pip install" in refused.reason
    assert not any(t.backend == "flydsl" for op in ("gemm", "grouped_gemm", "reduction")
                   for t in templates_for(op, "hip", jit=True))


def test_the_eager_overrides_build_on_the_module_launchers(request):
    # rms_norm's and topk's FlyDSL builders (what the gate calls on a gfx950) hand their calls
    # to the rendered modules' launch: recorded here instead of run
    pytest.importorskip("flydsl")
    if ran_in_a_fresh_process(request):
        return
    import importlib

    from tilewright.templates.flydsl import gate

    rms_norm = importlib.import_module("tilewright.kernels.rms_norm")  # the package exports the functions
    topk = importlib.import_module("tilewright.kernels.topk")

    x, w = torch.randn(2, 3, 256).bfloat16(), torch.randn(256).bfloat16()
    launch = rms_norm._build_flydsl(gate.GateKey("rms_norm", (8, 256, 1e-6), "bf16xbf16", "gfx950"), x, w, 1e-6)
    with rt.record_launches() as records:
        out = launch(x, w, 1e-6)
    (r,) = records
    assert r.problems == [] and r.entry == "host"
    assert r.arg("in0").data_ptr() == x.data_ptr() and tuple(r.arg("in0").shape) == (6, 256)
    assert r.arg("in1") is w and r.arg("out0").data_ptr() == out.data_ptr() and out.shape == x.shape
    assert (r.arg("xnumel"), r.arg("rnumel")) == (6, 256)

    logits = torch.randn(4, 5, 64)
    launch = topk._build_flydsl(gate.GateKey("topk", (32, 64, 8, True), "fp32", "gfx950"), logits, 8, -1, True, True)
    with rt.record_launches() as records:
        values, indices = launch(logits, 8, -1, True, True)
    (r,) = records
    assert r.problems == [] and r.arg("X").data_ptr() == logits.data_ptr() and tuple(r.arg("X").shape) == (20, 64)
    assert r.arg("Values").data_ptr() == values.data_ptr() and values.shape == (4, 5, 8)
    assert indices.dtype == torch.int64 and (r.arg("T"), r.arg("E")) == (20, 64)
