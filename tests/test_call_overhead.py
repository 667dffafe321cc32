"""The Python work a compiled graph's GEMM call does per call (issue 29: the race-off graph's
per-call overhead). Counted as Python frames entered, not timed, so the checks are
deterministic: a static GEMM whose launcher broadcasts its epilogue inputs (ATen's, oneDNN's)
goes straight to the launcher's linear entry with the bias as it came, no shape arithmetic."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from conftest import rel_err
from tilewright.kinds.gemm.kind import GemmKind


def _launcher(broadcasts: bool, seen: list):
    def launch(a, b, *epilogue_inputs):
        seen.append(("launch", epilogue_inputs))
        out = a @ b
        for e in epilogue_inputs:
            out = out + e
        return torch.relu(out)

    def linear(a, w, *epilogue_inputs):
        seen.append(("linear", epilogue_inputs))  # no comprehension: its frame would count
        return torch.relu(torch.nn.functional.linear(a, w, *epilogue_inputs))

    launch.broadcasts = broadcasts
    launch.linear = linear
    return launch


def _call(launch, spaces=("gemm",), b_t=True):
    """What the GEMM invoker reads off a KernelCall, for a static problem."""
    problem = SimpleNamespace(store_acc=False, block_scaled=False, batched=False)
    call = SimpleNamespace(problem=problem, options={"spaces": spaces, "b_t": b_t}, _fast=launch,
                           rescued=[])

    def rescue(sizes, error):
        call.rescued.append((sizes, type(error).__name__))
        call._fast = _launcher(True, [])
        return call._fast

    call.rescue = rescue
    return call


def _frames(fn, *args, **kwargs) -> tuple[list[str], object]:
    names: list[str] = []

    def prof(frame, event, arg):
        if event == "call":
            names.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        out = fn(*args, **kwargs)
    finally:
        sys.setprofile(None)
    return names, out


def _shapes(seen: list) -> list:
    return [(entry, [tuple(e.shape) for e in inputs]) for entry, inputs in seen]


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    a, w, bias = (torch.randn(*s, generator=gen) for s in ((5, 7), (3, 7), (3,)))
    return a, w, bias, torch.relu(a.double() @ w.double().t() + bias.double())


def test_a_static_linear_with_a_bias_calls_the_launchers_linear_entry_and_nothing_else():
    seen: list = []
    invoke = GemmKind().invoker(_call(_launcher(True, seen)))
    a, w, bias, ref = _inputs()
    names, out = _frames(invoke, a, w, bias)
    # before: invoke -> run -> linear, plus the expand generator's frames (~2 us per call)
    assert names == ["invoke", "linear"]
    assert _shapes(seen) == [("linear", [(3,)])]  # the bias as it came, not expanded to (M, N)
    assert rel_err(out, ref) < 1e-5


def test_a_launcher_that_does_not_broadcast_still_gets_its_epilogue_inputs_expanded():
    seen: list = []
    invoke = GemmKind().invoker(_call(_launcher(False, seen)))
    a, w, bias, ref = _inputs(1)
    out = invoke(a, w, bias)
    assert _shapes(seen) == [("linear", [(5, 3)])]
    assert rel_err(out, ref) < 1e-5


def test_an_epilogue_input_in_the_views_shape_is_reshaped_to_the_gemms():
    seen: list = []
    invoke = GemmKind().invoker(_call(_launcher(True, seen), spaces=("view",)))
    a, w, bias, ref = _inputs(2)
    out = invoke(a, w, bias.view(1, 1, 3), view=[5, 1, 3])
    assert _shapes(seen) == [("linear", [(5, 3)])]
    assert out.shape == (5, 1, 3) and rel_err(out, ref.view(5, 1, 3)) < 1e-5


def test_a_failing_fast_call_is_rescued_and_rerun_with_its_bias():
    def broken(a, w, *epilogue_inputs):
        raise RuntimeError("kernel failed")

    launch = _launcher(True, [])
    launch.linear = broken
    call = _call(launch)
    a, w, bias, ref = _inputs(3)
    out = GemmKind().invoker(call)(a, w, bias)
    assert [error for _, error in call.rescued] == ["RuntimeError"]
    assert rel_err(out, ref) < 1e-5


@pytest.mark.parametrize("b_t", [False, True])
def test_a_launcher_without_a_linear_entry_gets_b(b_t):
    seen: list = []
    launch = _launcher(True, seen)
    del launch.linear
    invoke = GemmKind().invoker(_call(launch, b_t=b_t))
    a, w, bias, ref = _inputs(4)
    out = invoke(a, w if b_t else w.t(), bias)
    assert _shapes(seen) == [("launch", [(3,)])]
    assert rel_err(out, ref) < 1e-5


def test_a_graph_traced_for_dispatch_counting_costs_one_frame_while_counting_is_off():
    from tilewright.compiler.dispatches import traced

    def graph(args):
        return args[0] + 1

    names, out = _frames(traced(graph, 0), [torch.ones(2)])
    assert names == ["call", "graph"]
    assert torch.equal(out, torch.full((2,), 2.0))


def _aten_launcher(**problem):
    """ATen's GEMM launcher as the tuner builds it, for a static (8, 16, 12) fp32 problem."""
    from tilewright.autotune.candidates import Candidate
    from tilewright.compiler.kernel_factory import default_factory
    from tilewright.problem import GemmProblem
    from tilewright.runtime.targets import get_target
    from tilewright.templates import get_template

    p = GemmProblem(**({"M": 8, "N": 16, "K": 12, "dtype": "fp32", "layout_b": "col"} | problem))
    aten = get_template("aten.gemm")
    return p, default_factory.build(p, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))


