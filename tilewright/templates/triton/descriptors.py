"""Tensor-descriptor accesses of loop kernels (``tl.make_tensor_descriptor``): which loads and
stores of a :class:`~tilewright.ir.kernel.LoopKernel` can move whole blocks through a
descriptor, and the code for them.

On gfx1250 a descriptor load lowers to the Tensor Data Mover (``tensor_load_to_lds``, a block
into LDS with no per-thread address math) and a descriptor store to ``tensor_store_from_lds``
(measured, triton 3.9); the Triton interpreter runs descriptors too, so the path is tested for
numbers on the CPU. An access qualifies when it walks its buffer as a dense block of the
kernel's iteration space:

* ``"x"`` (pointwise): the offset is the flat outer index itself (a contiguous buffer in the
  kernel's order): a 1-D descriptor ``[xnumel]``, block ``[XBLOCK]``;
* ``"xr"`` (reduction): rows of the flat outer index, ``row_stride`` apart, and a contiguous
  row of the flat reduction index: ``[xnumel, rnumel]`` with strides ``[row_stride, 1]``, block
  ``[XBLOCK, RBLOCK]``;
* ``"r"`` (reduction): the reduction index only (a weight row every program reads): ``[rnumel]``,
  block ``[RBLOCK]``, broadcast over the rows.

Gathers, masked loads (cat, pad), broadcasts other than ``"r"``, offsets with a constant part,
bool buffers and layouts that do not collapse stay pointer accesses. Whether a layout collapses
is decided on the traced strides at render time, and checked again on the real tensors by the
launcher (the ``conditions``: stride equalities, 16-byte aligned base and row stride, what the
hardware and the interpreter require), which runs the pointer body when they fail.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from tilewright.ir import dtypes
from tilewright.ir.expr import load_indirect, load_mask
from tilewright.ir.index import affine, code, offset, static_or_hint
from tilewright.ir.kernel import Buffer, LoopKernel

# bytes: TDM/TMA need 16-byte aligned bases and row strides and at least 16 bytes per block row
ALIGN = 16
# the smallest RBLOCK a descriptor reduction uses (16 elements are >= 16 bytes for every dtype):
# a persistent row of 4 values would otherwise make a 4-wide block no descriptor can move
MIN_DESC_RBLOCK = 16


@dataclass(frozen=True)
class Descriptor:
    """One descriptor the kernel makes: ``var`` over buffer ``buffer`` in access ``pattern``
    ("x", "xr", "r"); ``row_stride`` (pattern "xr") in the buffer's stride symbols
    (``in1_s1``); ``conditions``: expressions of the stride symbols that must be zero at run
    time for the flat view to be the buffer's layout."""

    var: str
    buffer: str
    pattern: str
    itemsize: int
    row_stride: sympy.Expr | None = None
    conditions: tuple[sympy.Expr, ...] = ()

    def block_bytes(self, xblock: int, rblock: int) -> int:
        elems = {"x": xblock, "xr": xblock * rblock, "r": rblock}[self.pattern]
        return elems * self.itemsize


