"""One clear line for the user's mistakes (issue 9, item 10).

A bad ``TILEWRIGHT_*`` value in a compiled model, a dtype mismatch, an NVFP4 model called with
grad enabled: the user sees the error once, as the exception they would catch (not Dynamo's
``BackendCompilerFailed``), ending in one line that says what to do. The subprocess tests look at
what a fresh process prints, as a user would (``TILEWRIGHT_STRICT`` unset); the line budgets are
the traceback Python prints for the frames between the user's call and the raise, which
tilewright cannot remove, plus that line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import traceback
import warnings

import pytest
import torch
import torch.nn as nn

import tilewright
from tilewright.errors import ConfigError, InvalidInputError


def _run(code: str, tmp_path, **env: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter, as a user would run it (not strict, a private cache)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TILEWRIGHT_")}
    environ.update(TRITON_INTERPRET="1", TILEWRIGHT_CACHE_DIR=str(tmp_path / "cache"), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=environ,
                          capture_output=True, text=True, timeout=240)


def _lines(text: str) -> list[str]:
    return [ln for ln in text.splitlines() if ln.strip()]


def test_one_clear_line_for_a_bad_env_value_in_a_compiled_model(tmp_path):
    code = """
        import torch, tilewright
        from tilewright.errors import ConfigError
        m = torch.compile(torch.nn.Linear(4, 4), backend="tilewright")
        try:
            m(torch.randn(2, 4))
        except ConfigError as e:  # catchable as itself
            print("caught", type(e).__name__, isinstance(e, ValueError))
        m(torch.randn(2, 4))      # and what an uncaught one prints
    """
    out = _run(code, tmp_path, TILEWRIGHT_AUTOTUNE="maybe")
    err = _lines(out.stderr)
    assert out.returncode == 1 and "caught ConfigError True" in out.stdout, out.stdout + out.stderr
    assert err[-1] == ("tilewright.errors.ConfigError: TILEWRIGHT_AUTOTUNE='maybe' is not a valid bool; "
                       "unset it or set it to 1/0, true/false, yes/no or on/off"), out.stderr
    assert out.stderr.count("TILEWRIGHT_AUTOTUNE") == 1, out.stderr
    for noise in ("BackendCompilerFailed", "Set TORCHDYNAMO_VERBOSE", "reporting a bug", "_config.py"):
        assert noise not in out.stderr, out.stderr
    assert len(err) <= 20, f"{len(err)} lines (45 before):\n{out.stderr}"


def test_one_clear_line_for_a_bad_env_value_in_the_gemm_op(tmp_path):
    code = """
        import torch, tilewright
        from tilewright.kernels import gemm
        gemm(torch.randn(4, 8), torch.randn(8, 4))
    """
    out = _run(code, tmp_path, TILEWRIGHT_FORCE_BACKEND="cuda")
    err = _lines(out.stderr)
    assert err[-1].startswith("tilewright.errors.ConfigError: force_backend='cuda' is not one of "), out.stderr
    assert "TILEWRIGHT_FORCE_BACKEND" in err[-1] and out.stderr.count("force_backend='cuda'") == 1
    assert len(err) <= 10, f"{len(err)} lines (27 before):\n{out.stderr}"


def test_one_clear_line_for_a_dtype_mismatch_in_a_compiled_model(tmp_path):
    code = """
        import torch, tilewright
        torch.manual_seed(0)
        m = torch.nn.Linear(16, 8)
        x = torch.randn(4, 16, dtype=torch.bfloat16)
        try:
            m(x)
        except RuntimeError as e:
            print("eager:", type(e).__name__ + ":", e)
        c = torch.compile(m, backend="tilewright")
        c(x)
    """
    out = _run(code, tmp_path)
    eager = next(ln for ln in out.stdout.splitlines() if ln.startswith("eager:"))[len("eager: "):]
    err = _lines(out.stderr)
    assert err[-1] == eager, out.stderr  # the error eager raises ...
    message = eager.split(": ", 1)[1]
    assert out.stderr.count(message) == 1, out.stderr  # ... once: no warning, log or chained copy
    assert out.stderr.count("Traceback") == 1 and "During handling" not in out.stderr, out.stderr
    assert "Warning" not in out.stderr and "running it on ATen" not in out.stderr, out.stderr
    assert len(err) <= 45, f"{len(err)} lines (126 before):\n{out.stderr}"


def test_one_clear_line_for_a_dtype_mismatch_keeps_the_graph_compiled():
    """In-process: ATen's own error, raised as eager raises it, and the graph stays compiled
    (the mismatch is the input's fault, not a kernel's)."""
    from tilewright.compiler.report import collect_reports

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(16, 8), nn.ReLU())
    x = torch.randn(4, 16, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError) as eager:
        m(x)
    c = torch.compile(m, backend="tilewright")
    for strict in (False, True):
        with tilewright.config.patch(strict=strict), warnings.catch_warnings(record=True) as caught, \
                collect_reports() as reports:
            warnings.simplefilter("always")
            for _ in range(2):  # the second call goes to the same compiled graph, and says the same
                with pytest.raises(RuntimeError) as compiled, torch.no_grad():
                    c(x)
                assert str(compiled.value) == str(eager.value)
                assert compiled.value.__cause__ is None and compiled.value.__suppress_context__
        assert not [w for w in caught if "tilewright" in str(w.message)], [str(w.message) for w in caught]
        assert all(not r.fallback for r in reports)
    with torch.no_grad():  # a good input runs compiled, and right
        y = torch.randn(4, 16)
        assert torch.allclose(c(y), m(y), atol=1e-6)


def test_one_clear_line_for_a_dtype_mismatch_in_the_gemm_op():
    from tilewright.kernels import gemm

    a, b = torch.randn(8, 16, dtype=torch.float16), torch.randn(16, 8, dtype=torch.bfloat16)
    fix = "gemm: a is torch.float16 but b is torch.bfloat16; cast one of them, e.g. b.to(a.dtype)"
    with pytest.raises(InvalidInputError) as eager:
        gemm(a, b)
    with pytest.raises(InvalidInputError) as compiled:
        torch.compile(lambda a, b: gemm(a, b), backend="tilewright")(a, b)
    for e in (eager.value, compiled.value):
        assert str(e) == fix
        assert len(traceback.format_exception(e)) <= 12


def _nvfp4_model() -> nn.Module:
    from tilewright.quant.linear import quantize_linears

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8))
    assert quantize_linears(m, skip=("0",)) == 1  # the first Linear stays trainable
    return m


def test_one_clear_line_for_an_nvfp4_model_called_with_grad_enabled():
    from tilewright.quant.linear import INFERENCE_ONLY

    m = _nvfp4_model()
    x = torch.randn(4, 32)
    assert "\n" not in INFERENCE_ONLY and "torch.no_grad()" in INFERENCE_ONLY
    with pytest.raises(InvalidInputError, match="inference-only") as eager:
        m(x)  # grad mode on and the first Linear's weight requires grad: no backward possible
    with pytest.raises(InvalidInputError, match="inference-only") as compiled:
        torch.compile(m, backend="tilewright")(x)
    for e in (eager.value, compiled.value):
        assert str(e) == INFERENCE_ONLY and type(e) is InvalidInputError
        assert len(traceback.format_exception(e)) <= 15
    with torch.no_grad():  # the fix the line names works, eager and compiled
        ref = m(x)
        assert torch.allclose(torch.compile(m, backend="tilewright")(x), ref, rtol=1e-2, atol=1e-2)
    with torch.inference_mode():
        assert torch.allclose(m(x), ref)
    m.requires_grad_(False)  # grad mode on, but nothing needs a gradient: it runs
    assert torch.allclose(m(x), ref)


def test_one_clear_line_for_a_kernel_bug_still_falls_back_to_aten(tmp_path):
    """Not the user's mistake: a compiled graph that fails where ATen runs still gives the right
    answer on ATen, with one warning line (no traceback on stderr, no second copy in the log)."""
    code = """
        import torch, tilewright
        from tilewright.kinds.gemm import GemmKind
        broken, invoker = [], GemmKind.invoker
        def failing(self, call):  # the wrapper calls each GEMM through its kind's invoker
            inner = invoker(self, call)
            def invoke(*a, **k):
                if broken:
                    raise RuntimeError("injected kernel bug")
                return inner(*a, **k)
            return invoke
        GemmKind.invoker = failing
        m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))
        x = torch.randn(4, 16)
        with torch.no_grad():
            c = torch.compile(m, backend="tilewright")
            c(x)
            broken.append(True)
            print("same", torch.allclose(c(x), m(x), atol=1e-6), torch.allclose(c(x), m(x), atol=1e-6))
    """
    out = _run(code, tmp_path)
    assert out.returncode == 0 and "same True True" in out.stdout, out.stdout + out.stderr
    assert out.stderr.count("injected kernel bug") == 1 and "running it on ATen" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
