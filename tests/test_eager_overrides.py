"""The eager overrides ``tilewright.kernels.rms_norm`` / ``topk``: ATen's exact result wherever the
FlyDSL path is not taken (here: always, on CPU), clear errors for bad input, and the performance
gate exercised with fake FlyDSL launchers (faster, slower, failing) on CPU."""

from __future__ import annotations

import time
import warnings

import pytest
import torch
import torch.nn.functional as F

import tilewright.kernels as K
from tilewright.errors import InvalidInputError
from tilewright.templates.flydsl import gate

rms_mod = __import__("sys").modules["tilewright.kernels.rms_norm"]
topk_mod = __import__("sys").modules["tilewright.kernels.topk"]


def _rel(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.double() - ref).norm() / ref.norm()).item()


def _rms_ref64(x, w, eps):
    x64 = x.double()
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.fixture(autouse=True)
def fresh_gate():
    gate.reset()
    yield
    gate.reset()


# -- ATen fall-through ----------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(1, 1), (3, 37), (2, 5, 129), (7, 1000)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rms_norm_falls_through_to_aten_exactly(shape, dtype):
    x = torch.randn(shape, dtype=torch.float64).to(dtype) * 3 + 0.5
    w = torch.rand(shape[-1], dtype=torch.float64).to(dtype) + 0.5
    out = K.rms_norm(x, w, eps=1e-5)
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out, F.rms_norm(x, (shape[-1],), w, 1e-5))
    tol = 1e-6 if dtype == torch.float32 else 1e-2
    assert _rel(out, _rms_ref64(x, w, 1e-5)) < tol


def test_rms_norm_non_contiguous_and_mixed_weight_dtype():
    base = torch.randn(6, 48, 2)
    x = base[..., 0]  # last-dim stride 2
    w = torch.rand(48) + 0.5
    assert not x.is_contiguous()
    assert K.explain_dispatch("rms_norm", x, w).path == "aten"
    out = K.rms_norm(x, w)
    assert torch.equal(out, F.rms_norm(x, (48,), w, 1e-6)) and _rel(out, _rms_ref64(x, w, 1e-6)) < 1e-6
    xb = torch.randn(4, 64).bfloat16()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ATen warns that mixed dtypes are not fused
        out = K.rms_norm(xb, torch.rand(64) + 0.5)
    assert out.dtype == torch.bfloat16


