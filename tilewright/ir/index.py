"""Index arithmetic: iteration variables, view index maps, simplification, affine analysis.

Iteration variables are sympy symbols (integer, non-negative) with fixed prefixes: ``i`` for the
output dims of a lowered op, ``j`` for its reduction dims, ``x`` and ``r`` for a fused kernel's
outer and reduction dims, and ``b``, ``m``, ``n`` for a GEMM epilogue. Sizes are sympy
expressions too (ints, or the ShapeEnv's symbols of a dynamic graph).

A view never copies: it maps an index of the view to an index of its source (the functions
``*_index`` below), and the loads of whoever reads the view absorb the map. Composing maps leaves
floor divisions and remainders that :func:`simplify` removes where the variable ranges allow
(Inductor's FloorDiv/ModularIndexing rules, written for sympy's ``floor`` and ``Mod``).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

import sympy
import sympy.printing.str

Expr = sympy.Expr
Index = tuple[sympy.Expr, ...]


@functools.lru_cache(maxsize=None)
def var(prefix: str, i: int | None = None) -> sympy.Symbol:
    """The iteration variable ``prefix{i}`` (``prefix`` alone when ``i`` is None)."""
    return sympy.Symbol(prefix if i is None else f"{prefix}{i}", integer=True, nonnegative=True)


def variables(prefix: str, n: int) -> Index:
    return tuple(var(prefix, i) for i in range(n))


def is_iter_var(s: sympy.Symbol) -> bool:
    """Iteration variables and indirect-index symbols (everything that is not a size)."""
    name = s.name
    return (name[:1] in ("i", "j", "x", "r") and name[1:].isdigit() or name in ("b", "m", "n")
            or name.startswith("ind") and name[3:].isdigit())


def product(sizes: Sequence[Expr]) -> Expr:
    return sympy.Mul(*sizes) if sizes else sympy.Integer(1)


def same(a: Expr, b: Expr) -> bool:
    """Provably equal sizes."""
    return a == b or sympy.expand(a - b) == 0


def contiguous_strides(shape: Sequence[Expr]) -> Index:
    out, acc = [], sympy.Integer(1)
    for s in reversed(shape):
        out.append(acc)
        acc = acc * s
    return tuple(reversed(out))


def offset(index: Sequence[Expr], strides: Sequence[Expr]) -> Expr:
    """Element offset of a logical index in a strided tensor."""
    return sympy.Add(*(i * s for i, s in zip(index, strides))) if index else sympy.Integer(0)


def unravel(flat: Expr, shape: Sequence[Expr]) -> Index:
    """The row-major index of position ``flat`` in ``shape``."""
    out, inner = [], sympy.Integer(1)
    for s in reversed(shape):
        out.append(sympy.Mod(sympy.floor(flat / inner), s) if inner != 1 else sympy.Mod(flat, s))
        inner = inner * s
    idx = list(reversed(out))
    if idx:  # the outermost dim needs no remainder: flat < product(shape)
        rest = product(shape[1:])
        idx[0] = sympy.floor(flat / rest) if rest != 1 else flat
    return tuple(idx)


def _sizes(shape: Sequence[int | Expr]) -> list[Expr]:
    return [sympy.sympify(s) for s in shape]


# -- views ------------------------------------------------------------------------------------
def reshape_index(old: Sequence[Expr], new: Sequence[Expr], index: Sequence[Expr]) -> Index:
    """Index into ``old`` of element ``index`` of its reshape to ``new`` (row-major order).

    Dims are matched in groups of equal products, so a split or a merge of dims gives plain
    sums and floor/mod only within the group that needs them.
    """
    old, new = _sizes(old), _sizes(new)
    out: list[Expr] = []
    i = j = 0
    while i < len(old) or j < len(new):
        # size-1 dims map to nothing / index 0
        if i < len(old) and old[i] == 1:
            out.append(sympy.Integer(0))
            i += 1
            continue
        if j < len(new) and new[j] == 1:
            j += 1
            continue
        if i >= len(old) or j >= len(new):
            raise ValueError(f"cannot reshape {tuple(old)} to {tuple(new)}")
        gi, gj = [i], [j]
        po, pn = old[i], new[j]
        while not same(po, pn):
            # grow whichever side is provably the smaller, else the old side
            ratio = sympy.simplify(pn / po)
            if sympy.fraction(ratio)[1] == 1 and i + 1 < len(old) and ratio != 1:
                i += 1
                gi.append(i)
                po = po * old[i]
            elif j + 1 < len(new):
                j += 1
                gj.append(j)
                pn = pn * new[j]
            elif i + 1 < len(old):
                i += 1
                gi.append(i)
                po = po * old[i]
            else:
                raise ValueError(f"cannot reshape {tuple(old)} to {tuple(new)}")
        flat = offset([index[k] for k in gj], contiguous_strides([new[k] for k in gj]))
        sizes = [old[k] for k in gi]
        out.extend(unravel(flat, sizes) if len(gi) > 1 else (flat,))
        i += 1
        j += 1
    return tuple(out)


def permute_index(dims: Sequence[int], index: Sequence[Expr]) -> Index:
    """Source index of a permute(dims) view: view dim k is source dim dims[k]."""
    out: list[Expr] = [sympy.Integer(0)] * len(dims)
    for k, d in enumerate(dims):
        out[d] = index[k]
    return tuple(out)


def expand_index(src_shape: Sequence[Expr], index: Sequence[Expr]) -> Index:
    """Source index of an expand view (new leading dims dropped, size-1 dims read at 0)."""
    lead = len(index) - len(src_shape)
    return tuple(sympy.Integer(0) if s == 1 else index[lead + k] for k, s in enumerate(src_shape))


# -- simplification ---------------------------------------------------------------------------
def _monotone(e: Expr) -> bool:
    """Whether every floor in ``e`` has an argument that does not decrease as a variable grows
    (no negative coefficients inside), so substituting each variable's largest value bounds it."""
    for f in e.atoms(sympy.floor):
        for term in sympy.Add.make_args(sympy.expand(f.args[0])):
            if term.free_symbols and term.as_coeff_Mul()[0] < 0:
                return False
    return True


