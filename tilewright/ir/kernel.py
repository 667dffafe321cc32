"""A loop kernel: one iteration space, the tensors it reads, and the values it stores.

``ranges`` are the outer (parallel) dims, with variables ``x0, x1, ...``; ``reduction_ranges``
the dims reduced inside the kernel, with variables ``r0, r1, ...`` (empty for a pointwise
kernel). Every store writes one value per point of the outer space (a value that no longer
depends on the ``r`` variables: a reduction's result, or something computed from one) or per
point of the whole space (a value that still varies along ``r``).

Buffers have canonical names (``in0``, ``in1``, ..., ``out0``, ...) and sizes use canonical
symbols (``z0``, ``z1``, ...), so the same computation in two places of a model (the RMSNorm of
every layer) is one kernel, tuned once. Loads carry logical indices; a buffer's strides are the
kernel's run-time arguments, so a kernel reads any layout it is handed correctly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

import sympy

from tilewright.ir import dtypes
from tilewright.ir.expr import Node, free_index_symbols, from_json, to_json, toposort
from tilewright.ir.index import product, static_or_hint, var, variables


@dataclass(frozen=True)
class Buffer:
    """A tensor a kernel reads or writes.

    ``shape`` and ``stride`` are sympy expressions of size symbols; for inputs ``stride`` is the
    layout traced (a hint: the kernel takes real strides at run time); for outputs it is the
    layout the kernel allocates. ``bounds`` = (lo, hi) for integer inputs used as indices:
    their values lie in [lo, hi) (what tuning draws random inputs from). ``init`` names the
    input an output starts as (a scatter's target: the kernel updates its elements in place;
    the launcher hands it that input's values, or the input itself where the caller passes it
    as the output).
    """

    name: str
    dtype: str
    shape: tuple[sympy.Expr, ...]
    stride: tuple[sympy.Expr, ...]
    # ints, or sympy expressions of size symbols where the dim indexed is dynamic (evaluated
    # at the sizes tuned, so a bucket's random indices fit the bucket's tables)
    bounds: tuple[Any, Any] | None = None
    init: str | None = None

    def to_json(self) -> dict[str, Any]:
        bounds = [int(b) if not getattr(b, "free_symbols", None) else str(b) for b in self.bounds] \
            if self.bounds else None
        return {"name": self.name, "dtype": self.dtype, "shape": [str(s) for s in self.shape],
                "stride": [str(s) for s in self.stride],
                "bounds": bounds} | ({"init": self.init} if self.init else {})

    @staticmethod
    def from_json(d: dict[str, Any], symbols: dict[str, sympy.Symbol]) -> "Buffer":
        bounds = tuple(sympy.sympify(b, locals=symbols) if isinstance(b, str) else b for b in d["bounds"]) \
            if d.get("bounds") else None
        return Buffer(d["name"], d["dtype"], tuple(sympy.sympify(s, locals=symbols) for s in d["shape"]),
                      tuple(sympy.sympify(s, locals=symbols) for s in d["stride"]), bounds, d.get("init"))

    def bounds_at(self, sizes: dict[sympy.Symbol, int]) -> tuple[int, int] | None:
        """``bounds`` as ints at ``sizes`` (the values of the size symbols)."""
        if not self.bounds:
            return None
        return tuple(int(b.xreplace(sizes)) if isinstance(b, sympy.Basic) else int(b)  # type: ignore[return-value]
                     for b in self.bounds)


@dataclass(frozen=True)
class Store:
    """``buffer[index] = value``; ``index`` is a logical index (one expression per dim) in the
    kernel's variables. With a ``mask`` (a boolean node), only where it is true: the part of a
    combo kernel's space that belongs to this store's sub-kernel.

    A *scatter* store's index also reads data: ``indirect`` are the values of the symbols
    ``ind0, ind1, ...`` in it (as a gather's load), and elements whose index is out of the
    buffer's range are not written. With ``accumulate`` ("add", "max", "min") it is an atomic
    update of the element (duplicates combine), not a write (duplicates: one of them wins)."""

    buffer: str
    index: tuple[sympy.Expr, ...]
    value: Node
    mask: Node | None = None
    indirect: tuple[Node, ...] = ()
    accumulate: str | None = None

    @property
    def is_scatter(self) -> bool:
        return bool(self.indirect) or self.accumulate is not None


def size_symbol(i: int) -> sympy.Symbol:
    """Canonical size symbol ``z{i}`` (positive integer)."""
    return sympy.Symbol(f"z{i}", integer=True, positive=True)


@dataclass(frozen=True)
class LoopKernel:
    """A pointwise or reduction kernel (see the module docstring)."""

    ranges: tuple[sympy.Expr, ...]
    reduction_ranges: tuple[sympy.Expr, ...]
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    stores: tuple[Store, ...]
    # a combo kernel's sub-kernels, each in its own space but under the combo's buffer and size
    # names: what an emitter that runs parts one after another (the torch one) renders
    parts: tuple["LoopKernel", ...] = ()

    @property
    def kind(self) -> str:
        return "reduction" if self.reduction_ranges else "pointwise"

    @property
    def x_vars(self) -> tuple[sympy.Symbol, ...]:
        return variables("x", len(self.ranges))

    @property
    def r_vars(self) -> tuple[sympy.Symbol, ...]:
        return variables("r", len(self.reduction_ranges))

    @property
    def xnumel(self) -> sympy.Expr:
        return product(self.ranges)

    @property
    def rnumel(self) -> sympy.Expr:
        return product(self.reduction_ranges)

    def buffer(self, name: str) -> Buffer:
        for b in self.inputs + self.outputs:
            if b.name == name:
                return b
        raise KeyError(name)

    def values(self) -> list[Node]:
        return [s.value for s in self.stores]

    def roots(self) -> list[Node]:
        """Every value, store mask and scatter index the kernel computes."""
        return self.values() + [s.mask for s in self.stores if s.mask is not None] + [
            v for s in self.stores for v in s.indirect]

    def scatters(self) -> list[Store]:
        return [s for s in self.stores if s.is_scatter]

    def nodes(self) -> list[Node]:
        return toposort(self.roots())

    def used_vars(self) -> set[sympy.Symbol]:
        """The loop variables some store index, load index or ``index`` node reads: the only
        ones an emitter must compute from the flat index."""
        used: set[sympy.Symbol] = set()
        for s in self.stores:
            for e in s.index:
                used |= sympy.sympify(e).free_symbols
        for node in self.nodes():
            if node.op == "load":
                for e in node.arg[1]:
                    used |= e.free_symbols
            elif node.op == "index":
                used |= node.arg.free_symbols
        return used

    def size_symbols(self) -> list[sympy.Symbol]:
        """Size symbols the kernel needs as arguments, in canonical order."""
        syms: set[sympy.Symbol] = set()
        for e in self.ranges + self.reduction_ranges:
            syms |= e.free_symbols
        for b in self.inputs + self.outputs:
            for e in b.shape + b.stride:
                syms |= e.free_symbols
        for s in self.stores:
            for e in s.index:
                syms |= e.free_symbols
        syms |= free_index_symbols(self.roots())
        return sorted((s for s in syms if s.name.startswith("z") and s.name[1:].isdigit()),
                      key=lambda s: int(s.name[1:]))

    def reductions(self) -> list[Node]:
        return [n for n in self.nodes() if n.is_reduce]

    def scans(self) -> list[Node]:
        return [n for n in self.nodes() if n.is_scan]

    def depends_on_r(self, node: Node) -> bool:
        """Whether ``node`` varies along the reduction variables (below its reductions)."""
        rv = set(self.r_vars)
        memo: dict[int, bool] = {}
        for n in toposort([node]):
            if n.op == "reduce":
                memo[id(n)] = False
            elif n.op == "scan":
                memo[id(n)] = True  # a prefix differs from element to element of the row
            elif n.op == "load":
                memo[id(n)] = any(i.free_symbols & rv for i in n.arg[1]) or any(memo[id(s)] for s in n.src)
            elif n.op == "index":
                memo[id(n)] = bool(n.arg.free_symbols & rv)
            else:
                memo[id(n)] = any(memo[id(s)] for s in n.src)
        return memo[id(node)]

    # -- identity -----------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {"ranges": [str(s) for s in self.ranges],
                "reduction_ranges": [str(s) for s in self.reduction_ranges],
                "inputs": [b.to_json() for b in self.inputs],
                "outputs": [b.to_json() for b in self.outputs],
                "stores": [_store_json(s) for s in self.stores],
                "values": to_json(self.roots())} | (
                    {"parts": [p.to_json() for p in self.parts]} if self.parts else {})

    @staticmethod
    def from_json(d: dict[str, Any]) -> "LoopKernel":
        symbols = _symbol_table(d)
        parse = lambda t: sympy.sympify(t, locals=symbols)  # noqa: E731
        roots = from_json(d["values"], symbols)
        rest = iter(roots[len(d["stores"]):])
        masks = [next(rest) if len(st) > 2 and st[2] is True else None for st in d["stores"]]
        stores = []
        for st, v, m in zip(d["stores"], roots, masks):
            extra = st[3] if len(st) > 3 else {}
            stores.append((st, v, m, extra))
        stores = tuple(Store(st[0], tuple(parse(i) for i in st[1]), v, m,
                             tuple(next(rest) for _ in range(extra.get("indirect", 0))), extra.get("accumulate"))
                       for st, v, m, extra in stores)
        return LoopKernel(tuple(parse(s) for s in d["ranges"]),
                          tuple(parse(s) for s in d["reduction_ranges"]),
                          tuple(Buffer.from_json(b, symbols) for b in d["inputs"]),
                          tuple(Buffer.from_json(b, symbols) for b in d["outputs"]), stores,
                          tuple(LoopKernel.from_json(p) for p in d.get("parts", ())))

    def describe(self) -> str:
        from tilewright.ir.expr import render

        head = f"{self.kind} over ({', '.join(map(str, self.ranges))})"
        if self.reduction_ranges:
            head += f" x reduce ({', '.join(map(str, self.reduction_ranges))})"
        lines = [head]
        lines += [f"  {b.name}: {b.dtype}[{', '.join(map(str, b.shape))}]" for b in self.inputs]
        lines += [f"  {s.buffer}[{', '.join(map(str, s.index))}] = {render(s.value, 8)}"
                  + (f"  where {render(s.mask, 4)}" if s.mask is not None else "") for s in self.stores]
        return "\n".join(lines)


def _store_json(s: Store) -> list[Any]:
    """[buffer, index] (+ True when masked; a scatter: + masked, {indirect count, accumulate})."""
    out: list[Any] = [s.buffer, [str(i) for i in s.index]]
    if s.mask is not None or s.is_scatter:
        out.append(s.mask is not None)
    if s.is_scatter:
        out.append({"indirect": len(s.indirect), "accumulate": s.accumulate})
    return out


def _symbol_table(d: dict[str, Any]) -> dict[str, sympy.Symbol]:
    table: dict[str, sympy.Symbol] = {}
    for i in range(64):
        table[f"z{i}"] = size_symbol(i)
    for p in ("x", "r", "i", "j"):
        for i in range(16):
            table[f"{p}{i}"] = var(p, i)
    for name in ("b", "m", "n"):
        table[name] = var(name)
    for i in range(16):
        table[f"ind{i}"] = sympy.Symbol(f"ind{i}", integer=True)
    return table


def numel(shape: Iterable[sympy.Expr], sizes: dict[sympy.Symbol, int]) -> int:
    return static_or_hint(product(tuple(shape)), sizes)


def buffer_bytes(b: Buffer, sizes: dict[sympy.Symbol, int]) -> int:
    """Bytes of the distinct elements of ``b`` (dims of stride 0 count once)."""
    dims = [s for s, st in zip(b.shape, b.stride) if st != 0]
    return numel(dims, sizes) * dtypes.ITEMSIZE[b.dtype]
