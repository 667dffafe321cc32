"""The torch emitter of the expression IR: a loop kernel as a few PyTorch operations.

One emitter serves twice. With ``reference=True`` the rendered function computes every float in
float64 (rounding only where the program itself casts or stores): the reference the autotuner
checks other kernels against. Without it, floats narrower than fp32 are computed in fp32, as
eager's own kernels do: the ATen fallback of a fused group, which is what runs on a CPU unless
Triton is forced.

Each body is rendered for one mode (``reference`` True or False), so the compute dtype of every
value is known when rendering: casts that change nothing (an fp32 load held in fp32, a bf16 →
fp32 cast of a value already held in fp32) are not emitted. Values that read no memory (iotas,
constants, masks and positions built from them, and the offsets of gathers through them) go to
a separate list, ``static``, which the module runs once per shape and keeps
(:mod:`tilewright.templates.aten.loops`).

The iteration space is a tensor shape, outer dims then reduction dims. A load whose index is
affine in the variables is an ``as_strided`` view of its buffer (no copy); any other load
(floor/remainder indices, masked loads of a ``cat``) gathers through computed offsets. The
meaning of each op is its entry in :data:`tilewright.ir.ops.OPS`.
"""

from __future__ import annotations

import sympy
import torch

from tilewright.ir import dtypes
from tilewright.ir.bounds import check_needed, checks_enabled, guard_divisions, unchecked_dims, var_ranges
from tilewright.ir.expr import Node, indirect_symbol, load_indirect, load_mask, toposort
from tilewright.ir.index import affine, code
from tilewright.ir.kernel import LoopKernel, Store

# the torch dtype values of each IR dtype are held in: kernels (narrow floats in fp32, as eager's
# own kernels compute them) and the float64 reference
NATIVE = {"fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float32,
          "bf16": torch.float32, "fp8e4m3": torch.float32, "fp8e5m2": torch.float32,
          "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
          "u8": torch.uint8, "bool": torch.bool}
REFERENCE = {**NATIVE, "fp32": torch.float64, "fp16": torch.float64, "bf16": torch.float64,
             "fp8e4m3": torch.float64, "fp8e5m2": torch.float64}


_INT_DIVISIONS = frozenset({"floordiv", "truncdiv", "mod", "fmod"})


def _tuple(items: list[str]) -> str:
    """A Python tuple literal (a 0-d kernel's is ``()``)."""
    return f"({', '.join(items)},)" if items else "()"