@pytest.mark.parametrize("b_t", [False, True])
def test_a_plain_aten_gemm_is_called_with_no_launcher_frame(b_t):
    # a product with no epilogue in its operands' dtype: ATen's entries serve the call as they
    # are (~45 such GEMMs in the demo Llama's training step, a Python frame each)
    _, launch = _aten_launcher()
    assert launch.direct is torch.matmul and launch.linear is torch.nn.functional.linear
    call = _call(launch, spaces=(), b_t=b_t)
    gen = torch.Generator().manual_seed(5)
    a, w = torch.randn(8, 12, generator=gen), torch.randn(16, 12, generator=gen)
    names, out = _frames(GemmKind().invoker(call), a, w if b_t else w.t())
    assert names == ["invoke"]
    assert rel_err(out, a.double() @ w.double().t()) < 1e-5


def test_an_aten_gemm_with_an_epilogue_or_a_cast_keeps_its_launcher():
    from tilewright.problem import EpilogueOp

    for problem in ({"epilogue": (EpilogueOp("relu"),)}, {"dtype": "bf16", "out_dtype": "fp32"}):
        p, launch = _aten_launcher(**problem)
        assert not hasattr(launch, "direct"), problem
        call = _call(launch, spaces=(), b_t=True)
        gen = torch.Generator().manual_seed(6)
        dt = torch.bfloat16 if p.dtype == "bf16" else torch.float32
        a, w = torch.randn(8, 12, generator=gen).to(dt), torch.randn(16, 12, generator=gen).to(dt)
        out = GemmKind().invoker(call)(a, w)
        ref = a.double() @ w.double().t()
        ref = torch.relu(ref) if p.epilogue else ref
        assert out.dtype == torch.float32 and rel_err(out, ref) < 1e-2, problem


def test_wrapper_views_take_their_sizes_as_separate_arguments(tmp_path):
    # x.view(48, 128) parses in ~0.96 us where x.view([48, 128]) takes ~1.57 (permute, expand
    # alike); the sizes' forms that only a list spells (an empty one: a 0-d view) stay lists
    import tilewright

    def f(x, w, z, one):
        a = torch.mm(x.view(6, 4), w)  # GEMM operands: the views stay in the wrapper
        b = torch.bmm(x.permute(0, 2, 1), z)
        return a, b, one.view([]) + 1.0, x.view(-1, 8).sum(1)

    gen = torch.Generator().manual_seed(7)
    x, w, z, one = (torch.randn(*s, generator=gen) for s in ((2, 3, 4), (4, 5), (2, 3, 5), (1,)))
    torch._dynamo.reset()
    with tilewright.config.patch(debug_dir=str(tmp_path), graph_race="off"):
        out = torch.compile(f, backend="tilewright")(x, w, z, one)
    ref = f(x.double(), w.double(), z.double(), one.double())
    for o, r in zip(out, ref):
        assert o.shape == r.shape and rel_err(o, r) < 1e-6
    source = "\n".join(p.read_text() for p in tmp_path.rglob("wrapper.py"))
    assert ".view(" in source and ".view([" not in source.replace(".view([])", "") and ".permute([" not in source


def test_a_compiled_graphs_plain_gemms_call_aten_with_no_invoker_frame():
    # the wrapper binds torch.matmul / F.linear itself for a static ATen product with nothing
    # after it (KernelCall.entry); a GEMM with an epilogue keeps its invoker
    import tilewright

    def f(x, w, v):
        h = torch.nn.functional.linear(x, w)  # b_t: F.linear
        return h @ v, torch.relu(x @ v.t() + 1.0)

    gen = torch.Generator().manual_seed(8)
    x, w, v = (torch.randn(*s, generator=gen) for s in ((6, 5), (7, 5), (7, 5)))
    torch._dynamo.reset()
    with tilewright.config.patch(graph_race="off", force_backend="aten"):
        compiled = torch.compile(f, backend="tilewright")
        compiled(x, w, v)
        names, out = _frames(compiled, x, w, v)
    ref = f(x.double(), w.double(), v.double())
    assert all(rel_err(o, r) < 1e-6 for o, r in zip(out, ref))
    # three GEMMs, one invoker: the relu GEMM's (a forced backend keeps its epilogue fused)
    assert names.count("invoke") == 1
