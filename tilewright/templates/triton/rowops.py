"""The Triton loop body's scans and scatters (mixed into ``loops._Body``): a row's prefix by
``tl.associative_scan`` (persistent rows) or a carry across RBLOCK steps (looped rows), and
stores through data-dependent indices, plain or atomic (``tl.atomic_add``/``max``/``min``)."""

from __future__ import annotations

import sympy

from tilewright.ir import dtypes
from tilewright.ir.bounds import proven_in_range, var_ranges
from tilewright.ir.expr import Node, indirect_symbol
from tilewright.ir.index import code, offset
from tilewright.runtime.targets import Target
from tilewright.templates.triton.emit import TL_DTYPE


def _extreme_of(kind: str, cdt: str) -> str:
    """The identity of cummax (cummin): the type's lowest (highest) value; False (True) for
    booleans."""
    v = dtypes.extreme(cdt, lowest=kind in ("max", "argmax"))  # uint8's 0/255, int8's -128/127 ...
    return f"float('{v}')" if isinstance(v, float) else str(int(v))


# scans: each combine is commutative as well as associative (a row's prefix is a scan, the
# carry of a looped row a tl.reduce, whose order Triton does not promise); cummax/cummin carry
# the position so that ties and NaN go to the later element, as torch's CPU kernel does
SCAN_HELPERS = '''
@triton.jit
def _sum_combine(a, b):
    return a + b


@triton.jit
def _prod_scan_combine(a, b):
    return a * b


@triton.jit
def _cummax_combine(a, ia, b, ib):
    # the latest NaN if there is one, else the largest value, the latest of equal ones (torch:
    # an element >= the running max, or any NaN, takes over)
    a_nan = a != a
    b_nan = b != b
    take_b = tl.where(a_nan | b_nan, b_nan & (~a_nan | (ib > ia)), (b > a) | ((b == a) & (ib > ia)))
    return tl.where(take_b, b, a), tl.where(take_b, ib, ia)


@triton.jit
def _cummin_combine(a, ia, b, ib):
    a_nan = a != a
    b_nan = b != b
    take_b = tl.where(a_nan | b_nan, b_nan & (~a_nan | (ib > ia)), (b < a) | ((b == a) & (ib > ia)))
    return tl.where(take_b, b, a), tl.where(take_b, ib, ia)


@triton.jit
def _logaddexp_combine(a, b):
    # log(exp(a) + exp(b)) shifted by the larger (torch's _log_add_exp_helper): NaN propagates,
    # two equal infinities stay themselves (inf - inf would be NaN)
    mx = tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)
    mn = tl.minimum(a, b, propagate_nan=tl.PropagateNan.ALL)
    return tl.where((mn != mx) | (tl.abs(mn) < float("inf")), mx + LOG1P(tl.exp(mn - mx)), a)
'''


# the atomics Triton has, by operation and element type (tl.atomic_add/max/min); the
# interpreter's are numpy's, which has no bf16 and whose fp16 Triton refuses there
_ATOMICS = {"add": {"fp32", "fp64", "fp16", "bf16", "i32", "i64"}, "max": {"fp32", "i32", "i64"},
            "min": {"fp32", "i32", "i64"}}


def atomic_refusal(accumulate: str | None, dtype: str, target: Target) -> str | None:
    """Why a scatter that combines by ``accumulate`` into a ``dtype`` buffer cannot be a Triton
    atomic on ``target``, or None."""
    if accumulate is None:
        return None
    if dtype not in _ATOMICS[accumulate]:
        return f"Triton has no atomic {accumulate} on {dtype}"
    if target.interpreted and dtype in ("fp16", "bf16"):
        return f"the Triton interpreter has no {dtype} atomics"
    if dtype == "bf16" and target.backend == "cuda" and target.arch in ("sm_80", "sm_89"):
        return f"bf16 atomic adds need sm_90 or later, not {target.arch}"
    return None



