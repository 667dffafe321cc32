"""Threadgroup reductions for the Metal loop kernels: one helper per (kind, types), rendered
into the shader once.

A reduction's value is a tuple of components (a sum: one value; argmax: value and position;
Welford: mean, M2 and count). Each thread first combines its own elements (the template's
loop, or one element in the persistent form), then a helper combines across the threadgroup
and leaves the result in every thread:

* 32-bit and narrower components: within each 32-wide simdgroup (Apple GPUs' SIMD width)
  with ``simd_sum``/``simd_product``/``simd_max``/``simd_min``/``simd_any``/``simd_all`` where
  the builtin has torch's meaning, else a ``simd_shuffle_xor`` butterfly with the kind's
  combine (float max/min must propagate NaN; argmax and Welford carry several values); then
  lane 0 of each simdgroup writes its partial to threadgroup memory (one slot per simdgroup,
  at most 32), and every simdgroup reduces the partials the same way.
* a 64-bit component (``long``): MSL has no 64-bit SIMD shuffles, so a tree over threadgroup
  memory (one slot per thread; the threadgroup size is a power of two).
"""

from __future__ import annotations

from dataclasses import dataclass

from tilewright.ir import dtypes
from tilewright.templates.metal.emit import MSL_TYPE, literal, type_max, type_min

SIMD_WIDTH = 32


