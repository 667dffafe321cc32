"""Special values through every op of the IR and every emitter that runs on this machine.

The inputs of one dtype are every pair of its special values (infinities, NaN, signed zeros,
the smallest and largest subnormals, the smallest normal, the extremes; integers' extremes and
their neighbours, small values of both signs, for negative division and wraparound), laid out
as two flat tensors ``a`` and ``b`` (their cartesian product) and a boolean ``c``. One pointwise
kernel per (emitter, dtype and batch of ops) stores each op's value over all of them, so a whole
dtype costs a handful of builds, not one per value. The expected value is the op's meaning
(:data:`tilewright.ir.ops.OPS`) on the same inputs in float64 (integers in their own type),
rounded once to the stored dtype; each element is judged on its own (NaN by NaN, an infinity by
the same infinity, zeros by their sign, finite values within a few units in the last place), so
one wrong corner is not averaged away by the rest.

An emitter is one entry of :data:`EMITTERS`: a name, why it cannot run here (or None), the
dtypes it holds, the most outputs one kernel may have, and ``run(problem, tensors) -> outputs``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Callable

import sympy
import torch

from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.index import contiguous_strides, var
from tilewright.ir.kernel import Buffer, LoopKernel, Store
from tilewright.ir.ops import OPS
from tilewright.problem import LoopProblem

FLOAT_DTYPES = ("fp32", "bf16", "fp16")
INT_DTYPES = ("i64", "i32", "i16", "i8", "u8", "bool")
DTYPES = FLOAT_DTYPES + INT_DTYPES
X = (var("x", 0),)


# -- the values ----------------------------------------------------------------------------------
def specials(dtype: str) -> list[float | int | bool]:
    """The special values of ``dtype`` (floats: inf, -inf, NaN, ±0, the smallest and largest
    subnormals, the smallest normal, the extremes, and a few ordinary values beside them)."""
    if dtype == "bool":
        return [False, True]
    t = dtypes.TORCH[dtype]
    if dtypes.is_float(dtype):
        fi = torch.finfo(t)
        sub, tiny = fi.smallest_normal * fi.eps, fi.smallest_normal  # smallest subnormal (2^-p * tiny)
        # 1/eps + 1: the first odd integer whose + 0.5 rounds (a round() that is floor(x + 0.5)
        # gives the next even integer: fp32 8388609 -> 8388610)
        return [0.0, -0.0, float("inf"), float("-inf"), float("nan"), -float("nan"), sub, -sub, tiny - sub, tiny, -tiny,
                fi.max, fi.min, 1.0, -1.0, 0.5, -2.5, 3.0, 1.0 / fi.eps + 1.0]
    ii = torch.iinfo(t)
    if ii.min == 0:
        return [0, 1, 2, 7, ii.max - 1, ii.max]
    return [0, 1, -1, 2, -2, 7, -7, ii.max, ii.max - 1, ii.min, ii.min + 1]


def inputs(dtype: str) -> list[torch.Tensor]:
    """``a`` and ``b`` (every ordered pair of special values) in ``dtype``, and a boolean ``c``."""
    vals = specials(dtype)
    pairs = list(itertools.product(vals, vals))
    t = dtypes.TORCH[dtype]
    a = torch.tensor([p[0] for p in pairs], dtype=torch.float64 if dtypes.is_float(dtype) else None).to(t)
    b = torch.tensor([p[1] for p in pairs], dtype=torch.float64 if dtypes.is_float(dtype) else None).to(t)
    c = torch.arange(len(pairs)) % 3 == 1
    return [a, b, c]


# -- the cases: one IR value per (op, dtype) ----------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One op on one dtype: the IR value a kernel stores and its expected value."""

    name: str  # the op, or "cast_to_<dtype>"
    dtype: str  # of the operands
    value: E.Node
    out_dtype: str
    # (inputs, exact) -> (value, where defined): exact computes in float64 and rounds once;
    # not exact computes as eager does, in fp32 for narrow floats (less exact at some corners:
    # fp32 remainder(3.4e38, 0.5) is NaN); a kernel may match either
    expected: Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _compute(x: torch.Tensor) -> torch.Tensor:
    return x.double() if x.is_floating_point() else x


def _eager(x: torch.Tensor) -> torch.Tensor:
    """``x`` in the type eager computes it in (fp32 for narrow floats)."""
    return x.float() if x.dtype in (torch.bfloat16, torch.float16) else x