@dataclass
class DescriptorPlan:
    """The descriptors of one kernel and the accesses that use them (loads and stores by the
    identity of their node and ``Store``)."""

    descriptors: list[Descriptor] = field(default_factory=list)
    loads: dict[int, Descriptor] = field(default_factory=dict)
    stores: dict[int, Descriptor] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.loads or self.stores)

    def lds_bytes(self, xblock: int, rblock: int) -> int:
        """An upper bound of the LDS the descriptor blocks take (every block its own buffer)."""
        return sum(d.block_bytes(xblock, rblock) for d in self.descriptors)

    # -- kernel code ------------------------------------------------------------------------------
    def setup_lines(self, names: dict[sympy.Symbol, str]) -> list[str]:
        """The ``tl.make_tensor_descriptor`` lines, first in the kernel body."""
        out = []
        for d in self.descriptors:
            if d.pattern == "x":
                args = "[xnumel], [1], [XBLOCK]"
            elif d.pattern == "r":
                args = "[rnumel], [1], [RBLOCK]"
            else:
                args = f"[xnumel, rnumel], [{code(d.row_stride, names)}, 1], [XBLOCK, RBLOCK]"
            out.append(f"{d.var} = tl.make_tensor_descriptor({d.buffer}, {args})")
        return out

    @staticmethod
    def load_code(d: Descriptor, persistent: bool) -> str:
        roff = "0" if persistent else "roffset"
        if d.pattern == "x":
            return f"{d.var}.load([xoffset])"
        if d.pattern == "r":
            return f"{d.var}.load([{roff}])[None, :]"
        return f"{d.var}.load([xoffset, {roff}])"

    @staticmethod
    def store_line(d: Descriptor, value: str, persistent: bool) -> str:
        if d.pattern == "x":
            return f"{d.var}.store([xoffset], tl.broadcast_to({value}, [XBLOCK]))"
        roff = "0" if persistent else "roffset"
        return f"{d.var}.store([xoffset, {roff}], tl.broadcast_to({value}, [XBLOCK, RBLOCK]))"

    # -- launcher code ----------------------------------------------------------------------------
    def launch_condition(self, kernel: LoopKernel) -> str:
        """A Python expression, over the launcher's tensors and sizes, that holds when every
        descriptor's flat view is its tensor's real layout and is 16-byte aligned."""
        names: dict[sympy.Symbol, str] = {s: s.name for s in kernel.size_symbols()}
        for b in kernel.inputs + kernel.outputs:
            for dim in range(len(b.shape)):
                names[_stride_symbol(b, dim)] = f"{b.name}.stride({dim})"
        parts: list[str] = []
        for d in self.descriptors:
            parts.append(f"{d.buffer}.data_ptr() % {ALIGN} == 0")
            parts += [f"{code(c, names)} == 0" for c in d.conditions]
            if d.row_stride is not None:
                parts.append(f"({code(d.row_stride, names)}) * {d.itemsize} % {ALIGN} == 0")
        return " and ".join(dict.fromkeys(parts)) or "True"


def _stride_symbol(b: Buffer, dim: int) -> sympy.Symbol:
    return sympy.Symbol(f"{b.name}_s{dim}")


def _chain(coeffs: list[sympy.Expr], ranges: list[int], unit: sympy.Expr) -> list[sympy.Expr]:
    """Conditions that the coefficients of variables of these ranges make ``unit`` times their
    row-major flat index."""
    out, inner = [], sympy.Integer(1)
    for c, n in reversed(list(zip(coeffs, ranges))):
        out.append(sympy.expand(c - unit * inner))
        inner = inner * n
    return out


def _without_floors(off: sympy.Expr, variables: set) -> tuple[sympy.Expr, list[sympy.Expr]]:
    """``off`` with its floor divisions of the variables taken out, and the conditions (on the
    strides) under which that is exact: a view that split a flat index into dims,
    ``floor(x/24)*s0 + Mod(x, 24)*s1``, is ``x*s1`` when ``s0 == 24*s1``. ``Mod(a, n)`` is
    rewritten ``a - n*floor(a/n)``; every floor term's coefficient must then vanish."""
    if not off.has(sympy.floor, sympy.Mod):
        return off, []
    off = sympy.expand(off.replace(sympy.Mod, lambda a, n: a - n * sympy.floor(a / n)))
    floors = sorted((f for f in off.atoms(sympy.floor) if f.free_symbols & variables), key=str)
    stand_in = {f: sympy.Symbol(f"_floor{i}") for i, f in enumerate(floors)}
    off = sympy.expand(off.xreplace(stand_in))
    conds = [sympy.expand(off.coeff(f)) for f in stand_in.values()]
    return sympy.expand(off.xreplace({f: 0 for f in stand_in.values()})), conds


