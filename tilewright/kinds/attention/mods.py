"""The modifications of an attention problem as expression IR, and their meaning in torch.

A ``score_mod`` is an IR value over the score (the IR's ``acc`` node, fp32: ``scale * q·k``)
and the indices ``b, h, m, n`` (batch, query head, query position, key position; ``index``
nodes of dtype i32, as FlexAttention passes them), reading captured tensors ``c0, c1, ...`` by
loads whose index is an expression of those symbols or, indirectly, of loaded values (a
document id looked up at ``m``). A ``mask_mod`` is a boolean value over the same indices (it
never reads the score). FlexAttention's ``score_mod(score, b, h, m, n)`` and
``mask_mod(b, h, m, n)`` are exactly this; SDPA's masks are built here (:func:`causal`,
:func:`additive_mask`, :func:`boolean_mask`).

:func:`evaluate` gives an IR value's meaning on torch tensors (each op by its entry in
:data:`tilewright.ir.ops.OPS`): the float64 reference and the ATen fallback use it.
:func:`score_derivative` differentiates a score_mod with respect to the score (forward mode,
in IR), which the backward kernels need; a modification it cannot differentiate leaves the
backward on ATen.
"""

from __future__ import annotations

import json
import math
from typing import Any, Sequence

import sympy
import torch

from tilewright.ir import dtypes
from tilewright.ir import expr as E
from tilewright.ir.expr import indirect_symbol, load_indirect, load_mask
from tilewright.ir.index import code, var
from tilewright.ir.ops import OPS

B_VAR, H_VAR, M_VAR, N_VAR = var("b"), var("h"), var("m"), var("n")
INDEX_VARS = (B_VAR, H_VAR, M_VAR, N_VAR)
MAX_INDIRECT = 8
SYMBOLS: dict[str, sympy.Symbol] = {s.name: s for s in INDEX_VARS} | {
    f"ind{k}": indirect_symbol(k) for k in range(MAX_INDIRECT)}


class NotDifferentiable(ValueError):
    """A score_mod op whose derivative with respect to the score is not known here."""


# -- building ---------------------------------------------------------------------------------
def score() -> E.Node:
    """The score a score_mod modifies (fp32)."""
    return E.acc()


def index_var(name: str) -> E.Node:
    """``b``, ``h``, ``m`` or ``n`` as an i32 value."""
    return E.index(SYMBOLS[name], "i32")


def causal() -> E.Node:
    """Top-left causal: query m sees keys n <= m (SDPA's ``is_causal``)."""
    return E.op("ge", index_var("m"), index_var("n"))


def sliding_window(window: int) -> E.Node:
    """Causal, and at most ``window - 1`` keys back: ``0 <= m - n < window``."""
    d = E.op("sub", index_var("m"), index_var("n"))
    return E.op("logical_and", E.op("ge", d, E.const(0, "i32")), E.op("lt", d, E.const(window, "i32")))


def broadcast_index(shape: Sequence[int]) -> tuple[sympy.Expr, ...]:
    """The index of a tensor of ``shape`` (rank <= 4, dims 1 broadcast) at (b, h, m, n)."""
    lead = 4 - len(shape)
    if lead < 0:
        raise ValueError(f"a mask of rank {len(shape)} does not broadcast to (B, H, Sq, Skv)")
    return tuple(sympy.Integer(0) if s == 1 else INDEX_VARS[lead + d] for d, s in enumerate(shape))


def additive_mask(k: int, shape: Sequence[int], dtype: str) -> E.Node:
    """score + c{k}[b, h, m, n] (broadcast): SDPA's float ``attn_mask``."""
    return E.op("add", score(), E.cast(E.load(f"c{k}", broadcast_index(shape), dtype), "fp32"))


def boolean_mask(k: int, shape: Sequence[int]) -> E.Node:
    """c{k}[b, h, m, n] (broadcast): SDPA's boolean ``attn_mask`` (True = attend)."""
    return E.load(f"c{k}", broadcast_index(shape), "bool")


# -- serialisation ------------------------------------------------------------------------------
def dumps(value: E.Node | None) -> str:
    """The canonical JSON of a modification ("" for None)."""
    if value is None:
        return ""
    return json.dumps(E.to_json([value]), sort_keys=True, separators=(",", ":"))


def loads(text: str) -> E.Node | None:
    return E.from_json(json.loads(text), SYMBOLS)[0] if text else None


def reads_score(value: E.Node | None) -> bool:
    return value is not None and any(n.op == "acc" for n in E.toposort([value]))