class TorchExpr:
    """Renders a loop kernel's stores as Python statements on torch tensors.

    The statements expect, in scope: each buffer by name, ``device``, ``C`` (dtype name -> the
    torch dtype values of that dtype are computed in: ``REFERENCE`` with ``reference``, else
    ``NATIVE``), ``T`` (op name -> torch function), and the size symbols by name. Statements
    for values that read no memory go to ``static`` (a list shared by the parts of a combo
    kernel; the names they bind are in scope of the others).
    """

    def __init__(self, kernel: LoopKernel, prefix: str = "", reference: bool = False,
                 static: list[str] | None = None):
        self.prefix = prefix  # for the temporaries of one part of a combo kernel
        # the candidate divides by 1 only where a quotient is not used (so torch raises eager's
        # ZeroDivisionError for a real zero divisor); the reference never raises (below)
        self.k = kernel if reference else guard_divisions(kernel)
        self.reference = reference
        self.compute = REFERENCE if reference else NATIVE  # dtype name -> torch dtype held in
        self.lines: list[str] = []
        self.static: list[str] = static if static is not None else []
        self._static_memo: dict[Node, bool] = {}
        self.names: dict[Node, str] = {}  # by node: holding it keeps it alive, so no id is reused
        self.count = 0
        self.nx, self.nr = len(kernel.ranges), len(kernel.reduction_ranges)
        self.vars = list(kernel.x_vars) + list(kernel.r_vars)
        self.sizes = {s: s.name for s in kernel.size_symbols()}
        self.full = [code(s, self.sizes) for s in list(kernel.ranges) + list(kernel.reduction_ranges)]
        self.full_sym = [sympy.sympify(s) for s in list(kernel.ranges) + list(kernel.reduction_ranges)]
        self.iota_used: set[int] = set()

    def fresh(self) -> str:
        self.count += 1
        return f"{self.prefix}t{self.count}"

    def line(self, text: str, static: bool = False) -> None:
        (self.static if static else self.lines).append(text)

    def is_static(self, n: Node) -> bool:
        """Whether ``n`` reads no memory (its value depends on the sizes only)."""
        memo = self._static_memo
        for m in toposort([n], stop=lambda m: m in memo):
            if m not in memo:
                memo[m] = m.op != "load" and m.op != "acc" and all(memo[s] for s in m.src)
        return memo[n]

    # -- index expressions ------------------------------------------------------------------------
    def iota(self, pos: int) -> str:
        """An int64 tensor holding variable ``pos`` along its dim (size 1 elsewhere)."""
        name = f"{self.prefix}v{pos}"
        if pos not in self.iota_used:
            shape = ", ".join("-1" if d == pos else "1" for d in range(len(self.full)))
            self.line(f"{name} = torch.arange({self.full[pos]}, device=device).view({shape}{',' if len(self.full) == 1 else ''})",
                      static=True)
            self.iota_used.add(pos)
        return name

    def index_tensor(self, e: sympy.Expr, extra: dict | None = None) -> str:
        """Code for an integer tensor (or int) of ``e``'s value over the iteration space."""
        names = dict(self.sizes) | (extra or {})
        for pos, v in enumerate(self.vars):
            if v in e.free_symbols:
                names[v] = self.iota(pos)
        return code(e, names)

    def view_of(self, buf: str, idx: tuple[sympy.Expr, ...]) -> tuple[str, str, str, list[int]] | None:
        """(size, stride, offset, flipped dims) code for an ``as_strided`` view reading ``buf``
        at ``idx``, to be flipped along the dims listed; None when ``idx`` is not affine in the
        variables or a variable's coefficients differ in sign. A variable that walks ``buf``
        backwards (``x.flip(0)``: index ``n - 1 - x``) is a view with the positive stride from
        its last element, flipped: ``as_strided`` refuses negative strides."""
        sizes, strides = ["1"] * len(self.full), ["0"] * len(self.full)
        signs: dict[int, set[bool]] = {}
        off = []
        terms: list[tuple[int, sympy.Expr, str]] = []
        for d, e in enumerate(idx):
            aff = affine(e, self.vars)
            if aff is None:
                return None
            coeffs, const = aff
            st = f"{buf}.stride({d})"
            if const != 0:
                off.append(f"({code(const, self.sizes)}) * {st}")
            for pos, v in enumerate(self.vars):
                c = sympy.sympify(coeffs[v])
                if c != 0:
                    if c.is_negative is None:  # a sign only the sizes decide
                        return None
                    signs.setdefault(pos, set()).add(bool(c.is_negative))
                    terms.append((pos, c, st))
        if any(len(s) > 1 for s in signs.values()):
            return None
        flips = sorted(pos for pos, s in signs.items() if True in s)
        for pos, c, st in terms:
            sizes[pos] = self.full[pos]
            if pos in flips:  # start at the variable's last value, walk forwards, flip after
                off.append(f"({code(c * (self.full_sym[pos] - 1), self.sizes)}) * {st}")
                c = -c
            term = f"({code(c, self.sizes)}) * {st}"
            strides[pos] = term if strides[pos] == "0" else f"{strides[pos]} + {term}"
        offset = " + ".join([f"{buf}.storage_offset()"] + off)
        return _tuple(sizes), _tuple(strides), offset, flips

    def flat_offsets(self, buf: str, idx: tuple[sympy.Expr, ...], extra: dict | None = None) -> str:
        terms = [f"({self.index_tensor(e, extra)}) * {buf}.stride({d})" for d, e in enumerate(idx)]
        return " + ".join(terms) if terms else "0"

    # -- values -----------------------------------------------------------------------------------
    def emit(self, root: Node) -> str:
        for n in toposort([root], stop=lambda n: n in self.names):
            if n not in self.names:
                if n.op == "checked":  # the value itself, once its bound is checked
                    self._check_bound(n)
                    self.names[n] = self.names[n.src[0]]
                    continue
                if n.op == "cast":
                    x = self.names[n.src[0]]
                    code = self._cast(x, n.src[0].dtype, n.dtype)
                    if code == x:  # a cast that changes nothing: the value keeps its name
                        self.names[n] = x
                        continue
                else:
                    code = self._code(n)
                name = self.fresh()
                self.line(f"{name} = {code}", static=self.is_static(n))
                self.names[n] = name
        return self.names[root]

    def _code(self, n: Node) -> str:
        a = [self.names[s] for s in n.src]
        if n.op == "const":
            value = n.arg if not isinstance(n.arg, float) or n.arg == n.arg and abs(n.arg) != float("inf") \
                else f"float('{n.arg}')"
            return f"torch.tensor({value}, dtype=C[{n.dtype!r}], device=device)"
        if n.op == "load":
            return self._load(n)
        if n.op == "index":
            return f"torch.as_tensor({self.index_tensor(n.arg)}, device=device).to(C[{n.dtype!r}])"
        if n.op == "cast":
            return self._cast(a[0], n.src[0].dtype, n.dtype)
        if n.op == "reduce":
            return self._reduce(n.arg, a[0])
        if n.op == "scan":
            return self._scan(n.arg, a[0])
        if n.op == "acc":
            raise ValueError("a loop kernel has no accumulator")
        if n.op in _INT_DIVISIONS and dtypes.is_int(n.dtype) and self.reference:
            # lanes a masked load skips read 0 (a combo kernel's other parts, a cat's other
            # inputs): torch raises on an integer 0 divisor where a kernel computes garbage that
            # nothing stores, so those lanes divide by 1 (a real x // 0 is undefined either way)
            a = [a[0], f"torch.where({a[1]} == 0, 1, {a[1]})"]
        return f"T[{n.op!r}]({', '.join(a)})"

    def _load(self, n: Node) -> str:
        name, idx, _ = n.arg
        # a buffer holds its dtype's torch type; converting is needed only to another
        conv = "" if self.compute[n.dtype] == dtypes.TORCH[n.dtype] else f".to(C[{n.dtype!r}])"
        mask_node, indirect = load_mask(n), load_indirect(n)
        mask = self.names[mask_node] if mask_node is not None else None
        view = None if mask is not None or indirect else self.view_of(name, idx)
        if view is not None:
            size, stride, off, flips = view
            flip = f".flip({tuple(flips)})" if flips else ""
            return f"{name}.as_strided({size}, {stride}, {off}){flip}{conv}"
        extra = {indirect_symbol(k): self.names[v] for k, v in enumerate(indirect)}
        if indirect and checks_enabled():
            self._check_gathered(n, extra, mask)
        # offsets through iotas only (and a mask of them) depend on the sizes and strides alone
        static = not indirect and (mask_node is None or self.is_static(mask_node))
        offs = self.fresh()
        self.line(f"{offs} = torch.as_tensor({self.flat_offsets(name, idx, extra)}, device=device)", static)
        flat = f"_flat({name})"
        if mask is None:
            return f"{flat}[{offs}]{conv}"
        self.line(f"{offs} = torch.where({mask}, {offs}, 0)", static)
        # the skipped lanes read 0 of the load's own type: a Python 0 would promote a boolean
        # load to int64 (then no longer a condition: a masked_fill whose mask comes from a cat)
        zero = "False" if n.dtype == "bool" else "0"
        return f"torch.where({mask}, {flat}[{offs}]{conv}, {zero})"

    def _check_bound(self, n: Node) -> None:
        """A ``checked`` index against its bound (a view's extent): IndexError, as eager's,
        where it is outside on a lane its mask keeps."""
        if not check_needed(n, var_ranges(self.k)):
            return
        value, bound = self.names[n.src[0]], self.names[n.src[1]]
        static = self.is_static(n)
        bad = self.fresh()
        self.line(f"{bad} = ({value} < 0) | ({value} >= {bound})", static)
        if len(n.src) > 2:
            self.line(f"{bad} = {bad} & {self.names[n.src[2]]}", static)
        self.line(f"if {bad}.any():", static)
        self.line(f"    raise IndexError(f'index {{int(torch.broadcast_to({value}, torch.broadcast_shapes({value}.shape, "
                  f"{bad}.shape))[{bad}][0])}} is out of bounds for a dimension of size {{int({bound})}}')", static)

    def _check_gathered(self, n: Node, extra: dict, mask: str | None) -> None:
        """A gather's data-dependent dim indices checked against their dims (IndexError, as
        eager's) where the load reads (``mask``), unless proven in range: a flat offset out of
        its dim would read another row, or wrap from the end, without an error."""
        name, idx, _ = n.arg
        buf = self.k.buffer(name)
        for d in unchecked_dims(self.k, n, idx, var_ranges(self.k)):
            e, size = idx[d], buf.shape[d]
            at, top = self.fresh(), code(size, self.sizes)
            self.line(f"{at} = torch.as_tensor({self.index_tensor(e, extra)}, device=device)")
            bad = f"(({at} < 0) | ({at} >= {top}))"
            if mask is not None:
                bad = f"({bad} & {mask})"
            self.line(f"if {bad}.any():")
            self.line(f"    raise IndexError(f'index {{int({at}.broadcast_to(torch.broadcast_shapes({at}.shape, {bad}.shape))[{bad}][0])}} "
                      f"is out of bounds for dimension {d} with size {{{top}}}')")

    def _cast(self, x: str, src: str, dst: str) -> str:
        """Code for the cast, or ``x`` itself when it changes nothing (the value is held in the
        target's compute type already and no rounding is due)."""
        held, want = self.compute[src], self.compute[dst]
        if dst == "bool":
            return x if src == "bool" else f"({x} != 0)"
        if dtypes.is_float(dst) and dtypes.is_float(src) and dst != "fp64":
            # round to the target's precision, then hold in its compute type
            if dtypes.TORCH[dst] == want:  # fp32 (native): rounding to it is holding in it
                return x if held == want else f"{x}.to(C[{dst!r}])"
            return f"{x}.to({dtypes.TORCH[dst]}).to(C[{dst!r}])"
        return x if held == want else f"{x}.to(C[{dst!r}])"

    def _reduce(self, kind: str, x: str) -> str:
        rd = tuple(range(self.nx, self.nx + self.nr))
        full = f"torch.broadcast_to({x}, torch.broadcast_shapes({x}.shape, ({', '.join(['1'] * self.nx + self.full[self.nx:])},)))"
        if kind == "sum":
            return f"{full}.sum(dim={rd}, keepdim=True)"
        if kind == "max":
            return f"{full}.amax(dim={rd}, keepdim=True)"
        if kind == "min":
            return f"{full}.amin(dim={rd}, keepdim=True)"
        if kind == "welford_mean":
            return f"{full}.mean(dim={rd}, keepdim=True)"
        if kind == "welford_m2":
            return f"{full}.var(dim={rd}, correction=0, keepdim=True) * ({' * '.join(self.full[self.nx:])})"
        if kind not in ("prod", "argmax", "argmin", "any", "all"):
            raise ValueError(f"unknown reduction {kind}")
        # these reduce one dim: flatten the reduction dims into one first, then give each its
        # kept size-1 dim back (the outer dims keep their sizes: a view(-1, -1, 1) cannot say so)
        if kind in ("argmax", "argmin"):  # torch's argmax refuses booleans: as 0/1 bytes
            full = f"({full}.to(torch.uint8) if {x}.dtype == torch.bool else {full})"
        r = f"{full}.flatten({self.nx}).{kind}(-1, keepdim=True)"
        return r if self.nr == 1 else f"{r}.unflatten(-1, {_tuple(['1'] * self.nr)})"

    def _scan(self, kind: str, x: str) -> str:
        """A prefix along the row: the reduction dims flattened into one (row-major), scanned,
        and given their sizes back."""
        full = f"torch.broadcast_to({x}, ({', '.join(self.full)},))"
        flat = f"{full}.flatten({self.nx})" if self.nr > 1 else full
        fn = {"sum": "torch.cumsum({}, -1)", "prod": "torch.cumprod({}, -1)",
              "logsumexp": "torch.logcumsumexp({}, -1)", "max": "torch.cummax({}, -1).values",
              "min": "torch.cummin({}, -1).values", "argmax": "torch.cummax({}, -1).indices",
              "argmin": "torch.cummin({}, -1).indices"}[kind].format(flat)
        return fn if self.nr == 1 else f"{fn}.unflatten(-1, ({', '.join(self.full[self.nx:])},))"

    def scatter(self, s: Store, value: str) -> None:
        """A store through data-dependent indices: every index checked against its dim first
        (IndexError, as eager's), then a write (``index_put_``: with duplicates one wins), an
        accumulation (``index_put_(accumulate=True)``) or an extreme (``scatter_reduce_``)."""
        buf = self.k.buffer(s.buffer)
        extra = {indirect_symbol(k): self.emit(v) for k, v in enumerate(s.indirect)}
        syms = set(extra)
        sel = self.emit(s.mask) if s.mask is not None else None
        for d, e in enumerate(s.index):
            if sympy.sympify(e).free_symbols & syms:
                at, size = self.fresh(), code(buf.shape[d], self.sizes)
                self.line(f"{at} = torch.as_tensor({self.index_tensor(e, extra)}, device=device)")
                live = f"[torch.broadcast_to({sel}, {at}.shape)]" if sel is not None else ""
                self.line(f"if (({at}{live} < 0) | ({at}{live} >= {size})).any():")
                self.line(f"    raise IndexError(f'index {{int({at}{live}[({at}{live} < 0) | ({at}{live} >= {size})][0])}} "
                          f"is out of bounds for dimension {d} with size {{{size}}}')")
        offs = self.fresh()
        self.line(f"{offs} = torch.as_tensor({self.flat_offsets(s.buffer, s.index, extra)}, device=device)")
        full = f"torch.broadcast_shapes({offs}.shape, torch.as_tensor({value}).shape"
        full += f", {sel}.shape)" if sel is not None else ")"
        vals, where = self.fresh(), self.fresh()
        self.line(f"{where} = {full}")
        self.line(f"{vals} = torch.broadcast_to({value}, {where}).to({s.buffer}.dtype)")
        self.line(f"{offs} = torch.broadcast_to({offs}, {where})")
        if sel is not None:
            keep = self.fresh()
            self.line(f"{keep} = torch.broadcast_to({sel}, {where})")
            self.line(f"{offs}, {vals} = {offs}[{keep}], {vals}[{keep}]")
        else:
            self.line(f"{offs}, {vals} = {offs}.flatten(), {vals}.flatten()")
        if s.accumulate is None:
            self.line(f"_flat({s.buffer}).index_put_(({offs},), {vals})")
        elif s.accumulate == "add":
            self.line(f"_flat({s.buffer}).index_put_(({offs},), {vals}, accumulate=True)")
        else:
            self.line(f"_flat({s.buffer}).scatter_reduce_(0, {offs}, {vals}, 'a{s.accumulate}')")

    def store(self, s: Store) -> None:
        value = self.emit(s.value)
        dtype = self.k.buffer(s.buffer).dtype
        if dtypes.is_float(dtype) and dtype != "fp64" and self.reference:
            # the reference holds floats in float64 but rounds once to the stored type, as every
            # kernel does (an fp32 result that overflows is inf, not a finite float64)
            rounded = self.fresh()
            self.line(f"{rounded} = {value}.to({dtypes.TORCH[dtype]})")
            value = rounded
        if s.is_scatter:
            self.scatter(s, value)
            return
        if s.mask is not None:  # a combo kernel's part: write only its share of the space
            mask = self.emit(s.mask)
            offs, sel = self.fresh(), self.fresh()
            self.line(f"{offs} = torch.as_tensor({self.flat_offsets(s.buffer, s.index)}, device=device)")
            self.line(f"{sel} = torch.broadcast_to({mask}, torch.broadcast_shapes({offs}.shape, {mask}.shape, {value}.shape))")
            self.line(f"_flat({s.buffer})[torch.broadcast_to({offs}, {sel}.shape)[{sel}]] = "
                      f"torch.broadcast_to({value}, {sel}.shape)[{sel}].to({s.buffer}.dtype)")
            return
        view = self.view_of(s.buffer, s.index)
        if view is not None:
            size, stride, off, flips = view
            if flips:  # a flip copies: the value is flipped onto the view instead
                dst = self.fresh()
                self.line(f"{dst} = {s.buffer}.as_strided({size}, {stride}, {off})")
                self.line(f"{dst}.copy_(torch.broadcast_to({value}, {dst}.shape).flip({tuple(flips)}))")
                return
            self.line(f"{s.buffer}.as_strided({size}, {stride}, {off}).copy_({value})")  # broadcasts
            return
        offs = self.fresh()
        self.line(f"{offs} = torch.as_tensor({self.flat_offsets(s.buffer, s.index)}, device=device)")
        self.line(f"_flat({s.buffer})[{offs}] = torch.broadcast_to({value}, {offs}.shape).to({s.buffer}.dtype)")

    def render(self) -> list[str]:
        for s in self.k.stores:
            self.store(s)
        return self.lines