def _access(kernel: LoopKernel, b: Buffer, index: tuple[sympy.Expr, ...], sizes: dict
            ) -> tuple[str, sympy.Expr | None, tuple[sympy.Expr, ...]] | None:
    """(pattern, row stride, conditions) of one access, or None when it is no dense block."""
    if b.dtype == "bool" or b.dtype not in dtypes.ITEMSIZE:
        return None
    strides = [_stride_symbol(b, d) for d in range(len(b.shape))]
    xs = [(v, n) for v, n in zip(kernel.x_vars, kernel.ranges) if n != 1]
    rs = [(v, n) for v, n in zip(kernel.r_vars, kernel.reduction_ranges) if n != 1]
    if any(not isinstance(n, (int, sympy.Integer)) for _, n in xs + rs):
        return None  # dynamic ranges: 64-bit indexing, no descriptors
    off, conds = _without_floors(offset(index, strides), set(kernel.x_vars) | set(kernel.r_vars))
    aff = affine(off, list(kernel.x_vars) + list(kernel.r_vars))
    if aff is None:
        return None
    coeffs, const = aff
    if const != 0:
        return None
    xc = [coeffs[v] for v, _ in xs]
    rc = [coeffs[v] for v, _ in rs]
    has_x, has_r = any(c != 0 for c in xc), any(c != 0 for c in rc)
    row_stride = None
    if kernel.kind == "pointwise":
        if not xs or not all(c != 0 for c in xc):
            return None
        pattern = "x"
        conds += _chain(xc, [int(n) for _, n in xs], sympy.Integer(1))
    else:
        if not rs or not all(c != 0 for c in rc):
            return None
        conds += _chain(rc, [int(n) for _, n in rs], sympy.Integer(1))
        if not has_x:
            pattern = "r"
        elif all(c != 0 for c in xc):
            pattern, row_stride = "xr", xc[-1]
            conds += _chain(xc, [int(n) for _, n in xs], row_stride)[1:]
        else:
            return None
    # decide on the traced layout: the real tensors are checked again at launch
    hints = {s: static_or_hint(st, sizes) for s, st in zip(strides, b.stride)}
    conds = tuple(c for c in conds if c != 0)
    if any(c.xreplace(hints) != 0 for c in conds):
        return None
    if row_stride is not None:
        rs_hint = int(row_stride.xreplace(hints))
        if rs_hint <= 0 or rs_hint * dtypes.ITEMSIZE[b.dtype] % ALIGN:
            return None
    return pattern, row_stride, conds


def plan_descriptors(kernel: LoopKernel, sizes: dict) -> DescriptorPlan:
    """Which loads and stores of ``kernel`` (at the size hints ``sizes``) go through
    descriptors; an empty plan when none can."""
    plan = DescriptorPlan()
    made: dict[tuple, Descriptor] = {}

    def descriptor(b: Buffer, found) -> Descriptor:
        pattern, row_stride, conds = found
        key = (b.name, pattern, row_stride)
        if key not in made:
            made[key] = Descriptor(f"{b.name}_desc{len(made)}", b.name, pattern,
                                   dtypes.ITEMSIZE[b.dtype], row_stride, conds)
            plan.descriptors.append(made[key])
        return made[key]

    for n in kernel.nodes():
        if n.op != "load" or load_mask(n) is not None or load_indirect(n):
            continue
        b = kernel.buffer(n.arg[0])
        found = _access(kernel, b, tuple(n.arg[1]), sizes)
        if found is not None:
            plan.loads[id(n)] = descriptor(b, found)
    for s in kernel.stores:
        if getattr(s, "mask", None) is not None:
            continue  # a combo kernel's share of the space: a masked pointer store
        b = kernel.buffer(s.buffer)
        found = _access(kernel, b, tuple(s.index), sizes)
        # a reduction's per-row results ([XBLOCK, 1]) stay pointer stores
        if found is not None and found[0] != "r" and (kernel.kind == "pointwise" or kernel.depends_on_r(s.value)):
            plan.stores[id(s)] = descriptor(b, found)
    return plan