def _max_value(e: Expr, ranges: dict[sympy.Symbol, Expr]) -> Expr | None:
    """An upper bound of a sum of non-negative terms over the variable ranges, or None.

    A remainder is bounded by its divisor less one, never by its value at the largest
    variables (``Mod`` is not monotone: ``Mod(3*x0 + x1, 8)`` at the largest x0, x1 can be 2)."""
    total = sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(e)):
        coeff, rest = term.as_coeff_Mul()
        if coeff < 0:
            return None
        bound = rest.replace(lambda t: isinstance(t, sympy.Mod), lambda t: t.args[1] - 1)
        if not _monotone(bound):
            return None
        for s in rest.free_symbols:
            if s in ranges:
                bound = bound.xreplace({s: ranges[s] - 1})
        if bound.free_symbols & set(ranges):
            return None
        total += coeff * bound
    return total


def _provably_below(e: Expr, limit: Expr, ranges: dict[sympy.Symbol, Expr]) -> bool:
    top = _max_value(e, ranges)
    if top is None:
        return False
    gap = sympy.expand(limit - 1 - top)
    return gap.is_nonnegative is True or (gap.is_number and gap >= 0)


def _split_multiples(e: Expr, d: Expr) -> tuple[Expr, Expr]:
    """(sum of the terms of ``e`` divisible by ``d``, the rest)."""
    mult, rest = sympy.Integer(0), sympy.Integer(0)
    for term in sympy.Add.make_args(sympy.expand(e)):
        q = sympy.cancel(term / d)
        if sympy.fraction(q)[1] == 1:
            mult += term
        else:
            rest += term
    return mult, rest