@dataclass(frozen=True)
class Reduction:
    """One reduction's components: ``kind`` (sum, prod, max, min, any, all, argmax, argmin,
    welford) over values of compute dtype ``dtype``."""

    kind: str
    dtype: str

    @property
    def types(self) -> tuple[str, ...]:
        """IR dtypes of the components."""
        if self.kind in ("argmax", "argmin"):
            return (self.dtype, "i32")  # the position within the row (rnumel < 2**31)
        if self.kind == "welford":
            return ("fp32", "fp32", "fp32")  # mean, M2, count
        if self.kind in ("any", "all"):
            return ("bool",)
        return (self.dtype,)

    @property
    def msl_types(self) -> tuple[str, ...]:
        return tuple(MSL_TYPE[t] for t in self.types)

    @property
    def tree(self) -> bool:
        """Whether any component is 64-bit (no SIMD shuffles): the threadgroup-memory tree."""
        return any(dtypes.ITEMSIZE[t] == 8 for t in self.types)

    @property
    def name(self) -> str:
        return f"tw_reduce_{self.kind}_{MSL_TYPE[self.dtype]}"

    def identity(self) -> tuple[str, ...]:
        dt = self.dtype
        if self.kind == "sum":
            return (literal(0, dt),)
        if self.kind == "prod":
            return (literal(1, dt),)
        if self.kind == "max":
            return (type_min(dt),)
        if self.kind == "min":
            return (type_max(dt),)
        if self.kind == "any":
            return ("false",)
        if self.kind == "all":
            return ("true",)
        if self.kind == "argmax":  # the largest position loses every tie against a real element
            return (type_min(dt), "2147483647")
        if self.kind == "argmin":
            return (type_max(dt), "2147483647")
        return ("0.0f", "0.0f", "0.0f")

    def combine(self, a: list[str], b: list[str]) -> list[str]:
        """Statements folding partial ``b`` into ``a`` (both lists of component names)."""
        is_float = dtypes.is_float(self.dtype)
        k = self.kind
        if k == "sum":
            return [f"{a[0]} = {a[0]} + {b[0]};"]
        if k == "prod":
            return [f"{a[0]} = {a[0]} * {b[0]};"]
        if k in ("max", "min"):
            fn = ("tw_max" if k == "max" else "tw_min") if is_float else k
            return [f"{a[0]} = {fn}({a[0]}, {b[0]});"]
        if k == "any":
            return [f"{a[0]} = {a[0]} || {b[0]};"]
        if k == "all":
            return [f"{a[0]} = {a[0]} && {b[0]};"]
        if k in ("argmax", "argmin"):
            # the more extreme value wins, NaN counting as the most extreme; ties go to the
            # lower position (torch)
            cmp = ">" if k == "argmax" else "<"
            take = f"({a[0]} {cmp} {b[0]}) || ({a[0]} == {b[0]} && {a[1]} < {b[1]})"
            if is_float:
                take += f" || (isnan({a[0]}) && (!isnan({b[0]}) || {a[1]} < {b[1]}))"
            return [f"const bool take = {take};",
                    f"{a[0]} = take ? {a[0]} : {b[0]};",
                    f"{a[1]} = take ? {a[1]} : {b[1]};"]
        # welford: Chan et al.'s pairwise update of (mean, M2, count)
        return [f"const float w = {a[2]} + {b[2]};",
                f"const float ratio = w == 0.0f ? 0.0f : {b[2]} / w;",
                f"const float delta = {b[0]} - {a[0]};",
                f"{a[0]} = {a[0]} + delta * ratio;",
                f"{a[1]} = {a[1]} + {b[1]} + delta * delta * {a[2]} * ratio;",
                f"{a[2]} = w;"]

    def _simd_builtin(self) -> str | None:
        """The SIMD-group builtin with the kind's meaning, if any."""
        if self.kind == "sum":
            return "simd_sum"
        if self.kind == "prod":
            return "simd_product"
        if self.kind in ("max", "min") and not dtypes.is_float(self.dtype):
            return f"simd_{self.kind}"  # float max/min must propagate NaN: the butterfly
        if self.kind in ("any", "all"):
            return f"simd_{self.kind}"
        return None

    def _simd_step(self, a: list[str], pad: str) -> list[str]:
        builtin = self._simd_builtin()
        if builtin is not None:
            return [f"{pad}{a[0]} = {builtin}({a[0]});"]
        b = [f"b{i}" for i in range(len(a))]
        out = [f"{pad}for (ushort o = {SIMD_WIDTH // 2}; o > 0; o >>= 1) {{"]
        out += [f"{pad}    const {t} {bi} = simd_shuffle_xor({ai}, o);" for t, ai, bi in zip(self.msl_types, a, b)]
        out += [f"{pad}    {s}" for s in self.combine(a, b)]
        out.append(f"{pad}}}")
        return out

    def helper(self) -> str:
        """The MSL helper: ``name(thread T0& a0, ..., threadgroup T0* s0, ..., tid, lane, sg,
        nsg, ntg)`` reduces ``a*`` over the threadgroup into every thread."""
        n = len(self.types)
        a = [f"a{i}" for i in range(n)]
        s = [f"s{i}" for i in range(n)]
        params = [f"thread {t}& {ai}" for t, ai in zip(self.msl_types, a)]
        params += [f"threadgroup {t}* {si}" for t, si in zip(self.msl_types, s)]
        params += ["uint tid", "uint lane", "uint sg", "uint nsg", "uint ntg"]
        barrier = "threadgroup_barrier(mem_flags::mem_threadgroup);"
        body: list[str] = []
        if self.tree:
            body += [f"{si}[tid] = {ai};" for ai, si in zip(a, s)] + [barrier]
            body.append("for (uint stride = ntg / 2; stride > 0; stride >>= 1) {")
            body.append("    if (tid < stride) {")
            b = [f"b{i}" for i in range(n)]
            body += [f"        const {t} {bi} = {si}[tid + stride];" for t, bi, si in zip(self.msl_types, b, s)]
            body += [f"        {st}" for st in self.combine(a, b)]
            body += [f"        {si}[tid] = {ai};" for ai, si in zip(a, s)]
            body += ["    }", f"    {barrier}", "}"]
            body += [f"{ai} = {si}[0];" for ai, si in zip(a, s)]
            body.append(f"{barrier}  // the slots are free again for the next reduction")
        else:
            body += self._simd_step(a, "")
            body.append("if (lane == 0) {")
            body += [f"    {si}[sg] = {ai};" for ai, si in zip(a, s)]
            body += ["}", barrier]
            body.append("if (lane < nsg) {")
            body += [f"    {ai} = {si}[lane];" for ai, si in zip(a, s)]
            body.append("} else {")
            body += [f"    {ai} = {ident};" for ai, ident in zip(a, self.identity())]
            body.append("}")
            body += self._simd_step(a, "")
            body.append(f"{barrier}  // the slots are free again for the next reduction")
        kind = "tree over threadgroup memory (64-bit: no SIMD shuffles)" if self.tree else \
            "simdgroup, then across simdgroups through threadgroup memory"
        head = f"// {self.kind} of {', '.join(self.msl_types)} over the threadgroup: {kind}"
        return "\n".join([head, f"inline void {self.name}({', '.join(params)}) {{"]
                         + [f"    {line}" for line in body] + ["}"])

    def slots(self, threads: int) -> list[tuple[str, int]]:
        """(MSL type, slots) of the threadgroup arrays the helper needs, one per component."""
        size = threads if self.tree else SIMD_WIDTH
        return [(t, size) for t in self.msl_types]
