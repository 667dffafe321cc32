"""A user's bad input fails as eager's, once, and costs no kernel: an index out of range or an
integer division by zero raises eager's error (its type and words, also where eager's op was
decomposed) with no warning, no kernel or bucket moves to
ATen, and the next valid call runs the same generated kernel (new-user trial: one bad
embedding index used to move the kernel to ATen for good, with two warnings blaming it)."""

from __future__ import annotations

import warnings

import pytest
import torch

import tilewright
from tilewright.compiler.dispatch import KernelCall
from tilewright.compiler.report import collect_reports
from tilewright.runtime import cpp as cpp_runtime

NO_CXX = cpp_runtime.unavailable_reason()
W = torch.randn(10, 4, generator=torch.Generator().manual_seed(0))


def _embedding(i, w):
    return torch.embedding(w, i) * 2


def _floor_divide(a, b):
    return (a // b) * 3


def _scatter_add(x, i, s):
    return torch.zeros(4, 3).scatter_add(0, i, s) * 2 + x.sum()


def _cross_entropy(a, t):
    # eager raises nll_loss's own IndexError ("Target 10 is out of bounds."); the decomposed
    # graph's gather a RuntimeError in other words (new-user trial)
    return torch.nn.functional.cross_entropy(a, t) * 2


def _int(*v):
    return torch.tensor(v)


# fn, valid arguments, bad arguments, eager's exception
CASES = {
    "cross_entropy": (_cross_entropy, (torch.randn(3, 10), _int(1, 9, 3)), (torch.randn(3, 10), _int(1, 10, 3)),
                      IndexError),
    "embedding": (_embedding, (_int(1, 3, 9, 0), W), (_int(1, 3, 10, 0), W), IndexError),
    "floor_divide": (_floor_divide, (_int(7, -7, 3, 5, -9), _int(2, 3, 1, -3, 4)),
                     (_int(7, -7, 3, 5, -9), _int(2, 0, 1, -3, 4)), RuntimeError),
    "scatter_add": (_scatter_add, (torch.randn(3), _int(0, 3, 2, 1, 0, 3).view(2, 3), torch.randn(2, 3)),
                    (torch.randn(3), _int(0, 4, 2, 1, 0, 3).view(2, 3), torch.randn(2, 3)), RuntimeError),
}


def _counting_binds(monkeypatch):
    """Counts the calls of every kernel the pipeline compiled and bound (the generated ones)."""
    real_bind, calls = KernelCall.bind, []

    def bind(self, problem, launch):
        def counted(*args, **kwargs):
            calls.append(self.name)
            return launch(*args, **kwargs)
        return real_bind(self, problem, counted)
    monkeypatch.setattr(KernelCall, "bind", bind)
    return calls


def _check(fn, good, bad, exc, backend, monkeypatch):
    torch._dynamo.reset()
    calls = _counting_binds(monkeypatch)
    with tilewright.config.patch(force_backend=backend, strict=False, graph_race="off"), \
            collect_reports() as reports, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = torch.compile(fn, backend="tilewright", dynamic=False)
        ref = fn(*good)
        torch.testing.assert_close(compiled(*good), ref)
        first = len(calls)
        assert first, "no generated kernel ran"
        with pytest.raises(exc) as eager:
            fn(*bad)
        with pytest.raises(exc) as got:
            compiled(*bad)
        assert str(got.value) == str(eager.value)  # eager's own message
        before = len(calls)
        torch.testing.assert_close(compiled(*good), ref)
        assert len(calls) - before == first  # the same generated kernels, none moved to ATen
    assert not [c for c in caught if issubclass(c.category, RuntimeWarning)], [str(c.message) for c in caught]
    (report,) = reports
    assert report.fallback is None and not report.kernel_fallbacks, (report.fallback, report.kernel_fallbacks)
    # generated kernels ran (C++ has no kernel for the scatter fused with a reduction: ATen's)
    assert any(not k.winner.startswith("aten.") for k in report.kernels), [k.winner for k in report.kernels]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["triton", "cpp"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_input_raises_eagers_error_and_keeps_the_generated_kernel(backend, case, monkeypatch, fresh_cache):
    if backend == "cpp" and NO_CXX is not None:
        pytest.skip(NO_CXX)
    _check(*CASES[case], backend, monkeypatch)


@pytest.mark.slow
def test_a_kernel_failure_the_eager_ops_share_is_the_inputs(monkeypatch, fresh_cache):
    """A kernel with no check of its own that fails for a bad input (here: an injected crash
    on index 10) is not demoted when the kernel's eager ops raise for that input as well."""
    real_bind = KernelCall.bind

    def bind(self, problem, launch):
        def crashing(*args, **kwargs):
            if any(isinstance(a, torch.Tensor) and not a.is_floating_point() and (a == 10).any() for a in args):
                raise RuntimeError("injected crash")
            return launch(*args, **kwargs)
        return real_bind(self, problem, crashing)
    monkeypatch.setattr(KernelCall, "bind", bind)
    with tilewright.config.patch(index_checks=False):
        _check(*CASES["embedding"], "triton", monkeypatch)


@pytest.mark.parametrize("grad", [False, True])
def test_a_graph_on_aten_raises_eagers_error_for_a_bad_input(grad, monkeypatch):
    """A graph tilewright could not compile runs aot_autograd's graph on ATen, whose decomposed
    ops word a bad target otherwise than eager (a gather's RuntimeError): eager's IndexError
    comes out (a tester's case, simulated by a compile that fails)."""
    import tilewright.compiler.backend as backend

    def failing(*args, **kwargs):
        raise RuntimeError("simulated compile failure")

    monkeypatch.setattr(backend, "compile_graph", failing)
    a, bad = torch.randn(4, 10, requires_grad=grad), _int(1, 10, 3, 0)
    torch._dynamo.reset()
    compiled = torch.compile(_cross_entropy, backend="tilewright")
    with tilewright.config.patch(strict=False), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the compile failure's own warning
        torch.testing.assert_close(compiled(a, _int(1, 9, 3, 0)), _cross_entropy(a, _int(1, 9, 3, 0)))
        with pytest.raises(IndexError, match="Target 10 is out of bounds"):
            compiled(a, bad)
