"""The fuzzer's op catalogue, derived from the lowering table (``RULES`` of
:mod:`tilewright.compiler.loops`), and how to draw arguments for each op from its schema.

Every overload the loop lowering has a rule for is either fuzzed or listed with the reason it is
not (:func:`catalogue` sorts them); ``test_fuzz.py`` fails when a new rule falls in neither, so
the fuzzer follows the table instead of a hand list that drifts. An op is fuzzed when its schema
is functional (no ``out=``, nothing written), returns tensors, and every argument has a drawing
rule below: generic by argument type and name (a ``dim`` is a dim of ``self``, a ``Scalar`` a
number with special values among them), with a few whole-op builders (:data:`BUILDERS`) for the
ops whose arguments must agree with shapes (view sizes, slices, pads, index tensors).

A builder or the generic drawer returns ``(args, kwargs)`` whose tensors are :class:`Ref` (a
value of the program) or a new input the program grows (:meth:`Builder.new_index`); whether the
call is valid is decided by running it eagerly (``fuzz_program``), not here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from hypothesis import strategies as st

aten, prims = torch.ops.aten, torch.ops.prims

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
DTYPES = FLOATS + (torch.int64, torch.int32, torch.bool)
# the family of an op is the rule module that lowers it; the weights are how often each is drawn
FAMILY_WEIGHTS = {"pointwise": 6, "reductions": 3, "views": 3, "scans": 2, "indexing": 2, "scatters": 2}


@dataclass(frozen=True)
class Ref:
    """A tensor value of the program, by name (``x0`` an input, ``v3`` a step's result)."""

    name: str


_TYPES = {"number": "Scalar", "List[int]": "int[]", "List[Tensor]": "Tensor[]", "List[Optional[Tensor]]": "Tensor?[]"}


def tname(a) -> str:
    """Argument ``a``'s type in schema spelling ("Scalar", "int[]?", "Tensor?", "ScalarType?")."""
    t = str(a.type)
    opt = t.startswith("Optional[")
    t = t[len("Optional["):-1] if opt else t
    t = _TYPES.get(t, t)
    if a.name in ("dtype", "output_dtype") and t == "int":
        t = "ScalarType"
    return t + ("?" if opt else "")


def _functional(op: torch._ops.OpOverload) -> str | None:
    """Why ``op`` cannot be called as a functional step (None when it can)."""
    s = op._schema
    if any(a.alias_info is not None and a.alias_info.is_write for a in s.arguments) or \
            any(a.is_out for a in s.arguments):
        return "writes an argument (an out= or in-place overload)"
    if not s.returns or not all(tname(r) in ("Tensor", "Tensor[]") for r in s.returns):
        return "returns no tensor (a Python-scalar overload)"
    if not any("Tensor" in tname(a) for a in s.arguments) and op not in FACTORIES:
        return "takes no tensor"
    return None


# factories take no tensor but make one: fuzzed as sources of values
FACTORIES = {aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
             aten.arange.default, aten.arange.start, aten.arange.start_step, prims.iota.default}
# rules the fuzzer leaves out on purpose, each with why (the rest are reasons found by _functional)
NOT_FUZZED = {
    aten.copy.default: "copy(self, src) is the functional form of copy_: covered by clone/_to_copy",
    aten.lift_fresh_copy.default: "appears only for tensor constants made inside a traced function",
    **{op: "a prims view appears only inside decompositions: torch.compile refuses it in user code"
          " (functionalization takes no aliasing non-ATen op)"
       for op in (prims.view_of.default, prims.squeeze.default, prims.broadcast_in_dim.default)},
    aten.histc.default: "ATen has no histc for integers and its float bins depend on min/max ties;"
                        " tests/test_scatters.py covers it",
}


def _own_op(op) -> str | None:
    """tilewright's own ops (the NVFP4/MX activation quantisers) have no eager twin the oracle
    can draw arguments for: tests/test_fused_quant.py and tests/test_fused_mx_quant.py check
    each against its unfused form, bit for bit."""
    return "tilewright's own op: tests/test_fused_quant.py / test_fused_mx_quant.py check it" if op.namespace == "tilewright" else None


def catalogue() -> tuple[dict[str, list[torch._ops.OpOverload]], dict[torch._ops.OpOverload, str]]:
    """(fuzzed overloads by family, every other rule's overload -> why it is not fuzzed)."""
    import tilewright.compiler.loops.rules  # noqa: F401 - registers every rule
    from tilewright.compiler.loops import RULES

    fuzzed: dict[str, list] = {f: [] for f in FAMILY_WEIGHTS}
    skipped: dict[Any, str] = {}
    for op, rule in RULES.items():
        family = rule.__module__.rsplit(".", 1)[-1]
        why = NOT_FUZZED.get(op) or _own_op(op) or _functional(op) or (None if family in fuzzed else f"family {family}")
        if why is None:
            why = next((f"argument {a.name}: {a.type}" for a in op._schema.arguments
                        if op not in BUILDERS and _generic_arg(a) is None), None)
        if why:
            skipped[op] = why
        else:
            fuzzed[family].append(op)
    return fuzzed, skipped


# -- scalars ------------------------------------------------------------------------------------
SCALARS = [2, -1, 3, 0.5, -1.5, 2.0, 1e-3, 100.0, 0.0, -0.0, math.inf, -math.inf, math.nan, True, 1e5]


def scalar(draw) -> Any:
    return draw(st.sampled_from(SCALARS))


# -- generic arguments by type and name ---------------------------------------------------------
KEEP_DEFAULT = {"sparse", "scale_grad_by_freq", "non_blocking", "implicit", "sparse_grad", "requires_grad",
                "layout", "device", "pin_memory", "memory_format", "output_dtype"}


def _generic_arg(a) -> str | None:
    """The drawing rule for schema argument ``a`` (None: none, so the op needs a builder)."""
    t, n = tname(a), a.name
    if n in KEEP_DEFAULT and a.has_default_value():
        return "default"
    if t in ("Tensor", "Tensor?", "Scalar", "Scalar?", "bool", "str", "str?", "ScalarType", "ScalarType?"):
        return t
    if t in ("int", "int?") and n in ("dim", "dim0", "dim1"):
        return "dim"
    if t.startswith("int[") and n in ("dim", "dims", "dimensions"):
        return "dims"
    if t in ("float", "float?") and n == "correction":
        return "correction"
    if t == "int" and n == "decimals":
        return "decimals"
    return None


def draw_dtype(draw, allow_none: bool = True) -> torch.dtype | None:
    return draw(st.sampled_from(([None] if allow_none else []) + list(DTYPES)))


def draw_generic(draw, b, op) -> tuple[list, dict]:
    """Arguments for ``op`` from its schema alone (see :func:`_generic_arg`)."""
    args: list = []
    kwargs: dict = {}
    first: Ref | None = None
    for a in op._schema.arguments:
        rule, n, t = _generic_arg(a), a.name, tname(a)
        if rule == "default":
            continue
        if rule in ("Tensor", "Tensor?"):
            if rule == "Tensor?" and draw(st.booleans()):
                v = None
            elif n in ("condition", "mask"):
                v = b.pick(draw, like=first, dtype=torch.bool)
            else:
                v = b.pick(draw, like=first)
            first = first or v
        elif rule in ("Scalar", "Scalar?"):
            if n == "correction":
                v = draw(st.sampled_from([None, 0, 1]))
            elif n == "ord":
                v = draw(st.sampled_from([2, 1, 3, math.inf, -math.inf, 0]))
            else:
                v = None if rule == "Scalar?" and draw(st.booleans()) else scalar(draw)
        elif rule == "bool":
            v = draw(st.booleans())
        elif rule in ("str", "str?"):
            v = draw(st.sampled_from({"approximate": ["none", "tanh"], "rounding_mode": [None, "trunc", "floor"],
                                      "reduce": ["sum", "prod", "mean", "amax", "amin"]}.get(n, [a.default_value])))
        elif rule in ("ScalarType", "ScalarType?"):
            v = draw_dtype(draw, allow_none=rule.endswith("?"))
        elif rule == "dim":
            nd = max(b.ndim(first), 1)
            v = None if t == "int?" and draw(st.booleans()) else draw(st.integers(-nd, nd - 1))
        elif rule == "dims":
            nd = b.ndim(first)
            # prims reduce over the dims named, at least one (eager's prims.amin(x, []) reduces all
            # of them where its meta reduces none: a torch inconsistency, not a finding)
            internal = op.namespace == "prims"
            dims = draw(st.lists(st.integers(0, max(nd - 1, 0)), unique=True, max_size=max(nd, 1),
                                 min_size=1 if internal else 0))
            v = None if t.endswith("?") and not internal and draw(st.integers(0, 3)) == 0 else dims
        elif rule == "correction":
            v = draw(st.sampled_from([0.0, 1.0]))
        elif rule == "decimals":
            v = draw(st.sampled_from([0, 1, 2, -1, 3]))
        else:
            raise AssertionError(f"{op}: {n}")
        if a.kwarg_only:
            kwargs[n] = v
        else:
            args.append(v)
    return args, kwargs


# -- builders for ops whose arguments must agree with shapes ------------------------------------
def _factorize(draw, numel: int) -> list[int]:
    """A random shape of ``numel`` elements (one -1 sometimes)."""
    dims, rest = [], numel
    for _ in range(draw(st.integers(0, 3))):
        divs = [d for d in range(1, rest + 1) if rest % d == 0] if rest else [0, 1]
        d = draw(st.sampled_from(divs))
        dims.append(d)
        rest = rest // d if d else rest
    dims.append(rest if numel else 0)
    if numel and draw(st.booleans()):
        dims[draw(st.integers(0, len(dims) - 1))] = -1
    return dims


def _reshape(draw, b, op):
    x = b.pick(draw)
    return [x, _factorize(draw, b.numel(x))], {}


def _expand(draw, b, op):
    x = b.pick(draw)
    shape = b.shape(x)
    new = [s if s != 1 else draw(st.sampled_from([1, 3, -1])) for s in shape]
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    return [x, lead + [s if draw(st.booleans()) else -1 for s in new]], {}


def _permute(draw, b, op):
    x = b.pick(draw)
    return [x, draw(st.permutations(range(b.ndim(x))))], {}


def _slice(draw, b, op):
    x = b.pick(draw, min_ndim=1)
    nd = b.ndim(x)
    d = draw(st.integers(-nd, nd - 1))
    size = b.shape(x)[d]
    start = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    end = draw(st.one_of(st.none(), st.integers(-size - 1, size + 1)))
    return [x, d, start, end, draw(st.integers(1, 3))], {}


def _select(draw, b, op):
    x = b.pick(draw, min_ndim=1, nonempty=True)
    nd = b.ndim(x)
    d = draw(st.integers(-nd, nd - 1))
    size = b.shape(x)[d]
    return [x, d, draw(st.integers(-size, size - 1))], {}


def _split(draw, b, op):
    x = b.pick(draw, min_ndim=1)
    nd = b.ndim(x)
    d = draw(st.integers(-nd, nd - 1))
    size = b.shape(x)[d]
    if op is aten.split.Tensor:
        return [x, draw(st.integers(1, max(size, 1))), d], {}
    cuts = sorted(draw(st.lists(st.integers(0, size), max_size=2)))
    return [x, [hi - lo for lo, hi in zip([0] + cuts, cuts + [size])], d], {}


def _cat(draw, b, op):
    x = b.pick(draw, min_ndim=0 if op is aten.stack.default else 1)
    nd = b.ndim(x) + (op is aten.stack.default)
    parts = [x] + [b.pick(draw, like=x, same_shape=True) for _ in range(draw(st.integers(0, 2)))]
    return [parts, draw(st.integers(-nd, nd - 1))], {}


def _pad(draw, b, op):
    x = b.pick(draw, min_ndim=1)
    n = draw(st.integers(1, b.ndim(x)))
    return [x, draw(st.lists(st.integers(-1, 2), min_size=2 * n, max_size=2 * n)), scalar(draw)], {}


def _slice_backward(draw, b, op):
    g = b.pick(draw, min_ndim=1, dtype_in=FLOATS)
    nd, shape = b.ndim(g), list(b.shape(g))
    d = draw(st.integers(0, nd - 1))
    step = draw(st.integers(1, 2))
    start = draw(st.integers(0, 2))
    full = list(shape)
    full[d] = start + max(shape[d] - 1, 0) * step + 1 + draw(st.integers(0, 2)) if shape[d] else start
    return [g, full, d, start, start + shape[d] * step, step], {}


def _select_backward(draw, b, op):
    g = b.pick(draw, dtype_in=FLOATS)
    nd, shape = b.ndim(g), list(b.shape(g))
    d = draw(st.integers(0, nd))
    size = draw(st.integers(1, 4))
    return [g, shape[:d] + [size] + shape[d:], d, draw(st.integers(-size, size - 1))], {}


def _embedding(draw, b, op):
    w = b.pick(draw, min_ndim=2, max_ndim=2, nonempty=True)
    idx = b.new_index(draw, b.shape(w)[0])
    return [w, idx], {}


def _index_select(draw, b, op):
    x = b.pick(draw, min_ndim=1, nonempty=True)
    nd = b.ndim(x)
    d = draw(st.integers(-nd, nd - 1))
    return [x, d, b.new_index(draw, b.shape(x)[d], shape=(draw(st.integers(0, 5)),))], {}


def _gather(draw, b, op):
    x = b.pick(draw, min_ndim=1, nonempty=True)
    shape = b.shape(x)
    d = draw(st.integers(0, len(shape) - 1))
    ishape = tuple(draw(st.integers(0 if k == d else 1, s + (k == d))) if s else 0 for k, s in enumerate(shape))
    return [x, d, b.new_index(draw, shape[d], shape=ishape)], {}


def _index(draw, b, op):
    x = b.pick(draw, min_ndim=1, nonempty=True)
    shape = b.shape(x)
    lead = draw(st.integers(0, len(shape) - 1))  # None for the dims before the indexed one
    ishape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    idx = b.new_index(draw, shape[lead], shape=ishape, negative=True)
    return [x, [None] * lead + [idx]], {}


def _scatter(draw, b, op):
    x = b.pick(draw, min_ndim=1, nonempty=True)
    shape = b.shape(x)
    d = draw(st.integers(0, len(shape) - 1))
    ishape = tuple(draw(st.integers(1, s)) for s in shape)
    unique = op in (aten.scatter.src, aten.scatter.value)
    idx = b.new_index(draw, shape[d], shape=ishape, unique_along=d if unique else None)
    args = [x, d, idx]
    if op in (aten.scatter.value, aten.scatter.value_reduce):
        args.append(scalar(draw))
    else:
        args.append(b.pick(draw, like=x, shape=ishape, dtype=b.dtype(x)))
    kwargs = {}
    if op in (aten.scatter.reduce, aten.scatter.value_reduce):
        kwargs["reduce"] = draw(st.sampled_from(["add", "multiply"]))
    if op is aten.scatter_reduce.two:
        args.append(draw(st.sampled_from(["sum", "prod", "mean", "amax", "amin"])))
        kwargs["include_self"] = draw(st.booleans())
    if op is aten.index_add.default:
        args = [x, d, b.new_index(draw, shape[d], shape=(draw(st.integers(1, 4)),))]
        src_shape = list(shape)
        src_shape[d] = b.numel(args[2])
        args.append(b.pick(draw, like=x, shape=tuple(src_shape), dtype=b.dtype(x)))
        kwargs = {"alpha": draw(st.sampled_from([1, 2, -1]))}
    return args, kwargs


def _index_put(draw, b, op):
    x = b.pick(draw, min_ndim=1, nonempty=True)
    shape = b.shape(x)
    accumulate = draw(st.booleans())
    n = draw(st.integers(1, shape[0]))
    idx = b.new_index(draw, shape[0], shape=(n,), negative=True, unique_along=None if accumulate else 0)
    vshape = draw(st.sampled_from([(n,) + tuple(shape[1:]), tuple(shape[1:]), ()]))
    return [x, [idx], b.pick(draw, like=x, shape=vshape, dtype=b.dtype(x)), accumulate], {}


def _embedding_backward(draw, b, op):
    num = draw(st.integers(1, 6))
    idx = b.new_index(draw, num, shape=(draw(st.integers(1, 5)),))
    g = b.pick(draw, shape=(b.numel(idx), draw(st.integers(1, 4))), dtype_in=FLOATS)
    return [g, idx, num, draw(st.sampled_from([-1, 0])), False], {}


def _broadcast_in_dim(draw, b, op):
    x = b.pick(draw)
    shape = list(b.shape(x))
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    return [x, lead + shape, list(range(len(lead), len(lead) + len(shape)))], {}


def _view_dtype(draw, b, op):
    x = b.pick(draw)
    same = [d for d in DTYPES if d.itemsize == b.dtype(x).itemsize]
    return [x, draw(st.sampled_from(same))], {}


def _factory(draw, b, op):
    size = draw(st.lists(st.integers(0, 5), max_size=3))
    dtype = draw_dtype(draw)
    kw = {"dtype": dtype} if dtype is not None else {}
    if op is aten.full.default:
        return [size, scalar(draw)], kw
    if op is aten.scalar_tensor.default:
        return [scalar(draw)], kw
    if op is aten.arange.default:
        return [draw(st.integers(0, 9))], kw
    if op in (aten.arange.start, aten.arange.start_step):
        lo = draw(st.sampled_from([-3, 0, 1, 0.5, -2.5]))
        args = [lo, lo + draw(st.integers(1, 9))]
        if op is aten.arange.start_step:
            args.append(draw(st.sampled_from([1, 2, 0.5, 3])))
        return args, kw
    if op is prims.iota.default:
        return [draw(st.integers(0, 9))], {"start": draw(st.integers(-3, 3)), "step": draw(st.integers(1, 3)),
                                            "dtype": draw(st.sampled_from([torch.int64, torch.int32])),
                                            "device": torch.device("cpu"), "requires_grad": False}
    return [size], kw


def _new_factory(draw, b, op):
    x = b.pick(draw)
    size = draw(st.lists(st.integers(0, 5), max_size=3))
    extra = [scalar(draw)] if op is aten.new_full.default else []
    dtype = draw_dtype(draw)
    return [x, size] + extra, ({"dtype": dtype} if dtype is not None else {})


BUILDERS: dict[Any, Callable] = {
    aten.view.default: _reshape, aten._unsafe_view.default: _reshape, aten.reshape.default: _reshape,
    aten.view.dtype: _view_dtype, aten.expand.default: _expand, aten.permute.default: _permute,
    aten.slice.Tensor: _slice, aten.select.int: _select, aten.split.Tensor: _split,
    aten.split_with_sizes.default: _split, aten.cat.default: _cat, aten.stack.default: _cat,
    aten.constant_pad_nd.default: _pad, aten.slice_backward.default: _slice_backward,
    aten.select_backward.default: _select_backward, aten.embedding.default: _embedding,
    aten.index_select.default: _index_select, aten.gather.default: _gather, aten.index.Tensor: _index,
    aten.scatter.value: _scatter, aten.scatter.src: _scatter, aten.scatter.reduce: _scatter,
    aten.scatter.value_reduce: _scatter, aten.scatter_add.default: _scatter, aten.scatter_reduce.two: _scatter,
    aten.index_add.default: _scatter, aten.index_put.default: _index_put, aten._unsafe_index_put.default: _index_put,
    aten.embedding_dense_backward.default: _embedding_backward, prims.broadcast_in_dim.default: _broadcast_in_dim,
    aten.new_full.default: _new_factory, aten.new_zeros.default: _new_factory, aten.new_ones.default: _new_factory,
    **{op: _factory for op in FACTORIES},
}


def draw_call(draw, b, op) -> tuple[list, dict]:
    """Arguments for one call of ``op`` in the program being built by ``b``."""
    builder = BUILDERS.get(op)
    return builder(draw, b, op) if builder else draw_generic(draw, b, op)
