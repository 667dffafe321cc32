"""The pointwise operations of the expression IR: each op's meaning, defined once.

An op's meaning is its ``torch`` function: the torch emitter (the float64 reference and the ATen
fallback of a fused kernel) calls it, and every other emitter must compute the same thing (a
test runs each emitter's rendering of every op against it). The dtype rule says what an op
returns given its operands, which lowering has already converted to one compute type (casts are
explicit nodes, never implied): ``same`` (the first operand's dtype), ``bool`` (comparisons,
predicates), ``where`` (the second operand's).

Float semantics follow torch, NaN included: ``maximum``/``minimum`` propagate NaN, ``mod`` is
Python's remainder (the result has the divisor's sign, ``torch.remainder``), ``fmod`` is C's,
``floordiv`` rounds towards negative infinity, ``round`` rounds half to even.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class OpInfo:
    """One pointwise op: name, operand count, result dtype rule, and its torch meaning."""

    name: str
    arity: int
    result: str  # "same" | "bool" | "where"
    torch: Callable[..., torch.Tensor]
    # the op only makes sense on these kinds of operands ("float", "int", "any")
    domain: str = "any"


def _div(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b)


def _floordiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="floor")


def _truncdiv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.div(a, b, rounding_mode="trunc")


_TABLE: list[OpInfo] = [
    # arithmetic
    OpInfo("add", 2, "same", torch.add),
    OpInfo("sub", 2, "same", torch.sub),
    OpInfo("mul", 2, "same", torch.mul),
    OpInfo("truediv", 2, "same", _div, "float"),
    OpInfo("floordiv", 2, "same", _floordiv),
    OpInfo("truncdiv", 2, "same", _truncdiv),
    OpInfo("mod", 2, "same", torch.remainder),
    OpInfo("fmod", 2, "same", torch.fmod),
    OpInfo("pow", 2, "same", torch.pow, "float"),
    OpInfo("maximum", 2, "same", torch.maximum),
    OpInfo("minimum", 2, "same", torch.minimum),
    OpInfo("atan2", 2, "same", torch.atan2, "float"),
    OpInfo("copysign", 2, "same", torch.copysign, "float"),
    OpInfo("neg", 1, "same", torch.neg),
    OpInfo("abs", 1, "same", torch.abs),
    OpInfo("reciprocal", 1, "same", torch.reciprocal, "float"),
    OpInfo("sign", 1, "same", torch.sign),
    # transcendental and rounding (float)
    OpInfo("exp", 1, "same", torch.exp, "float"),
    OpInfo("exp2", 1, "same", torch.exp2, "float"),
    OpInfo("expm1", 1, "same", torch.expm1, "float"),
    OpInfo("log", 1, "same", torch.log, "float"),
    OpInfo("log2", 1, "same", torch.log2, "float"),
    OpInfo("log10", 1, "same", torch.log10, "float"),
    OpInfo("log1p", 1, "same", torch.log1p, "float"),
    OpInfo("sqrt", 1, "same", torch.sqrt, "float"),
    OpInfo("rsqrt", 1, "same", torch.rsqrt, "float"),
    OpInfo("sin", 1, "same", torch.sin, "float"),
    OpInfo("cos", 1, "same", torch.cos, "float"),
    OpInfo("tan", 1, "same", torch.tan, "float"),
    OpInfo("asin", 1, "same", torch.asin, "float"),
    OpInfo("acos", 1, "same", torch.acos, "float"),
    OpInfo("atan", 1, "same", torch.atan, "float"),
    OpInfo("sinh", 1, "same", torch.sinh, "float"),
    OpInfo("cosh", 1, "same", torch.cosh, "float"),
    OpInfo("tanh", 1, "same", torch.tanh, "float"),
    OpInfo("sigmoid", 1, "same", torch.sigmoid, "float"),
    OpInfo("erf", 1, "same", torch.erf, "float"),
    OpInfo("erfinv", 1, "same", torch.erfinv, "float"),
    OpInfo("floor", 1, "same", torch.floor, "float"),
    OpInfo("ceil", 1, "same", torch.ceil, "float"),
    OpInfo("trunc", 1, "same", torch.trunc, "float"),
    OpInfo("round", 1, "same", torch.round, "float"),
    # predicates and comparisons
    OpInfo("isnan", 1, "bool", torch.isnan),
    OpInfo("isinf", 1, "bool", torch.isinf),
    OpInfo("eq", 2, "bool", torch.eq),
    OpInfo("ne", 2, "bool", torch.ne),
    OpInfo("lt", 2, "bool", torch.lt),
    OpInfo("le", 2, "bool", torch.le),
    OpInfo("gt", 2, "bool", torch.gt),
    OpInfo("ge", 2, "bool", torch.ge),
    # logical (bool operands) and bitwise (int or bool operands)
    OpInfo("logical_not", 1, "bool", torch.logical_not),
    OpInfo("logical_and", 2, "bool", torch.logical_and),
    OpInfo("logical_or", 2, "bool", torch.logical_or),
    OpInfo("logical_xor", 2, "bool", torch.logical_xor),
    OpInfo("bitwise_not", 1, "same", torch.bitwise_not, "int"),
    OpInfo("bitwise_and", 2, "same", torch.bitwise_and, "int"),
    OpInfo("bitwise_or", 2, "same", torch.bitwise_or, "int"),
    OpInfo("bitwise_xor", 2, "same", torch.bitwise_xor, "int"),
    # selection
    OpInfo("where", 3, "where", torch.where),
]

OPS: dict[str, OpInfo] = {op.name: op for op in _TABLE}

# reductions: kind -> (identity for masked lanes as a function of dtype, torch meaning on the
# trailing dims). argmax/argmin return the first index of the extreme (NaN counts as the
# largest, as torch's do); welford_mean/welford_m2 are the mean and the sum of squared
# deviations (Welford's online algorithm where a kernel loops; the exact two-pass form where
# the row fits), together the var_mean of a row.
REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "welford_mean", "welford_m2",
              "any", "all")

# scans: kind -> the inclusive prefix of the row (in the row-major order of the kernel's
# reduction variables) up to and including each element, as torch's cumulative ops compute it
# along one dim: sum (cumsum), prod (cumprod), logsumexp (logcumsumexp: max-shifted, -inf and
# +inf handled as torch's ``_log_add_exp_helper``), max/min (cummax/cummin values) and
# argmax/argmin (their indices: an element equal to the running extreme takes over, so ties go
# to the later index, and every NaN takes over, so the index is the latest NaN's, as torch's
# CPU ``cummax_cummin_helper``). Each is an associative combine of (earlier, later) partials.
SCANS = ("sum", "prod", "logsumexp", "max", "min", "argmax", "argmin")


def result_dtype(name: str, operand_dtypes: list[str]) -> str:
    """The dtype ``name`` returns for operands of ``operand_dtypes``.

    Raises:
        KeyError: an op that is not in the table.
        ValueError: the wrong number of operands.
    """
    info = OPS[name]
    if len(operand_dtypes) != info.arity:
        raise ValueError(f"op {name} takes {info.arity} operands, got {len(operand_dtypes)}")
    if info.result == "bool":
        return "bool"
    if info.result == "where":
        return operand_dtypes[1]
    return operand_dtypes[0]
