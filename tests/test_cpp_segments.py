"""A C++ pointwise row cut at a cat's or a pad's static boundaries (templates/cpp/segments.py):
each segment's loop has its masks folded, so g++ vectorises it where the one masked loop stayed
scalar (a conditional load beside a libmvec call: "control flow in loop"). Checked: the
results against float64 (ragged pieces, tasks straddling a boundary, a zero-size piece,
non-contiguous inputs at run time, NaN and infinities, bf16), the traced instance's loops
vectorised (g++'s ``-fopt-info``), the segment arithmetic itself, and the kernels that must
keep one loop. Also a reduction's ragged tail: a row shorter than the 16 lanes is vectorised too.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import sympy
import torch

from loop_check import BF16, F, randn
from test_cpp import MISSING, run_cpp
from test_loop_kernels import assert_matches_reference, loop_problems
from tilewright.autotune.kinds import LoopInputs
from tilewright.ir import expr as E
from tilewright.runtime.targets import get_target
from tilewright.templates import get_template
from tilewright.templates.cpp import runtime
from tilewright.templates.cpp.segments import fold, split_points

CPU = get_target("cpu")
needs_cxx = pytest.mark.skipif(MISSING is not None, reason=f"no C++ compiler: {MISSING}")
# BLOCK=256 cuts the 341-long rows into tasks [0, 256) and [256, 341): one straddles a boundary
PARAMS = ({"BLOCK": 4096}, {"BLOCK": 256})


def _special(*shape, dtype=torch.float32, seed=0):
    x = randn(*shape, dtype=dtype, seed=seed)
    flat = x.view(-1)
    flat[::7] = float("nan")
    flat[3::11] = float("inf")
    flat[5::13] = float("-inf")
    return x


CASES = {
    # (fn, inputs, the pieces' loops: how many simd loops must vectorise)
    "cat_sigmoid_ragged": (lambda a, b: torch.cat([a, b], 1).sigmoid(), lambda: [randn(3, 300), randn(3, 41, seed=1)]),
    "cat3_exp_special": (lambda a, b, c: torch.cat([a, b, c], 1).exp() * 2,
                         lambda: [_special(4, 19), _special(4, 2, seed=1), _special(4, 33, seed=2)]),
    "cat_silu_bf16": (lambda a, b: (F.silu(torch.cat([a, b], 1).float()) * 3).to(BF16),
                      lambda: [randn(5, 64, dtype=BF16), randn(5, 37, dtype=BF16, seed=1)]),
    "pad_exp": (lambda a: F.pad(a, (1, 2)).exp(), lambda: [randn(6, 37)]),
    "pad_crop_and_grow": (lambda a: F.pad(a, (-3, 5), value=0.5).tanh(), lambda: [randn(6, 37)]),
    "cat_pad_where": (lambda a, b: torch.where(F.pad(torch.cat([a, b], 1), (2, 0)) > 0, 1.0, -1.0).exp(),
                      lambda: [randn(5, 21), randn(5, 9, seed=1)]),
    "cat_zero_size_piece": (lambda a, b, c: torch.cat([a, b, c], 1).cos(),
                            lambda: [randn(3, 17), randn(3, 0, seed=1), randn(3, 20, seed=2)]),
}


@needs_cxx
@pytest.mark.parametrize("name", sorted(CASES))
def test_cat_and_pad_rows_match_float64(name):
    fn, make = CASES[name]
    args = make()
    problems = loop_problems(fn, *args)
    assert problems
    for problem in problems:
        for params in PARAMS:
            got, ref = run_cpp(problem, params)
            assert_matches_reference(problem, got, ref)
            if len(problems) == 1 and all(a.numel() for a in args):
                # the traced layout's instance on the case's own values (NaN, inf), then a
                # non-contiguous copy of each input: the general instance
                got, ref = run_cpp(problem, params, LoopInputs(list(args), []))
                assert_matches_reference(problem, got, ref)
                views = [torch.empty(a.shape[1], a.shape[0], dtype=a.dtype).t().copy_(a) for a in args]
                assert not any(v.is_contiguous() for v in views)
                got, ref = run_cpp(problem, params, LoopInputs(views, []))
                assert_matches_reference(problem, got, ref)


def _cpp_source(problem, params: dict | None = None) -> str:
    template = get_template(f"cpp.{problem.kind}")
    text = template.render(problem, template.space.complete(params or {}), CPU).source
    return re.search(r"SOURCE = r'''(.*?)'''", text, re.S).group(1)


def _vectorised_lines(source: str) -> list[int]:
    """The lines g++ reports a vectorised loop at (``-fopt-info-vec-optimized``)."""
    tc = runtime.toolchain()
    proc = subprocess.run([tc.cxx, *tc.flags, "-fopt-info-vec-optimized", "-x", "c++", "-c", "-o", "/dev/null", "-"],
                          input=source, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [int(m) for m in re.findall(r"<stdin>:(\d+):\d+: optimized: loop vectorized", proc.stderr)]


def _simd_loops(source: str) -> list[tuple[int, int]]:
    """The line ranges (1-based, inclusive) of the loops under ``#pragma omp simd``."""
    lines, out = source.splitlines(), []
    for i, line in enumerate(lines):
        if "#pragma omp simd" in line:
            depth, j = 0, i + 1
            while True:
                depth += lines[j].count("{") - lines[j].count("}")
                if depth == 0:
                    break
                j += 1
            out.append((i + 2, j + 1))
    return out