def captures_read(value: E.Node | None) -> set[int]:
    """The capture numbers ``k`` of the ``c{k}`` a modification loads."""
    if value is None:
        return set()
    return {int(n.arg[0][1:]) for n in E.toposort([value]) if n.op == "load"}


def uses(value: E.Node | None) -> set[str]:
    """Which of b, h, m, n a modification reads (directly or in a load's index)."""
    if value is None:
        return set()
    return {s.name for s in E.free_index_symbols([value]) if s in INDEX_VARS}


def index_extents(sizes: dict[str, int], dynamic=()) -> dict:
    """The extents of ``b, h, m, n`` (``"b"`` -> B, ...) that prove an index in range (a name in
    ``dynamic`` varies, so proves nothing), for :func:`needs_check`."""
    return {SYMBOLS[k]: sympy.Integer(v) for k, v in sizes.items() if k not in dynamic}


def needs_check(n: E.Node, extents: dict, memo: dict | None = None) -> bool:
    """Whether ``checked`` node ``n`` (a gathered index and its bound) is not proven inside its
    bound over ``extents`` (:func:`index_extents`): a kernel checks it before it reads."""
    from tilewright.ir.bounds import proven_in_range

    return not proven_in_range(n.src[0], n.src[1].arg, extents, {} if memo is None else memo)


def unchecked_indices(value: E.Node | None, sizes: dict[str, int], dynamic=()) -> list[E.Node]:
    """The gathered indices of a modification (``checked`` nodes: a captured tensor read at a
    loaded position, ``bias[doc[m]]``) not proven inside their bounds, given the extents of
    ``b, h, m, n`` in ``sizes`` (``"b"`` -> B, ...; a name in ``dynamic`` varies, so proves
    nothing): what a kernel must check before it reads through them. Empty when
    ``config.index_checks`` is off."""
    from tilewright.ir.bounds import checks_enabled

    if value is None or not checks_enabled():
        return []
    extents = index_extents(sizes, dynamic)
    memo: dict = {}
    return [n for n in E.toposort([value]) if n.op == "checked" and needs_check(n, extents, memo)]


# -- meaning ------------------------------------------------------------------------------------
_TORCH = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "u8": torch.uint8,
          "bool": torch.bool}


def evaluate(value: E.Node, env: dict[str, Any], *, reference: bool) -> torch.Tensor:
    """A modification's value on tensors.

    Args:
        value: the IR value.
        env: ``"score"`` (a float tensor), ``"b"``, ``"h"``, ``"m"``, ``"n"`` (int64 tensors
            broadcastable to the score's shape, holding the indices), ``"c0"``, ... (the
            captured tensors).
        reference: floats in float64 (rounded only where the IR casts explicitly), else narrow
            floats in fp32, as the kernels compute.

    Returns a tensor broadcastable to the score's shape. Raises ValueError for an IR op with no
    meaning here (a reduction).
    """
    names: dict[E.Node, torch.Tensor] = {}
    device = env["m"].device

    def compute(dt: str) -> torch.dtype:
        if dtypes.is_float(dt):
            return torch.float64 if reference else _TORCH[dtypes.compute_type(dt)]
        return torch.int64 if dt != "bool" else torch.bool

    for n in E.toposort([value]):
        args = [names[s] for s in n.src]
        if n.op == "const":
            v = torch.tensor(n.arg, dtype=compute(n.dtype), device=device)
        elif n.op == "acc":
            v = env["score"].to(compute("fp32"))
        elif n.op == "index":
            v = _index_value(n.arg, env, {})
        elif n.op == "load":
            v = _load(n, names, env).to(compute(n.dtype))
        elif n.op == "cast":
            x = args[0]
            if n.arg and n.dtype in ("bf16", "fp16") and x.is_floating_point():
                x = x.to(_TORCH[n.dtype])  # an explicit cast rounds
            v = x.to(compute(n.dtype))
        elif n.op == "checked":  # a gathered index inside its bound, else eager's IndexError
            v = args[0]
            bad = (v < 0) | (v >= args[1])
            if len(args) > 2:
                bad = bad & args[2]
            if bool(bad.any()):
                raise IndexError(f"index {int(torch.broadcast_to(v, bad.shape)[bad][0])} is out of bounds "
                                 f"for a dimension of size {int(args[1])}")
        elif n.op in OPS:
            v = OPS[n.op].torch(*args)
        else:
            raise ValueError(f"a modification has no {n.op} values")
        names[n] = v
    return names[value]