def simplify(e: Expr, ranges: dict[sympy.Symbol, Expr] | None = None) -> Expr:
    """Remove floor divisions and remainders the variable ranges make redundant:
    ``floor((d*a + b)/d) -> a`` and ``Mod(d*a + b, d) -> b`` when ``0 <= b < d``, and
    ``d*floor(x/d) + Mod(x, d) -> x``. Sound for the non-negative indices kernels use."""
    if not isinstance(e, sympy.Basic) or not e.has(sympy.floor, sympy.Mod):
        return e
    ranges = {k: sympy.sympify(v) for k, v in (ranges or {}).items()}

    def floor_rule(arg: Expr) -> Expr:
        num, den = sympy.fraction(sympy.together(arg))
        if den == 1:
            return num
        mult, rest = _split_multiples(num, den)
        if mult != 0 and (rest == 0 or _provably_below(rest, den, ranges)):
            return sympy.expand(mult / den)
        if rest != 0 and mult == 0 and _provably_below(rest, den, ranges):
            return sympy.Integer(0)
        return sympy.floor(arg)

    def mod_rule(x: Expr, d: Expr) -> Expr:
        mult, rest = _split_multiples(x, d)
        if _provably_below(rest, d, ranges):
            return rest
        return sympy.Mod(rest, d) if mult != 0 else sympy.Mod(x, d)

    out = e.replace(lambda t: isinstance(t, sympy.floor), lambda t: floor_rule(t.args[0]))
    out = out.replace(lambda t: isinstance(t, sympy.Mod), lambda t: mod_rule(*t.args))
    # d*floor(x/d) + Mod(x, d) == x: rewrite remainders and keep the result if it got simpler
    alt = sympy.expand(out.replace(lambda t: isinstance(t, sympy.Mod),
                                   lambda t: t.args[0] - t.args[1] * sympy.floor(t.args[0] / t.args[1])))
    if sympy.count_ops(alt) < sympy.count_ops(out):
        out = alt
    return sympy.expand(out) if not out.has(sympy.floor, sympy.Mod) else out


def affine(e: Expr, variables: Sequence[sympy.Symbol]) -> tuple[dict[sympy.Symbol, Expr], Expr] | None:
    """(coefficient per variable, constant) when ``e`` is affine in ``variables`` with
    coefficients free of them; None otherwise (floor, Mod or products of variables)."""
    vs = set(variables)
    e = sympy.expand(e)
    coeffs: dict[sympy.Symbol, Expr] = {v: sympy.Integer(0) for v in variables}
    const = sympy.Integer(0)
    for term in sympy.Add.make_args(e):
        used = term.free_symbols & vs
        if not used:
            const += term
            continue
        if len(used) > 1:
            return None
        v = used.pop()
        c = sympy.cancel(term / v)
        if c.free_symbols & vs or c.has(sympy.floor, sympy.Mod) or term.has(sympy.floor, sympy.Mod):
            return None
        coeffs[v] += c
    return coeffs, const


def refine(a: Sequence[Expr], b: Sequence[Expr]) -> tuple[Expr, ...] | None:
    """The coarsest shape both ``a`` and ``b`` are groupings of (each dim of either is a
    product of consecutive dims of the result), or None when none is provable.

    ``refine((B*S, H), (B, S, H)) == (B, S, H)``; size-1 dims are dropped.
    """
    a = [s for s in _sizes(a) if s != 1]
    b = [s for s in _sizes(b) if s != 1]
    out: list[Expr] = []
    i = j = 0
    ra = a[0] if a else None
    rb = b[0] if b else None
    while ra is not None and rb is not None:
        if same(ra, rb):
            out.append(ra)
            i += 1
            j += 1
            ra = a[i] if i < len(a) else None
            rb = b[j] if j < len(b) else None
            continue
        qa = sympy.cancel(ra / rb)
        qb = sympy.cancel(rb / ra)
        if sympy.fraction(qa)[1] == 1 and qa != 1:
            out.append(rb)
            ra = qa
            j += 1
            rb = b[j] if j < len(b) else None
        elif sympy.fraction(qb)[1] == 1 and qb != 1:
            out.append(ra)
            rb = qb
            i += 1
            ra = a[i] if i < len(a) else None
        else:
            return None
    if ra is not None or rb is not None:
        return None
    return tuple(out)