needs_gcc = pytest.mark.skipif(MISSING is None and "g++" not in runtime.toolchain().cxx, reason="-fopt-info is g++'s")


@needs_cxx
@needs_gcc
def test_a_cat_rows_loops_vectorise():
    # the Qwen3-MoE backward's shape: a bf16 cat of two halves, each with a sigmoid (expf)
    problems = loop_problems(lambda a, b: (F.silu(torch.cat([a, b], 1).float()) * 3).to(BF16),
                             randn(8, 64, dtype=BF16), randn(8, 64, dtype=BF16, seed=1))
    (problem,) = problems
    source = _cpp_source(problem)
    loops = _simd_loops(source)
    assert len(loops) == 2, "a loop per piece"
    body = "\n".join(source.splitlines()[loops[0][0]:loops[-1][1]])
    assert " ? " not in body, "the pieces' masks fold away"
    done = _vectorised_lines(source)
    for lo, hi in loops:
        assert any(lo <= ln <= hi for ln in done), f"the simd loop at lines {lo}-{hi} is not vectorised"


def test_split_points_of_cat_and_pad_comparisons():
    x = sympy.Symbol("x1", integer=True)
    i = E.index(x - 1)
    lt37, ge0, lt40 = E.op("lt", i, E.index(37)), E.op("ge", i, E.index(0)), E.op("lt", i, E.index(40))
    a = E.load("in0", [x - 1], "fp32", mask=E.op("logical_and", ge0, lt37))
    b = E.load("in1", [x - 38], "fp32", mask=E.op("logical_and", E.op("logical_not", lt37), lt40))
    root = E.where(E.op("logical_and", ge0, lt40), E.where(lt37, a, b), E.const(0.0, "fp32"))
    points, cmps = split_points([root], x, sympy.Integer(42))
    assert points == [1, 38, 41]
    assert fold([root], cmps, 0)[0] == E.const(0.0, "fp32")
    assert fold([root], cmps, 1)[0] == E.load("in0", [x - 1], "fp32")
    assert fold([root], cmps, 38)[0] == E.load("in1", [x - 38], "fp32")
    assert fold([root], cmps, 41)[0] == E.const(0.0, "fp32")
    # a point at or past a static extent cuts nothing; 2*x and x*x are not cut, nor other dims
    assert split_points([root], x, sympy.Integer(38))[0] == [1]
    y = sympy.Symbol("x0", integer=True)
    z = sympy.Symbol("z0", integer=True, positive=True)  # a dynamic size: no static point
    for e in (2 * x, x * x, x + y, sympy.Mod(x, 64), x - z):
        assert split_points([E.op("lt", E.index(e), E.index(37))], x, sympy.Integer(100))[0] == []


@needs_cxx
def test_kernels_without_row_boundaries_keep_one_loop():
    # a cat along the rows: its mask is a row's, not the loop's (one loop, masks hoisted)
    (problem,) = loop_problems(lambda a, b: torch.cat([a, b], 0).exp(), randn(3, 37), randn(2, 37, seed=1))
    assert len(_simd_loops(_cpp_source(problem))) == 1
    got, ref = run_cpp(problem, {"BLOCK": 4096})
    assert_matches_reference(problem, got, ref)


@needs_cxx
@needs_gcc
def test_a_row_shorter_than_the_lanes_vectorises():
    # rows of 12 (a softmax over 12 experts): the whole row is the ragged tail of the 16-lane
    # loop (rows of at most config.unroll_reductions are unrolled into pointwise kernels)
    x = _special(64, 12, dtype=BF16)
    x[3] = float("-inf")
    (problem,) = loop_problems(lambda a: a.float().softmax(-1).to(BF16), x)
    source = _cpp_source(problem, {"PERSISTENT": True})
    done = _vectorised_lines(source)
    tails = [i + 1 for i, line in enumerate(source.splitlines()) if "tw_l < rnumel - tw_rbase" in line]
    assert tails and all(any(t <= ln <= t + 12 for ln in done) for t in tails), "a tail loop stays scalar"
    for params in ({"PERSISTENT": True}, {"PERSISTENT": False}):
        got, ref = run_cpp(problem, params, LoopInputs([x], []))
        assert_matches_reference(problem, got, ref)