@pytest.mark.parametrize("E", [1, 9, 64, 100, 256, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_falls_through_to_aten_exactly(E, dtype):
    x = torch.randn(13, E, dtype=torch.float64).to(dtype)
    for k in sorted({0, 1, min(E, 3), min(E, 8)}):
        for largest in (True, False):
            v, i = K.topk(x, k, largest=largest)
            ref = torch.topk(x, k, largest=largest)
            assert torch.equal(v, ref.values) and torch.equal(i, ref.indices) and i.dtype == torch.int64
            sorted64 = torch.sort(x.double(), dim=-1, descending=largest).values[:, :k]
            assert torch.equal(v.double(), sorted64)  # the right values, in order
            assert torch.equal(x.gather(-1, i), v)


def test_topk_other_dims_non_contiguous_and_unsorted_are_atens():
    x = torch.randn(5, 40, 6)
    for args in [(x, 3, 1), (x.transpose(1, 2), 4, -1), (x[:, ::2, :], 2, 0), (x, 6, -1, False, False)]:
        got, ref = K.topk(*args), torch.topk(*args)
        assert torch.equal(got.values, ref.values) and torch.equal(got.indices, ref.indices)
    assert K.explain_dispatch("topk", x, 2).path == "aten"
    assert "cpu" in K.explain_dispatch("topk", x, 2).reason


# -- bad input ------------------------------------------------------------------------------------
def test_bad_inputs_name_the_fix():
    x = torch.randn(4, 16)
    with pytest.raises(InvalidInputError, match=r"pass a weight of shape \(16,\)"):
        K.rms_norm(x, torch.ones(15))
    with pytest.raises(InvalidInputError, match="one device"):
        K.rms_norm(x, torch.ones(16, device="meta"))
    with pytest.raises(InvalidInputError, match="eps must be"):
        K.rms_norm(x, torch.ones(16), eps=-1.0)
    with pytest.raises(InvalidInputError, match="pass k between 0 and 16"):
        K.topk(x, 17)
    with pytest.raises(InvalidInputError, match="out of range"):
        K.topk(x, 2, dim=2)
    with pytest.raises(InvalidInputError, match="unknown op"):
        K.explain_dispatch("softmax", x)


# -- the gate, with fake FlyDSL launchers on a pretend gfx950 -------------------------------------
class FakeFlyDsl:
    """A builder whose launchers return ATen's topk after ``delay_s``; counts builds and calls."""

    def __init__(self, delay_s=0.0, fail=None):
        self.delay_s, self.fail, self.builds, self.calls = delay_s, fail, 0, 0

    def __call__(self, key, *args):
        self.builds += 1
        if self.fail == "build":
            raise RuntimeError("LLVM said no")

        def launch(x, k, dim, largest, sorted):
            self.calls += 1
            if self.fail == "run" or (self.fail == "later" and self.calls > 8):
                raise RuntimeError("hipErrorNoBinaryForGpu")
            if self.delay_s:
                time.sleep(self.delay_s)
            v, i = torch.topk(x, k, dim, largest, sorted)
            if self.fail == "wrong":  # right values, wrong indices
                return torch.return_types.topk((v, i.flip(-1)))
            return torch.return_types.topk((v, i))
        return launch


@pytest.fixture
def pretend_gfx950(monkeypatch):
    monkeypatch.setattr(gate, "device_problem", lambda device: None)
    monkeypatch.setattr(gate, "device_arch", lambda device: "gfx950")
    # the fakes build nothing: a machine without flydsl (the GPU machine's) still checks the gate
    from tilewright.templates.flydsl import runtime as fly_runtime
    monkeypatch.setattr(fly_runtime, "toolchain_problem", lambda: None)
    monkeypatch.setattr(gate, "GATE_PAIRS", 5)
    monkeypatch.setattr(gate, "GATE_WARMUP", 1)

    def install(fake, aten_delay_s=0.0):
        monkeypatch.setitem(gate.FLYDSL_BUILDERS, "topk", fake)
        if aten_delay_s:
            def slow_aten(*args):
                time.sleep(aten_delay_s)
                return torch.topk(*args)
            monkeypatch.setattr(topk_mod, "_aten", slow_aten)
        return fake
    return install


def test_gate_records_faster_flydsl_once_and_follows_it(pretend_gfx950):
    fake = pretend_gfx950(FakeFlyDsl(), aten_delay_s=0.003)
    x = torch.randn(7, 128)
    assert K.explain_dispatch("topk", x, 4).path == "gate"
    v, i = K.topk(x, 4)
    assert torch.equal(v, torch.topk(x, 4).values)
    assert fake.builds == 1 and fake.calls == 1 + 1 + 5 + 1  # check vs ATen, warmup, pairs, this call
    route = K.explain_dispatch("topk", torch.randn(8, 128), 4)  # 7 and 8 rows: one bucket
    assert route.path == "flydsl" and "measured FlyDSL" in route.reason
    assert route.decision.rules == gate.gate_rules() and "pairs=5" in route.decision.rules
    assert route.decision.flydsl_ms < route.decision.aten_ms
    K.topk(torch.randn(8, 128), 4)
    assert fake.builds == 1 and fake.calls == 9  # followed, not measured again
    K.topk(torch.randn(9, 128), 4)  # another bucket (16 rows): its own measurement
    assert fake.builds == 2 and len(gate.decisions()) == 2


def test_gate_keeps_aten_where_flydsl_is_slower(pretend_gfx950):
    fake = pretend_gfx950(FakeFlyDsl(delay_s=0.003))
    x = torch.randn(16, 64)
    K.topk(x, 2)
    route = K.explain_dispatch("topk", x, 2)
    assert route.path == "aten" and "ATen is used" in route.reason
    calls = fake.calls
    got = K.topk(x, 2)
    assert fake.calls == calls and torch.equal(got.indices, torch.topk(x, 2).indices)


def test_gate_measures_again_under_other_rules(pretend_gfx950, monkeypatch):
    fake = pretend_gfx950(FakeFlyDsl(), aten_delay_s=0.002)
    x = torch.randn(4, 32)
    K.topk(x, 1)
    monkeypatch.setattr(gate, "GATE_MARGIN", 0.5)  # a decision measured under other rules is stale
    assert K.explain_dispatch("topk", x, 1).path == "gate"
    K.topk(x, 1)
    assert fake.builds == 2


@pytest.mark.parametrize("fail", ["build", "run", "wrong"])
def test_a_failing_kernel_falls_through_with_one_warning(pretend_gfx950, fail):
    fake = pretend_gfx950(FakeFlyDsl(fail=fail), aten_delay_s=0.002)  # it would win if it worked
    x = torch.randn(5, 200).bfloat16()
    what = {"build": "build", "run": "run", "wrong": "match ATen.*indices do not point"}[fail]
    with pytest.warns(RuntimeWarning, match=f"failed to {what}"):
        got = K.topk(x, 8)
    ref = torch.topk(x, 8)
    assert torch.equal(got.values, ref.values) and torch.equal(got.indices, ref.indices)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        K.topk(x, 8)
    assert fake.builds == 1 and fake.calls <= 1  # a wrong or failing kernel is never timed
    assert K.explain_dispatch("topk", x, 8).path == "aten"


def test_a_kernel_that_stops_working_falls_back_for_good(pretend_gfx950):
    fake = pretend_gfx950(FakeFlyDsl(fail="later"), aten_delay_s=0.002)
    x = torch.randn(4, 256)
    K.topk(x, 8)  # measured and chosen: 8 calls
    assert K.explain_dispatch("topk", x, 8).path == "flydsl"
    with pytest.warns(RuntimeWarning, match="failed to run"):
        got = K.topk(x, 8)  # the 9th call raises inside: ATen answers
    assert torch.equal(got.values, torch.topk(x, 8).values)
    assert K.explain_dispatch("topk", x, 8).path == "aten"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        K.topk(x, 8)
    assert fake.calls == 9


def test_unsupported_inputs_skip_the_gate_even_on_gfx950(pretend_gfx950):
    fake = pretend_gfx950(FakeFlyDsl())
    x = torch.randn(6, 300)
    cases = {(x, 2): "300 elements", (x[:, :64], 2): "non-contiguous", (x[:, :64].contiguous(), 9): "k=9",
             (x.double()[:, :64], 2): "dtype", (x[:, :64].contiguous(), 2, 0): "dim=0",
             (x[:, :64].contiguous(), 2, -1, True, False): "sorted=False",
             (x[:, :64].contiguous().requires_grad_(), 2): "requires grad"}
    for args, why in cases.items():
        route = K.explain_dispatch("topk", *args)
        assert route.path == "aten" and why in route.reason, (why, route.reason)
        got, ref = K.topk(*args), torch.topk(*args)
        assert torch.equal(got.values, ref.values) and torch.equal(got.indices, ref.indices)
    assert fake.builds == 0 and not gate.decisions()


def test_rms_norm_gate_with_a_fake_faster_kernel_and_without_the_template(pretend_gfx950, monkeypatch):
    calls = []

    def builder(key, x, w, eps):
        def launch(x, w, eps):
            calls.append(key)
            return F.rms_norm(x, (x.shape[-1],), w, eps)
        return launch

    def slow_aten(*args):
        time.sleep(0.003)
        return F.rms_norm(args[0], (args[0].shape[-1],), args[1], args[2])

    monkeypatch.setitem(gate.FLYDSL_BUILDERS, "rms_norm", builder)
    monkeypatch.setattr(rms_mod, "_aten", slow_aten)
    x, w = torch.randn(3, 64), torch.rand(64) + 0.5
    assert K.explain_dispatch("rms_norm", x, w).path == "gate"
    out = K.rms_norm(x, w)
    assert torch.equal(out, F.rms_norm(x, (64,), w, 1e-6)) and len(calls) == 1 + 1 + 5 + 1
    assert K.explain_dispatch("rms_norm", x, w).path == "flydsl"
    assert K.explain_dispatch("rms_norm", x, w, eps=1e-5).path == "gate"  # eps is baked in: its own class
    strided = torch.randn(3, 128)[:, ::2]
    route = K.explain_dispatch("rms_norm", strided, w)
    assert route.path == "aten" and "non-contiguous" in route.reason
    assert torch.equal(K.rms_norm(strided, w), F.rms_norm(strided, (64,), w, 1e-6))
    # the real hook, with the flydsl.loops template missing: ATen, and no warning (not a failure)
    gate.reset()
    monkeypatch.setitem(gate.FLYDSL_BUILDERS, "rms_norm", rms_mod._build_flydsl)

    def no_template(template_id):
        raise KeyError(template_id)
    monkeypatch.setattr("tilewright.templates.get_template", no_template)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert torch.equal(K.rms_norm(x, w), F.rms_norm(x, (64,), w, 1e-6))
    route = K.explain_dispatch("rms_norm", x, w)
    assert route.path == "aten" and "flydsl.loops" in route.reason and "not in this build" in route.reason


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_captured_rms_norm_loop_problem_computes_rms_norm(dtype):
    # the problem the FlyDSL kernel is rendered from, run by the torch emitter of the same IR
    from tilewright.runtime.loader import load_module
    from tilewright.templates.aten.loops import render_torch

    p = rms_mod.reference_loop_problem(dtype, dtype, 1e-5)
    assert p.kind == "reduction" and "rsqrt" in p.op and [b.name for b in p.kernel.inputs] == ["in0", "in1"]
    launch = load_module(render_torch(p), name="rms_check", interpret=False).launch
    x = torch.randn(37, 200, dtype=torch.float64).to(dtype) * 2 + 0.3  # not the traced 64 x 256
    w = (torch.rand(200, dtype=torch.float64) + 0.5).to(dtype)
    sizes, xnumel, rnumel = rms_mod.loop_sizes(p, x)
    assert (sizes, xnumel, rnumel) == ([37, 200], 37, 200)
    (out,) = launch(x, w, *sizes)
    assert out.dtype == dtype and out.shape == x.shape
    ref = _rms_ref64(x, w, 1e-5)
    assert _rel(out, ref) < (1e-6 if dtype == torch.float32 else 1e-2)
    assert _rel(out, F.rms_norm(x, (200,), w, 1e-5).double()) < (1e-6 if dtype == torch.float32 else 1e-2)


def test_the_flydsl_rms_norm_kernel_compiles_for_gfx950(tmp_path):
    # what _build_flydsl renders, built compile-only (one compile): loads, the wave combine, LDS
    from tilewright.templates.flydsl import runtime as fly
    from tilewright.runtime.targets import get_target
    from tilewright.runtime.verify import verify
    from tilewright.templates import get_template

    why = fly.toolchain_problem()
    if why:
        pytest.skip(f"FlyDSL compile-only toolchain not ready: {why}")
    template, target = get_template("flydsl.reduction"), get_target("hip:gfx950")
    p = rms_mod.reference_loop_problem(torch.bfloat16, torch.bfloat16, 1e-6)
    params = template.seed_params(p.with_sizes(z1=4096), target)[-1]
    assert params["num_warps"] == 16  # a 4096-wide row (Qwen3's hidden size) fills 16 waves
    rendered = template.render(p, params, target)
    src = tmp_path / "rms.py"
    src.write_text(rendered.source)
    res = fly.compile_source(src, "gfx950", tmp_path / "dump")
    checked = verify({"amdgcn": res.isa_path}, template.expected_instructions(p, params, target))
    assert checked.ok, checked.failures
    assert res.scratch_bytes == 0 and res.lds_bytes == template.lds_bytes(p, params) <= 160 * 1024


def test_rms_norm_gate_refuses_a_kernel_that_disagrees_with_aten(pretend_gfx950, monkeypatch):
    monkeypatch.setitem(gate.FLYDSL_BUILDERS, "rms_norm", lambda key, x, w, eps: lambda x, w, eps: x * 1.01)
    x, w = torch.randn(8, 96).bfloat16(), torch.rand(96).bfloat16() + 0.5
    with pytest.warns(RuntimeWarning, match="relative error against ATen"):
        out = K.rms_norm(x, w)
    assert torch.equal(out, F.rms_norm(x, (96,), w, 1e-6))
    assert K.explain_dispatch("rms_norm", x, w).path == "aten"