def group_index(coarse: Sequence[Expr], fine: Sequence[Expr], fine_index: Sequence[Expr]) -> Index:
    """Index into ``coarse`` of element ``fine_index`` of ``fine``, where ``fine`` refines
    ``coarse`` (see :func:`refine`): each coarse dim is a row-major sum of its fine dims."""
    out: list[Expr] = []
    j = 0
    for size in coarse:
        if size == 1:
            out.append(sympy.Integer(0))
            continue
        group, acc = [], sympy.Integer(1)
        while not same(acc, size):
            if j >= len(fine):
                raise ValueError(f"{tuple(fine)} does not refine {tuple(coarse)}")
            group.append(j)
            acc = acc * fine[j]
            j += 1
        out.append(offset([fine_index[k] for k in group], contiguous_strides([fine[k] for k in group])))
    return tuple(out)


def static_or_hint(e: Expr, hints: dict[sympy.Symbol, int]) -> int:
    """A size's value at the hints (trace-time sizes or a bucket)."""
    v = e.xreplace({s: hints[s] for s in e.free_symbols if s in hints}) if isinstance(e, sympy.Basic) else e
    if isinstance(v, sympy.Basic) and v.free_symbols:
        raise ValueError(f"size {e} depends on {sorted(map(str, v.free_symbols))}, which have no hint")
    return int(v)


def ceil_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


__all__ = ["CodePrinter", "affine", "provably_nonnegative", "ceil_pow2", "code", "contiguous_strides", "expand_index", "group_index",
           "offset", "permute_index", "product", "refine", "reshape_index", "same", "simplify",
           "static_or_hint", "unravel", "var", "variables"]


def provably_nonnegative(e: Expr) -> bool:
    """Whether integer expression ``e`` is >= 0 for all non-negative symbols (indices and
    sizes): every term a non-negative coefficient times symbols, remainders and floors of
    such. False when unsure."""
    for term in sympy.Add.make_args(sympy.expand(e)):
        coeff, rest = term.as_coeff_Mul()
        if coeff < 0:
            return False
        for f in sympy.Mul.make_args(rest):
            base = f.base if isinstance(f, sympy.Pow) else f
            if isinstance(base, sympy.floor):
                if not provably_nonnegative(sympy.fraction(sympy.together(base.args[0]))[0]):
                    return False
            elif not (isinstance(base, (sympy.Symbol, sympy.Mod)) or (base.is_number and base >= 0)):
                return False
    return True


class CodePrinter(sympy.printing.str.StrPrinter):
    """Prints integer index expressions as Python/Triton code: ``floor(a/b)`` as ``a // b`` and
    ``Mod`` as ``%``, symbols by ``names`` (a symbol not in ``names`` prints as itself).

    Triton's ``//`` and ``%`` truncate toward zero (C), Python's round down: the two agree on
    non-negative operands only. sympy moves integer terms out of a floor
    (``floor((r0 + 64*x0 - 5152)/64)`` becomes ``x0 + floor((r0 - 5152)/64)``), so a numerator
    can be negative where the index is not; such a floor is printed from the true remainder
    ``((n % d) + d) % d``, which both conventions compute alike, as ``(n - that) // d`` (an
    exact division)."""

    FLOORDIV = "//"  # the C family's truncating "/" is exact where it is used (see above)

    def __init__(self, names: dict[sympy.Symbol, str] | None = None):
        super().__init__()
        self.names = names or {}

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return self.names.get(expr, expr.name)

    def _print_floor(self, expr: sympy.Expr) -> str:
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        n, d, div = self._print(num), self._print(den), self.FLOORDIV
        if provably_nonnegative(num):
            return f"(({n}) {div} ({d}))"
        return f"((({n}) - ((({n}) % ({d})) + ({d})) % ({d})) {div} ({d}))"

    def _print_ceiling(self, expr: sympy.Expr) -> str:
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        return f"(-((-({self._print(num)})) // ({self._print(den)})))"

    def _print(self, expr: Any, **kwargs: Any) -> str:
        # torch's FloorDiv prints itself as "a//b" (its _sympystr wins over _print_FloorDiv)
        if isinstance(expr, sympy.Basic) and any(c.__name__ == "FloorDiv" for c in type(expr).__mro__):
            return self._print_FloorDiv(expr)
        return super()._print(expr, **kwargs)

    def _print_FloorDiv(self, expr: sympy.Expr) -> str:
        # torch's own floor division (Dynamo's sizes: ``y.view(-1, 4)`` of a dynamic y is
        # ``FloorDiv(s1, 4)`` rows): printed as the floor it is, not as sympy's "//" text (a
        # comment in the C family)
        return self._print_floor(sympy.floor(expr.args[0] / expr.args[1], evaluate=False))

    def _print_ModularIndexing(self, expr: sympy.Expr) -> str:
        base, div, mod = expr.args
        return self._print_Mod(sympy.Mod(sympy.floor(base / div, evaluate=False), mod, evaluate=False))

    def _print_Max(self, expr: sympy.Expr) -> str:
        # a dynamic contiguous stride is max(1, size): launchers compute layouts in Python
        return f"max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr: sympy.Expr) -> str:
        return f"min({', '.join(self._print(a) for a in expr.args)})"

    def _print_Mod(self, expr: sympy.Expr) -> str:
        x, d = self._print(expr.args[0]), self._print(expr.args[1])
        if provably_nonnegative(expr.args[0]):
            return f"(({x}) % ({d}))"
        return f"(((({x}) % ({d})) + ({d})) % ({d}))"  # the true remainder (see the class docstring)

    def _print_Pow(self, expr: sympy.Expr, rational: bool = False) -> str:
        base, e = expr.args
        if e.is_Integer and e > 0:
            return "(" + " * ".join([self.parenthesize(base, 100)] * int(e)) + ")"
        raise ValueError(f"index expression {expr} has a non-integer power")

    def _print_Rational(self, expr: sympy.Expr) -> str:
        raise ValueError(f"index expression has a fraction {expr}")

    def _print_Integer(self, expr: sympy.Expr) -> str:
        return str(int(expr))