class RowOpsHooks:
    """Scan and scatter hooks of the Triton loop schedule (``self.e``, ``self.names``,
    ``self.on_r``, ``self.reduction`` come from :class:`~tilewright.templates.loop_schedule.LoopSchedule`)."""

    scan_helpers = False
    extremes: dict

    # -- scans: [XBLOCK, RBLOCK] blocks scanned along axis 1 ---------------------------------------
    def _scan_operand(self, n: Node, v: str) -> tuple[str, str | None]:
        """The row's values with masked lanes at the combine's identity, and for cummax/cummin
        their positions (masked lanes at -1, so they win no tie)."""
        self.scan_helpers = True
        kind, cdt = n.arg, dtypes.compute_type(n.src[0].dtype)
        fill = {"sum": "0", "prod": "1", "logsumexp": "float('-inf')"}.get(kind) or self._extreme(kind, cdt)
        vals = self.e.fresh()
        self.e.line(f"{vals} = tl.where(xmask & rmask, {v}, {fill})")
        if kind in ("sum", "prod", "logsumexp"):
            return vals, None
        idx = self.e.fresh()
        self.e.line(f"{idx} = tl.where(xmask & rmask, tl.broadcast_to(rindex, [XBLOCK, RBLOCK]).to(tl.int64), -1)")
        return vals, idx

    _extreme = staticmethod(_extreme_of)

    @staticmethod
    def _combine(kind: str) -> str:
        return {"sum": "_sum_combine", "prod": "_prod_scan_combine", "logsumexp": "_logaddexp_combine",
                "max": "_cummax_combine", "argmax": "_cummax_combine",
                "min": "_cummin_combine", "argmin": "_cummin_combine"}[kind]

    def scan_inline(self, n: Node, v: str) -> str:
        """Persistent rows: ``tl.associative_scan`` of the whole row block."""
        kind = n.arg
        family = ("max" if kind in ("max", "argmax") else "min" if kind in ("min", "argmin") else kind, id(n.src[0]))
        if family in self.extremes:  # cummax's values and indices: one scan
            vals, idx = self.extremes[family]
            return idx if kind.startswith("arg") else vals
        vals, idx = self._scan_operand(n, v)
        if idx is None:  # from the identity, as torch starts: its cumsum of -0 is 0 + -0 = +0
            (c,) = self.init_scan(n)
            return f"{self._combine(kind)}({c}, tl.associative_scan({vals}, 1, {self._combine(kind)}))"
        sv, si = self.e.fresh(), self.e.fresh()
        self.e.line(f"{sv}, {si} = tl.associative_scan(({vals}, {idx}), 1, {self._combine(kind)})")
        self.extremes[family] = (sv, si)
        return si if kind.startswith("arg") else sv

    def init_scan(self, n: Node) -> list[str]:
        kind, cdt = n.arg, dtypes.compute_type(n.src[0].dtype)
        tl_dt = TL_DTYPE[cdt]
        if kind in ("sum", "prod", "logsumexp"):
            c = self.e.fresh()
            init = {"sum": "0", "prod": "1", "logsumexp": "float('-inf')"}[kind]
            self.e.line(f"{c} = tl.full([XBLOCK, 1], {init}, {tl_dt})")
            return [c]
        cv, ci = self.e.fresh(), self.e.fresh()
        self.e.line(f"{cv} = tl.full([XBLOCK, 1], {self._extreme(kind, cdt)}, {tl_dt})")
        self.e.line(f"{ci} = tl.full([XBLOCK, 1], -1, tl.int64)")
        return [cv, ci]

    def scan_step(self, n: Node, v: str, carries: list[str]) -> str:
        """This step's prefix: its block's scan combined with the carry; then the carry
        combined with the block's total (a tl.reduce: every combine is commutative)."""
        kind = n.arg
        comb = self._combine(kind)
        vals, idx = self._scan_operand(n, v)
        out = self.e.fresh()
        if idx is None:
            (c,) = carries
            self.e.line(f"{out} = {comb}({c}, tl.associative_scan({vals}, 1, {comb}))")
            self.e.line(f"{c} = {comb}({c}, tl.reduce({vals}, 1, {comb})[:, None])")
            return out
        cv, ci = carries
        sv, si, tv, ti = (self.e.fresh() for _ in range(4))
        self.e.line(f"{sv}, {si} = tl.associative_scan(({vals}, {idx}), 1, {comb})")
        self.e.line(f"{sv}, {si} = {comb}({cv}, {ci}, {sv}, {si})")
        self.e.line(f"{tv}, {ti} = tl.reduce(({vals}, {idx}), 1, {comb})")
        self.e.line(f"{cv}, {ci} = {comb}({cv}, {ci}, {tv}[:, None], {ti}[:, None])")
        return si if kind.startswith("arg") else sv

    # -- statements -------------------------------------------------------------------------------
    def write_scatter(self, s, buf, node: Node, value: str) -> None:
        """A store through data-dependent indices: masked to the buffer's range (an index out of
        it is never written) and, unless proven in range or ``config.index_checks`` is off,
        reported (:meth:`report`: eager's error on the CPU, a device assert on a GPU); an
        atomic where it accumulates."""
        r_store = self.on_r(s)
        block = "[XBLOCK, RBLOCK]" if r_store else "[XBLOCK, 1]" if self.reduction else "[XBLOCK]"
        names = dict(self.names)
        for k, v in enumerate(s.indirect):
            # as a block: an index loaded once is a scalar, and the interpreter's comparisons of
            # one made an int32 mask its atomics refused ("mask has unsupported dtype")
            names[indirect_symbol(k)] = self.e.fresh()
            self.e.line(f"{names[indirect_symbol(k)]} = tl.broadcast_to({self.e.emit(v)}, {block})")
        strides = [sympy.Symbol(f"{buf.name}_s{d}") for d in range(len(buf.shape))]
        mask = "xmask & rmask" if r_store else "xmask"
        if s.mask is not None:
            mask = f"{mask} & ({self.e.emit(s.mask)})"
        syms = {indirect_symbol(k) for k in range(len(s.indirect))}
        checks = [f"(({code(e, names)}) >= 0) & (({code(e, names)}) < {code(n, self.names)})"
                  for e, n in zip(s.index, buf.shape) if sympy.sympify(e).free_symbols & syms]
        inside = self.e.fresh()
        self.e.line(f"{inside} = {' & '.join(checks) if checks else 'True'}")
        proven = all(e in syms and proven_in_range(s.indirect[int(str(e)[3:])], n, var_ranges(self.k))
                     for e, n in zip(s.index, buf.shape) if sympy.sympify(e).free_symbols & syms)
        if checks and self.index_checks and not proven:
            self.report(f"~{inside} & {mask}", 2, "scatter index out of bounds")
        ptr, val = self.e.fresh(), self.e.fresh()
        self.e.line(f"{ptr} = tl.broadcast_to({buf.name} + ({code(offset(s.index, strides), names)}), {block})")
        self.e.line(f"{val} = tl.broadcast_to({self.e.store_value(value, node.dtype, buf.dtype)}, {block})")
        if s.accumulate is None:
            self.e.line(f"tl.store({ptr}, {val}, {mask} & {inside})")
        elif s.accumulate in ("max", "min") and dtypes.is_float(buf.dtype):
            # Triton's float max/min are integer atomics on the bits (by sign), which drop a
            # NaN value or replace a NaN in memory; torch's amax/amin propagate it. So a NaN
            # value, or one the atomic replaced (its old value), is exchanged in with the sign
            # every later max (+NaN) or min (-NaN) on the bits keeps
            nan = 0x7FC00000 if s.accumulate == "max" else -0x400000
            old = self.e.fresh()
            self.e.line(f"{old} = tl.atomic_{s.accumulate}({ptr}, {val}, mask={mask} & {inside} & ({val} == {val}), "
                        "sem='relaxed')")
            self.e.line(f"tl.atomic_xchg({ptr}.to(tl.pointer_type(tl.int32), bitcast=True), tl.full({block}, {nan}, tl.int32), "
                        f"mask={mask} & {inside} & (({val} != {val}) | ({old} != {old})), sem='relaxed')")
        else:
            self.e.line(f"tl.atomic_{s.accumulate}({ptr}, {val}, mask={mask} & {inside}, sem='relaxed')")