def _index_value(e: sympy.Expr, env: dict[str, Any], extra: dict[sympy.Symbol, torch.Tensor]) -> Any:
    local = {s.name: env[s.name] for s in INDEX_VARS if s in e.free_symbols}
    local.update({s.name: t for s, t in extra.items()})
    return eval(code(e), {"__builtins__": {}, "max": max, "min": min}, local)  # noqa: S307 - our own index code


def _load(n: E.Node, names: dict, env: dict[str, Any]) -> torch.Tensor:
    name, idx, _ = n.arg
    t = env[name]
    extra = {indirect_symbol(k): names[v].to(torch.int64) for k, v in enumerate(load_indirect(n))}
    mask = load_mask(n)
    index = []
    for d, e in enumerate(idx):
        i = _index_value(e, env, extra)
        i = torch.as_tensor(i, device=t.device, dtype=torch.int64)
        if mask is not None:  # masked-off lanes may point anywhere: read a valid element there
            i = i.clamp(0, max(t.shape[d] - 1, 0))
        index.append(i)
    out = t[tuple(index)] if index else t
    if mask is not None:
        out = torch.where(names[mask], out, torch.zeros((), dtype=out.dtype, device=out.device))
    return out


# -- the derivative with respect to the score ----------------------------------------------------
def score_derivative(value: E.Node | None) -> E.Node | None:
    """d value / d score as fp32 IR (forward mode), or None when ``value`` is the score itself
    (a derivative of 1) or there is no score_mod.

    Raises:
        NotDifferentiable: an op that depends on the score with no rule here.
    """
    if value is None or value.op == "acc":
        return None
    d: dict[E.Node, E.Node | None] = {}  # None: zero
    one = E.const(1.0, "fp32")
    for n in E.toposort([value]):
        src = [d.get(s) for s in n.src]
        if n.op == "acc":
            d[n] = one
            continue
        if all(s is None for s in src):
            d[n] = None
            continue
        d[n] = _derive(n, src)
    out = d[value]
    return E.const(0.0, "fp32") if out is None else E.cast(out, "fp32")


def _zero_like(n: E.Node) -> E.Node:
    return E.const(0.0, dtypes.compute_type(n.dtype))


def _derive(n: E.Node, ds: list[E.Node | None]) -> E.Node:
    x = n.src
    dx = [s if s is not None else _zero_like(x[i]) for i, s in enumerate(ds)]
    op = n.op
    if op == "cast":
        if not dtypes.is_float(n.dtype):
            raise NotDifferentiable("a score cast to an integer")
        return E.cast(dx[0], dtypes.compute_type(n.dtype))
    if op == "add":
        return E.op("add", dx[0], dx[1])
    if op == "sub":
        return E.op("sub", dx[0], dx[1])
    if op == "neg":
        return E.op("neg", dx[0])
    if op == "mul":
        return E.op("add", E.op("mul", dx[0], x[1]), E.op("mul", x[0], dx[1]))
    if op == "truediv":
        return E.op("truediv", E.op("sub", E.op("mul", dx[0], x[1]), E.op("mul", x[0], dx[1])),
                    E.op("mul", x[1], x[1]))
    if op == "tanh":
        t = n
        return E.op("mul", dx[0], E.op("sub", E.const(1.0, n.dtype), E.op("mul", t, t)))
    if op == "exp":
        return E.op("mul", dx[0], n)
    if op == "exp2":
        return E.op("mul", dx[0], E.op("mul", n, E.const(math.log(2.0), n.dtype)))
    if op == "log":
        return E.op("truediv", dx[0], x[0])
    if op == "sigmoid":
        return E.op("mul", dx[0], E.op("mul", n, E.op("sub", E.const(1.0, n.dtype), n)))
    if op == "sqrt":
        return E.op("truediv", dx[0], E.op("mul", E.const(2.0, n.dtype), n))
    if op == "abs":
        return E.op("mul", dx[0], E.op("sign", x[0]))
    if op == "where":
        return E.op("where", x[0], dx[1], dx[2])
    if op in ("maximum", "minimum"):
        pick = E.op("ge" if op == "maximum" else "le", x[0], x[1])
        return E.op("where", pick, dx[0], dx[1])
    if op == "pow" and ds[1] is None:
        e = x[1]
        return E.op("mul", dx[0], E.op("mul", e, E.op("pow", x[0], E.op("sub", e, E.const(1.0, e.dtype)))))
    raise NotDifferentiable(f"the derivative of {op} with respect to the score")
