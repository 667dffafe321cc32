"""CUDA graphs for compiled graphs (compiler/cudagraphs.py): how a user turns them on, the
refusals (each named in a warning and the graph's report), the wiring into PyTorch's CUDA-graph
trees, and, on a GPU, a tiny Llama's decode step replayed."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

import tilewright
from tilewright import config
from tilewright.compiler import cudagraphs
from tilewright.compiler.report import collect_reports
from tilewright.errors import ConfigError


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(16, 24)
        self.register_buffer("shift", torch.randn(24))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x)) + self.shift


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    with config.patch(graph_race="off"):
        yield
    torch._dynamo.reset()


# -- asking for them ------------------------------------------------------------------------------
def test_mode_options_and_setting_turn_cudagraphs_on_and_off():
    assert cudagraphs.requested(None, None) == (False, None)
    assert cudagraphs.requested("default", None) == (False, None)
    assert cudagraphs.requested("reduce-overhead", None) == (True, None)
    assert cudagraphs.requested("max-autotune", None) == (True, None)
    assert cudagraphs.requested("max-autotune-no-cudagraphs", None) == (False, None)
    assert cudagraphs.requested(None, {"cudagraphs": True}) == (True, None)
    assert cudagraphs.requested("reduce-overhead", {"triton.cudagraphs": False}) == (False, None)
    assert cudagraphs.requested(None, {"cudagraphs": True, "cudagraph_sizes": [8, (2, 16)]}) == \
        (True, ((8,), (2, 16)))
    with config.patch(cudagraphs=True):
        assert cudagraphs.requested(None, None) == (True, None)
        assert cudagraphs.requested(None, {"cudagraphs": False}) == (False, None)


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "fastest"}, "mode='fastest'"),
    ({"options": {"max_autotune": True}}, "max_autotune"),
    ({"options": {"cudagraphs": True, "cudagraph_sizes": ["a"]}}, "cudagraph_sizes"),
])
def test_a_bad_mode_or_option_is_a_config_error_naming_it(kwargs, match):
    f = torch.compile(lambda x: x.sin() + 1, backend="tilewright", **kwargs)
    with pytest.raises(ConfigError, match=match):
        f(torch.randn(8))


# -- refusals -------------------------------------------------------------------------------------
def test_cpu_tensors_are_refused_with_a_warning_and_in_the_report():
    from torch._dynamo.utils import counters

    m = Net().eval()
    x = torch.randn(5, 16)
    skips = counters["inductor"]["cudagraph_skips"]
    with torch.no_grad():
        ref = m(x)
        with collect_reports() as reports, pytest.warns(UserWarning, match="CPU tensors"):
            out = torch.compile(m, backend="tilewright", mode="reduce-overhead")(x)
    assert _rel(out, ref) < 1e-5
    assert [r.cudagraphs["status"] for r in reports] == ["refused"]
    assert "CPU tensors" in reports[0].cudagraphs["reason"]
    assert counters["inductor"]["cudagraph_skips"] == skips + 1  # PyTorch's own count


def test_cudagraph_or_error_makes_a_refusal_an_error():
    """Inductor's setting for "capture or fail" applies to tilewright's graphs too."""
    with torch._inductor.config.patch({"triton.cudagraph_or_error": True}), \
            pytest.raises(Exception, match="runs without CUDA graphs: CPU tensors"):
        torch.compile(Net().eval(), backend="tilewright", mode="reduce-overhead")(torch.randn(2, 16))


def test_launch_report_names_the_refusal():
    m, x = Net().eval(), torch.randn(3, 16)
    with config.patch(cudagraphs=True), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = tilewright.launch_report(m, x)
    assert report.graphs[0].cudagraphs["status"] == "refused"
    assert "no CUDA graphs: CPU tensors" in report.format()
    assert report.to_json()["graphs"][0]["cudagraphs"]["status"] == "refused"


def test_a_refused_forward_leaves_its_backward_uncaptured_and_training_right():
    torch.manual_seed(0)
    m = Net()
    ref_m = Net()
    ref_m.load_state_dict(m.state_dict())
    x = torch.randn(4, 16)
    with collect_reports() as reports, pytest.warns(UserWarning, match="forward graph runs without"):
        torch.compile(m, backend="tilewright", mode="reduce-overhead")(x).square().sum().backward()
    ref_m(x).square().sum().backward()
    assert _rel(m.lin.weight.grad, ref_m.lin.weight.grad) < 1e-5
    by_kind = {r.kind: r.cudagraphs for r in reports}
    assert by_kind["forward"]["status"] == "refused" and "CPU tensors" in by_kind["forward"]["reason"]
    assert by_kind["backward"] == {"status": "refused", "reason": "its forward graph runs without CUDA graphs"}


def _fake_cuda(*shapes: tuple[int, ...]) -> list[torch.Tensor]:
    with FakeTensorMode():
        return [torch.empty(s, device="cuda") for s in shapes]


def test_refusal_reasons_of_cuda_graphs():
    """The checks on aot_autograd graphs of (fake) CUDA tensors: a clean graph passes; an
    in-place write to an input that is not static, symbolic sizes with no capture sizes, and a
    data-dependent value (a host sync) are refused, each naming what to change."""
    a, b = _fake_cuda((4,), (4,))
    clean = make_fx(lambda a, b: a * b)(a, b)
    assert cudagraphs.refusal(clean, [a, b], [], None) is None

    def mutate(a, b):
        a.add_(1)
        return a * b
    gm = make_fx(mutate)(a, b)
    assert cudagraphs.input_mutations(gm) == {0}
    assert "input mutation" in cudagraphs.refusal(gm, [a, b], [1], None)
    assert cudagraphs.refusal(gm, [a, b], [0], None) is None  # a static input (a buffer, a KV cache)

    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    n = ShapeEnv().create_unbacked_symint()
    reason = cudagraphs.refusal(clean, [a, b, n], [], None)
    assert reason.startswith("dynamic sizes without buckets") and "cudagraph_sizes" in reason
    assert cudagraphs.refusal(clean, [a, b, n], [], ((4,),)) is None

    g = fx.Graph()
    p = g.placeholder("a")
    p.meta["val"] = a
    item = g.call_function(torch.ops.aten._local_scalar_dense.default, (p,))  # .item(): a host sync
    item.meta["val"] = ShapeEnv().create_unbacked_symint()  # its value, known only at run time
    g.output(item)
    assert "cannot be captured" in cudagraphs.refusal(fx.GraphModule({}, g), [a], [], None)

    cpu = torch.empty(4)
    assert cudagraphs.refusal(clean, [a, cpu], [], None).startswith("CPU tensors")


# -- the wiring into the trees --------------------------------------------------------------------
def test_the_compiled_graph_goes_to_cudagraphify_impl_with_params_static_and_replays_counted(monkeypatch):
    """On the CPU the trees cannot run: this swaps ``cudagraphify_impl`` for a stand-in that
    behaves as they do from the outside (first call warms up, the second records, later calls
    replay the recorded outputs without calling the graph) and lets the CPU graph through the
    refusal, to check what tilewright hands the trees and how it counts."""
    import torch._inductor.cudagraph_trees as trees

    seen: dict = {}
    capturing = [False]

    def fake_impl(model, inputs, static_input_idxs, **kwargs):
        seen.update(inputs=list(inputs), static=list(static_input_idxs), **kwargs)
        outs: list = []

        def run(args):
            if len(outs) < 2:  # warm-up, then the recording
                capturing[0] = len(outs) == 1
                try:
                    outs.append(model(args))
                finally:
                    capturing[0] = False
                return outs[-1]
            args.clear()
            return outs[-1]  # a replay: the graph itself is not called
        return run

    monkeypatch.setattr(trees, "cudagraphify_impl", fake_impl)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    monkeypatch.setattr(cudagraphs, "refusal", lambda *a, **k: None)
    monkeypatch.setattr(cudagraphs, "_device_index", lambda *a: 0)
    m, x = Net().eval(), torch.randn(6, 16)
    with torch.no_grad():
        ref = m(x)
        c = torch.compile(m, backend="tilewright", mode="reduce-overhead")
        with collect_reports() as reports:
            outs = [c(x) for _ in range(5)]
    assert all(_rel(o, ref) < 1e-5 for o in outs)
    assert seen["is_inference"] and not seen["is_backward"] and seen["device_index"] == 0
    # the weight, the bias and the buffer are static (read in place); x is copied in
    params = {m.lin.weight.data_ptr(), m.lin.bias.data_ptr(), m.shift.data_ptr()}
    static_ptrs = {seen["inputs"][i].data_ptr() for i in seen["static"]}
    assert static_ptrs == params
    moving = [t for i, t in enumerate(seen["inputs"]) if i not in seen["static"] and isinstance(t, torch.Tensor)]
    assert len(moving) == 1 and torch.equal(moving[0], x)
    stats = reports[0].cudagraphs
    assert {k: stats[k] for k in ("status", "calls", "warmups", "recordings", "replays", "uncaptured")} == \
        {"status": "on", "calls": 5, "warmups": 1, "recordings": 1, "replays": 3, "uncaptured": 0}
    assert stats["static_inputs"] == 3


def test_only_the_named_sizes_of_a_dynamic_graph_go_to_the_trees(monkeypatch):
    import torch._inductor.cudagraph_trees as trees

    keys: list = []

    def fake_impl(model, inputs, static_input_idxs, **kwargs):
        def run(args):
            keys.append(tuple(a for a in args if isinstance(a, int)))
            return model(args)
        return run

    monkeypatch.setattr(trees, "cudagraphify_impl", fake_impl)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(cudagraphs, "refusal", lambda *a, **k: None)
    monkeypatch.setattr(cudagraphs, "_device_index", lambda *a: 0)
    f = torch.compile(lambda x: torch.softmax(x * 2, -1), backend="tilewright",
                      options={"cudagraphs": True, "cudagraph_sizes": [8]})
    with collect_reports() as reports:
        for rows in (8, 5, 8, 3):
            x = torch.randn(rows, 7)
            torch._dynamo.mark_dynamic(x, 0)  # one symbolic size: the rows
            assert _rel(f(x), torch.softmax(x * 2, -1)) < 1e-5
    stats = next(r.cudagraphs for r in reports if r.cudagraphs)
    assert stats["calls"] == 4 and stats["uncaptured"] == 2
    assert [k[0] for k in stats["uncaptured_sizes"]] == [5, 3]  # what a user would add to the sizes
    assert keys and all(8 in k for k in keys)


# -- a decode loop ---------------------------------------------------------------------------------
def _greedy(device: torch.device, make_fn, steps: int = 6) -> list[int]:
    """Greedy tokens of a tiny Llama over a static KV cache: the prompt prefilled eagerly, then
    ``steps`` decode steps through ``make_fn(model)`` (the compiled forward, or eager's)."""
    from tilewright.perf.decode_cases import PROMPT, build_model, forward_fn, rewind, static_cache

    model = build_model("llama", torch.float32, device)
    prompt = torch.randint(0, 1000, (1, PROMPT), generator=torch.Generator().manual_seed(0)).to(device)
    cache = static_cache(model, PROMPT + 16, torch.float32, device)
    fn = make_fn(forward_fn(model))
    tokens = []
    with torch.no_grad():
        tok = forward_fn(model)(prompt, torch.arange(PROMPT, device=device), cache)[:, -1:].argmax(-1)
        for i in range(steps):
            rewind(cache, PROMPT + i)
            # cloned: a replay's outputs are overwritten by the next replay
            tok = fn(tok, torch.tensor([PROMPT + i], device=device), cache)[:, -1:].argmax(-1).clone()
            tokens.append(int(tok))
    return tokens


@pytest.mark.slow
def test_a_decode_loop_asking_for_cuda_graphs_on_the_cpu_keeps_eager_tokens():
    pytest.importorskip("transformers")
    cpu = torch.device("cpu")
    ref = _greedy(cpu, lambda f: f)
    with collect_reports() as reports, pytest.warns(UserWarning, match="runs without CUDA graphs: CPU tensors"):
        got = _greedy(cpu, lambda f: torch.compile(f, backend="tilewright", mode="reduce-overhead"))
    assert got == ref
    assert reports and all(r.cudagraphs["status"] == "refused" for r in reports)


# -- on a GPU -------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_a_llama_decode_step_replays_under_cuda_graphs_with_eager_tokens():
    pytest.importorskip("transformers")
    cudagraphs.reset()
    dev = torch.device("cuda")
    ref = _greedy(dev, lambda f: f)
    quick = dict(max_candidates=2, bench_rep=3, bench_budget_ms=5.0, bench_input_sets=1)  # device_check's budget
    with collect_reports() as reports, warnings.catch_warnings(record=True) as caught, config.patch(**quick):
        warnings.simplefilter("always")
        got = _greedy(dev, lambda f: torch.compile(f, backend="tilewright", mode="reduce-overhead"))
    refusals = [str(w.message) for w in caught if "without CUDA graphs" in str(w.message)]
    assert got == ref, refusals
    on = [r.cudagraphs for r in reports if r.cudagraphs and r.cudagraphs["status"] == "on"]
    assert on, f"no graph ran under CUDA graphs: {refusals}"
    assert max(s["replays"] for s in on) >= 3, on
    assert all(s["recordings"] <= 3 for s in on), on  # not one recording per token