def _defined(name: str, dtype: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Where ``name`` has a meaning to compare with: integer division needs a divisor that is
    not 0 (torch raises) and, for 32/64-bit, not min // -1 (undefined in C, SIGFPE in torch)."""
    ok = torch.ones(a.shape, dtype=torch.bool)
    if name in ("floordiv", "truncdiv", "mod", "fmod") and not dtypes.is_float(dtype):
        ok &= b != 0
        if dtype in ("i32", "i64"):
            ok &= ~((a == torch.iinfo(a.dtype).min) & (b == -1))
    return ok


def _op_expected(name: str, dtype: str, out_dtype: str):
    info = OPS[name]

    def expected(xs: list[torch.Tensor], exact: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        a, b, c = xs
        ok = _defined(name, dtype, a, b)
        b_safe = torch.where(ok, b, torch.ones_like(b)) if not ok.all() else b
        a_safe = torch.where(ok, a, torch.ones_like(a)) if not ok.all() else a
        args = {1: (a_safe,), 2: (a_safe, b_safe), 3: (c, a_safe, b_safe)}[info.arity]
        out = info.torch(*[_compute(x) if exact else _eager(x) for x in args])
        return out.to(dtypes.TORCH[out_dtype]), ok
    return expected


def _cast_expected(src: str, dst: str):
    def expected(xs: list[torch.Tensor], exact: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        a = xs[0]
        ok = torch.ones(a.shape, dtype=torch.bool)
        if dtypes.is_float(src) and not dtypes.is_float(dst) and dst != "bool":
            # float -> int: only values the integer type holds (the rest is undefined in C)
            ii = torch.iinfo(dtypes.TORCH[dst])
            d = a.double()
            ok = torch.isfinite(d) & (d.trunc() >= ii.min) & (d.trunc() <= ii.max)
            a = torch.where(ok, a, torch.zeros_like(a))
        return a.to(dtypes.TORCH[dst]), ok
    return expected


def _guarded_divisor(name: str, dtype: str, a: E.Node, b: E.Node) -> E.Node:
    """``b``, or 1 where an integer division by it is undefined (0; min // -1 for 32/64 bits):
    those lanes would trap (SIGFPE) on a CPU, and :func:`_defined` leaves them out anyway."""
    if name not in ("floordiv", "truncdiv", "mod", "fmod") or dtypes.is_float(dtype):
        return b
    bad = E.op("eq", b, E.const(0, dtype))
    if dtype in ("i32", "i64"):
        lo = torch.iinfo(dtypes.TORCH[dtype]).min
        bad = E.op("logical_or", bad, E.op("logical_and", E.op("eq", a, E.const(lo, dtype)),
                                           E.op("eq", b, E.const(-1, dtype))))
    return E.where(bad, E.const(1, dtype), b)


def _applicable(name: str, dtype: str) -> bool:
    """Whether torch defines op ``name`` on ``dtype`` operands at all."""
    info = OPS[name]
    if info.domain == "float" and not dtypes.is_float(dtype):
        return False
    if info.domain == "int" and dtypes.is_float(dtype):
        return False
    if name.startswith("logical") and dtype != "bool":
        return False  # lowering hands logical ops booleans (it compares with 0 first)
    xs = [torch.ones(2, dtype=dtypes.TORCH[dtype])] * 2
    args = {1: xs[:1], 2: xs, 3: [xs[0] > 0, *xs]}[info.arity]
    try:
        info.torch(*args)
    except (RuntimeError, TypeError):  # torch refuses (sub or neg of booleans)
        return False
    return True


def cases(dtype: str) -> list[Case]:
    """Every op of :data:`OPS` that applies to ``dtype``, and every cast from it."""
    a, b, c = (E.load(f"in{k}", X, dt) for k, dt in enumerate((dtype, dtype, "bool")))
    cdt = dtypes.compute_type(dtype)
    a, b = E.cast(a, cdt), E.cast(b, cdt)  # narrow floats are computed in fp32, as lowering does
    out: list[Case] = []
    for name, info in OPS.items():
        if not _applicable(name, dtype):
            continue
        bb = _guarded_divisor(name, dtype, a, b)
        v = E.op(name, *{1: (a,), 2: (a, bb), 3: (c, a, b)}[info.arity])
        out_dtype = "bool" if v.dtype == "bool" else dtype
        out.append(Case(name, dtype, E.cast(v, out_dtype), out_dtype, _op_expected(name, dtype, out_dtype)))
    for dst in DTYPES:
        if dst != dtype:
            out.append(Case(f"cast_to_{dst}", dtype, E.cast(E.cast(a, dst, explicit=True), dst), dst,
                            _cast_expected(dtype, dst)))
    return out


# -- compositions: two and three float ops in one kernel ------------------------------------------
# libm, libmvec and SLEEF fast paths, and compilers' rewrites of calls of calls (g++ turns
# sin(atan(x)) into x / sqrt(x*x + 1) unless the calls are no builtins: +-1 for NaN), only show
# on compositions; each single op can be right while a pair is wrong
COMPOSED = ("exp", "expm1", "log", "log1p", "sqrt", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh",
            "tanh", "erf", "exp2", "log2", "sigmoid", "round", "abs", "neg", "reciprocal")
COMPOSED_PAIRS = ("sin", "cos", "tan", "atan", "asin", "acos", "sinh", "cosh", "tanh", "exp", "log", "sqrt",
                  "expm1", "log1p", "erf", "round")
COMPOSED_TRIPLES = 64


def composition_chains(seed: int = 0) -> list[tuple[str, ...]]:
    """Every ordered pair of :data:`COMPOSED_PAIRS` (the inner op first) and
    :data:`COMPOSED_TRIPLES` triples of :data:`COMPOSED` drawn with ``seed``."""
    import random

    rng = random.Random(seed)
    chains = [(f, g) for f in COMPOSED_PAIRS for g in COMPOSED_PAIRS]
    chains += [tuple(rng.choice(COMPOSED) for _ in range(3)) for _ in range(COMPOSED_TRIPLES)]
    return list(dict.fromkeys(chains))


def _chain_expected(chain: tuple[str, ...], dtype: str):
    def expected(xs: list[torch.Tensor], exact: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        v = _compute(xs[0]) if exact else _eager(xs[0])
        for name in chain:
            v = OPS[name].torch(v)
        return v.to(dtypes.TORCH[dtype]), torch.ones(v.shape, dtype=torch.bool)
    return expected


def composition_cases(dtype: str, seed: int = 0) -> list[Case]:
    """One case per chain of :func:`composition_chains`, named ``"sin(atan(x))"``, computed in
    the compute type (as a fused kernel computes it) and stored in ``dtype``."""
    a = E.cast(E.load("in0", X, dtype), dtypes.compute_type(dtype))
    out = []
    for chain in composition_chains(seed):
        v = a
        for name in chain:
            v = E.op(name, v)
        label = "x"
        for name in chain:
            label = f"{name}({label})"
        out.append(Case(label, dtype, E.cast(v, dtype), dtype, _chain_expected(chain, dtype)))
    return out


def composition_batches(dtype: str, max_outputs: int) -> list[list[Case]]:
    """:func:`composition_cases` packed into kernels of at most ``max_outputs`` in which no two
    chains start with the same op: a compiler rewrites f(g(x)) only where g(x) has no other use
    (g++'s sin(atan(x)) is one), so a shared inner value would hide the rewrite."""
    batches: list[tuple[set[str], list[Case]]] = []
    for case, chain in zip(composition_cases(dtype), composition_chains()):
        home = next((b for b in batches if chain[0] not in b[0] and len(b[1]) < max_outputs), None)
        if home is None:
            home = (set(), [])
            batches.append(home)
        home[0].add(chain[0])
        home[1].append(case)
    return [cases for _, cases in batches]


def composition_mismatches(case: Case, got: torch.Tensor, xs: list[torch.Tensor], rtol: float = 1e-3,
                           limit: int = 6) -> list[str]:
    """Where ``got`` is not the composition's value: NaN, the infinities and the sign of a zero
    exactly (as float64 or as eager computes it, op by op), finite values within ``rtol`` (a
    composition amplifies an ulp where an inner result sits on a steep part of the outer op)."""
    want, _ = case.expected(xs)
    eager, _ = case.expected(xs, exact=False)

    def same(w: torch.Tensor) -> torch.Tensor:
        g, w = got.double(), w.double()
        nan = torch.isnan(g) & torch.isnan(w)
        cls = (torch.isnan(g) == torch.isnan(w)) & (torch.isinf(g) == torch.isinf(w))
        cls &= ~torch.isinf(w) | (g == w)
        cls &= (w != 0) | ((g == 0) & (torch.signbit(g) == torch.signbit(w)))
        finite = torch.isfinite(w) & torch.isfinite(g)
        close = (g - w).abs() <= rtol * w.abs() + 1e-6
        return nan | (cls & (~finite | close))
    bad = ~(same(want) | same(eager))
    lines = {f"{case.name} at x={xs[0][i].item()!r}: {got[i].item()!r}, expected {want[i].item()!r}"
             f" (op by op: {eager[i].item()!r})": None for i in bad.nonzero().flatten().tolist()}
    out = list(lines)
    return out[:limit] + ([f"... {len(out)} cases in all"] if len(out) > limit else [])


def case_names(dtype: str) -> list[str]:
    return [c.name for c in cases(dtype)]


def problem(dtype: str, chosen: list[Case]) -> LoopProblem:
    """One pointwise kernel storing each case's value over all pairs of ``dtype``'s values."""
    n = sympy.Integer(len(specials(dtype)) ** 2)
    shape, strides = (n,), contiguous_strides((n,))
    ins = tuple(Buffer(f"in{k}", dt, shape, strides) for k, dt in enumerate((dtype, dtype, "bool")))
    outs = tuple(Buffer(f"out{k}", c.out_dtype, shape, strides) for k, c in enumerate(chosen))
    stores = tuple(Store(f"out{k}", X, c.value) for k, c in enumerate(chosen))
    return LoopProblem(LoopKernel(shape, (), ins, outs, stores), op=f"special values {dtype}")


# -- judging -------------------------------------------------------------------------------------
# units in the last place a finite float may be off: 2 (an fp32 result rounded again to bf16),
# 16 for math the languages approximate (OpenCL's bound for erf, pow and the like)
ULPS = 2
APPROXIMATE_ULPS = 16
APPROXIMATE = frozenset({"pow", "atan2", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "rsqrt",
                         "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "sigmoid",
                         "erf", "erfinv"})
# ops whose value is an integer of the compute type: exact (round(8388609.0) one ulp off is wrong)
EXACT = frozenset({"floor", "ceil", "trunc", "round"})


def _matches(got: torch.Tensor, want: torch.Tensor, ulps: int) -> torch.Tensor:
    """Per element: NaN for NaN, the same infinity, a zero of the same sign, or a finite value
    within ``ulps`` of the expected one (a subnormal's ulp near zero); integers exactly."""
    if not want.is_floating_point():
        return got == want
    fi = torch.finfo(want.dtype)
    g, w = got.double(), want.double()
    nan_ok = torch.isnan(g) & torch.isnan(w)
    close = (g - w).abs() <= fi.eps * ulps * w.abs() + fi.smallest_normal * fi.eps
    same_zero = (w != 0) | (torch.signbit(g) == torch.signbit(w))
    return nan_ok | ((g == w) & same_zero) | (torch.isfinite(w) & torch.isfinite(g) & close & same_zero)


def mismatches(case: Case, got: torch.Tensor, xs: list[torch.Tensor], limit: int = 6) -> list[str]:
    """The elements where ``got`` is not the case's expected value, described with their
    inputs (at most ``limit``); empty when all match."""
    want, ok = case.expected(xs)
    if got.dtype != want.dtype or got.shape != want.shape:
        return [f"dtype/shape {got.dtype}{tuple(got.shape)} != {want.dtype}{tuple(want.shape)}"]
    ulps = APPROXIMATE_ULPS if case.name in APPROXIMATE else 0 if case.name in EXACT else ULPS
    good = _matches(got, want, ulps) | _matches(got, case.expected(xs, exact=False)[0], ulps)
    arity = OPS[case.name].arity if case.name in OPS else 1
    lines: dict[str, None] = {}  # a unary op sees each value many times: say each once
    for i in (~good & ok).nonzero().flatten().tolist():
        operands = [xs[0][i].item(), xs[1][i].item()][:min(arity, 2)]
        if arity == 3:
            operands = [xs[2][i].item()] + [xs[0][i].item(), xs[1][i].item()]
        lines[f"{case.name}({', '.join(map(repr, operands))}) = {got[i].item()!r}, "
              f"expected {want[i].item()!r}"] = None
    out = list(lines)
    return out[:limit] + ([f"... {len(out)} cases in all"] if len(out) > limit else [])


# -- scans ---------------------------------------------------------------------------------------
# kind -> torch's meaning along dim 1
SCAN_KINDS = {
    "sum": lambda x: torch.cumsum(x, 1), "prod": lambda x: torch.cumprod(x, 1),
    "logsumexp": lambda x: torch.logcumsumexp(x, 1), "max": lambda x: torch.cummax(x, 1).values,
    "min": lambda x: torch.cummin(x, 1).values, "argmax": lambda x: torch.cummax(x, 1).indices,
    "argmin": lambda x: torch.cummin(x, 1).indices,
}


def _scan_out_dtype(kind: str, dtype: str) -> str:
    if kind.startswith("arg"):
        return "i64"
    if kind in ("sum", "prod") and not dtypes.is_float(dtype):
        return "i64"  # torch promotes integer and boolean cumsum/cumprod
    return dtype


def scan_rows(dtype: str, half: int) -> torch.Tensor:
    """Every ordered pair (a, b) of ``dtype``'s special values as a row: ``half`` copies of a,
    then ``half`` of b. Long rows (``half`` > 1) keep the values whose sums and products come out
    the same in any order (no extremes, subnormals or the smallest normal: 16 x max overflows in
    fp32 where eager's CPU cumsum sums in float64, and a parallel scan's inf x (sub x sub) is
    inf x 0 = NaN where a sequential one keeps inf; an association the pairs cannot show)."""
    vals = specials(dtype)
    if half > 1 and dtypes.is_float(dtype):
        vals = [v for v in vals if v != v or v == 0 or abs(v) == float("inf") or abs(v) in (1.0, 0.5, 2.5, 3.0)]
    elif half > 1 and dtype != "bool":
        ii = torch.iinfo(dtypes.TORCH[dtype])
        vals = [v for v in vals if abs(v) < 100 or v in (ii.max, ii.min)]
    pairs = list(itertools.product(vals, vals))
    rows = [[p[0]] * half + [p[1]] * half for p in pairs]
    return torch.tensor(rows, dtype=torch.float64 if dtypes.is_float(dtype) else None).to(dtypes.TORCH[dtype])


def scan_problem(dtype: str, kinds: list[str], half: int) -> tuple[LoopProblem, list[torch.Tensor]]:
    """One row kernel storing each scan ``kind`` of :func:`scan_rows`, and its input."""
    x = scan_rows(dtype, half)
    n, r = (sympy.Integer(s) for s in x.shape)
    x0, r0 = var("x", 0), var("r", 0)
    strides = contiguous_strides((n, r))
    v = E.cast(E.load("in0", (x0, r0), dtype), dtypes.compute_type(dtype))
    outs, stores = [], []
    for k, kind in enumerate(kinds):
        out = _scan_out_dtype(kind, dtype)
        val = E.scan(kind, E.cast(v, dtypes.compute_type(out)) if kind in ("sum", "prod") else v)
        outs.append(Buffer(f"out{k}", out, (n, r), strides))
        stores.append(Store(f"out{k}", (x0, r0), E.cast(val, out)))
    kernel = LoopKernel((n,), (r,), (Buffer("in0", dtype, (n, r), strides),), tuple(outs), tuple(stores))
    return LoopProblem(kernel, op=f"special scans {dtype}"), [x]


def scan_mismatches(kind: str, got: torch.Tensor, x: torch.Tensor, ulps: int, limit: int = 6) -> list[str]:
    """Rows where ``got`` is not torch's scan ``kind`` of ``x`` (in float64 rounded once, or as
    eager computes it), described with the row's two values."""
    out = dtypes.TORCH[_scan_out_dtype(kind, dtypes.name_of(x.dtype))]
    fn = SCAN_KINDS[kind]
    exact = fn(_compute(x) if not kind.startswith("arg") else x).to(out)
    eager = fn(_eager(x).to(out) if kind in ("sum", "prod") else _eager(x)).to(out)
    if got.dtype != exact.dtype or got.shape != exact.shape:
        return [f"cum{kind}: dtype/shape {got.dtype}{tuple(got.shape)} != {exact.dtype}{tuple(exact.shape)}"]
    good = (_matches(got, exact, ulps) | _matches(got, eager, ulps)).all(1)
    half = x.shape[1] // 2
    lines = [f"cum{kind}([{x[i, 0].item()!r}]*{half} + [{x[i, -1].item()!r}]*{half}) = {got[i].tolist()}, "
             f"expected {exact[i].tolist()}" for i in (~good).nonzero().flatten().tolist()]
    return lines[:limit] + ([f"... {len(lines)} rows in all"] if len(lines) > limit else [])