def code(e: Expr, names: dict[sympy.Symbol, str] | None = None) -> str:
    """``e`` as Python/Triton integer code (see :class:`CodePrinter`)."""
    return CodePrinter(names).doprint(sympy.sympify(e))


def unflatten(flat: str, variables_: Sequence[sympy.Symbol], ranges: Sequence[sympy.Expr],
              used: set[sympy.Symbol], code: Callable[[sympy.Expr], str], div: str = "//"
              ) -> list[tuple[sympy.Symbol, str]]:
    """Each used variable of a row-major loop nest as code over the flat index ``flat``:
    ``(flat div inner) % size``, without the division for the innermost variable and the
    remainder for the outermost. ``code`` prints a size, ``div`` is the language's integer
    division ("//" in Python-like kernels, "/" in C++-like ones); flat indices are never
    negative, so truncating and flooring division agree here."""
    out: list[tuple[sympy.Symbol, str]] = []
    inner = sympy.Integer(1)
    for v, size in reversed(list(zip(variables_, ranges))):
        if v in used:
            outermost = v is variables_[0]
            if inner == 1:
                text = flat if outermost else f"{flat} % ({code(size)})"
            elif outermost:
                text = f"{flat} {div} ({code(inner)})"
            else:
                text = f"({flat} {div} ({code(inner)})) % ({code(size)})"
            out.append((v, text))
        inner = inner * size
    return out


def static_numel(shape: Sequence[Expr]) -> int:
    """The element count of a static shape; -1 for a symbolic one."""
    n = sympy.expand(product(shape))
    return int(n) if n.is_Integer else -1


def subsampling(ranges: Sequence[Expr], space: Sequence[Expr]) -> int | None:
    """``s`` > 1 where ``ranges`` is ``space`` with its last dim divided by ``s`` (static
    sizes; unit dims ignored), else None."""
    ranges, space = tuple(s for s in ranges if s != 1), tuple(s for s in space if s != 1)
    if not ranges or not space or not same(product(ranges[:-1]), product(space[:-1])):
        return None
    last, full = sympy.sympify(ranges[-1]), sympy.sympify(space[-1])
    if not (last.is_Integer and full.is_Integer) or int(full) % int(last) or int(full) == int(last):
        return None
    return int(full) // int(last)
