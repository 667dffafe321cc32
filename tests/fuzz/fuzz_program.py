"""Random programs for the differential fuzzer: 1-6 calls of ops from the lowering table on a few
small inputs, drawn by hypothesis (so a failure shrinks to a minimal program) and printed as a
Python function that reproduces it.

A :class:`Program` is its inputs (values, shape, dtype and memory layout: contiguous, transposed,
strided, offset into a larger storage, or expanded with a zero stride) and its steps, each an
ATen/prims overload called on earlier values. While a program is drawn each step is run eagerly
on the drawn inputs, so the next step knows the shapes and dtypes it works on; a step eager
refuses is drawn again, or now and then kept as the program's last step (then the compiled
program must raise as well). Values are special more often than not: NaN, ±inf, -0.0, the
extremes, subnormals, integer extremes.

Index inputs stray outside their dim now and then (one in four), so eager's IndexError must be
matched too.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from hypothesis import strategies as st

from fuzz_ops import DTYPES, FAMILY_WEIGHTS, FLOATS, Ref, catalogue, draw_call

aten, prims = torch.ops.aten, torch.ops.prims
MAX_STEPS = 6
MAX_INPUTS = 6
MAX_NUMEL = 64


# -- inputs -------------------------------------------------------------------------------------
def specials(dtype: torch.dtype) -> list:
    """Special values of ``dtype``: NaN, ±inf, ±0, extremes, subnormals (floats); extremes and
    their neighbours (integers)."""
    if dtype == torch.bool:
        return [True, False]
    if dtype.is_floating_point:
        fi = torch.finfo(dtype)
        return [math.nan, math.inf, -math.inf, -0.0, 0.0, fi.max, -fi.max, fi.max / 2,
                fi.smallest_normal / 4, -fi.smallest_normal * fi.eps, fi.smallest_normal, 1.0, -1.0, 0.5]
    ii = torch.iinfo(dtype)
    return [ii.max, ii.min, ii.max - 1, ii.min + 1, 0, 1, -1]


def elements(dtype: torch.dtype) -> st.SearchStrategy:
    if dtype == torch.bool:
        return st.booleans()
    if dtype.is_floating_point:
        ordinary = st.floats(-4, 4, width=32).map(lambda v: float(torch.tensor(v).to(dtype)))
    else:
        ordinary = st.integers(-8, 8)
    return st.one_of(ordinary, st.sampled_from(specials(dtype)))


def make_input(values: list, shape: tuple[int, ...], dtype: torch.dtype, layout: str = "contiguous") -> torch.Tensor:
    """A tensor of ``shape`` and ``dtype`` holding ``values`` (row-major) laid out as ``layout``:
    'contiguous', 'transposed' (last two dims swapped in memory), 'strided' (every other element
    of a larger storage), 'offset' (storage offset 1) or 'expanded<d>' (dim ``d`` has stride 0:
    ``values`` then fill the shape with 1 at ``d``)."""
    if layout.startswith("expanded"):
        d = int(layout[len("expanded"):])
        base = list(shape)
        base[d] = 1
        return torch.tensor(values, dtype=dtype).reshape(base).expand(shape)
    t = torch.tensor(values, dtype=dtype).reshape(shape)
    if layout == "transposed":
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "strided":
        big = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)
        big[..., ::2] = t
        return big[..., ::2]
    if layout == "offset":
        flat = torch.zeros(t.numel() + 1, dtype=dtype)
        flat[1:] = t.reshape(-1)
        return flat[1:].view(shape)
    return t


@dataclass
class Input:
    name: str
    values: list
    shape: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"

    def build(self) -> torch.Tensor:
        return make_input(self.values, self.shape, self.dtype, self.layout)

    def render(self) -> str:
        return f"make_input({render(self.values)}, {self.shape!r}, {self.dtype}, {self.layout!r})"


def render(v: Any) -> str:
    """``v`` as Python source (names for values, inf/nan for special floats)."""
    if isinstance(v, Ref):
        return v.name
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, (list, tuple)):
        inner = ", ".join(render(x) for x in v)
        return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
    if isinstance(v, torch.device):
        return f"torch.device({str(v)!r})"
    return str(v) if isinstance(v, torch.dtype) else repr(v)


# -- programs -----------------------------------------------------------------------------------
@dataclass
class Step:
    outs: list[str]
    op: Any
    args: list
    kwargs: dict

    def render(self) -> str:
        parts = [render(a) for a in self.args] + [f"{k}={render(v)}" for k, v in self.kwargs.items()]
        lhs = ", ".join(self.outs) + ("," if len(self.outs) == 1 and self.tuple_out else "")
        return f"{lhs} = {self.op}({', '.join(parts)})"

    tuple_out: bool = False


@dataclass
class Program:
    """Inputs, steps and the values returned; ``dynamic``: compiled with dynamic shapes;
    ``raises``: eager raises at the last step (the compiled program must raise too)."""

    inputs: list[Input]
    steps: list[Step]
    outputs: list[str]
    dynamic: bool = False
    raises: str | None = None

    def function_source(self) -> str:
        lines = [f"def f({', '.join(i.name for i in self.inputs)}):"]
        lines += [f"    {s.render()}" for s in self.steps]
        lines.append(f"    return ({', '.join(self.outputs)},)")
        return "\n".join(lines)

    def source(self, mode: str) -> str:
        """A reproducer: paste into a test under tests/fuzz/ (see test_fuzz_finds.py)."""
        ins = ",\n    ".join(i.render() for i in self.inputs)
        return (f"{self.function_source()}\n\n\ninputs = [\n    {ins},\n]\n"
                f"check(f, inputs, mode={mode!r}, dynamic={self.dynamic})")

    def function(self) -> Callable:
        ns = namespace()
        exec(compile(self.function_source(), "<fuzz program>", "exec"), ns)  # noqa: S102 - our own text
        return ns["f"]

    def tensors(self) -> list[torch.Tensor]:
        return [i.build() for i in self.inputs]


def namespace() -> dict:
    """What a program's source refers to."""
    return {"torch": torch, "aten": aten, "prims": prims, "inf": math.inf, "nan": math.nan,
            "make_input": make_input}


@dataclass
class Builder:
    """A program being drawn: its inputs and steps so far and every value computed eagerly."""

    mode: str
    inputs: list[Input] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)
    parents: dict[str, set[str]] = field(default_factory=dict)

    # -- values ---------------------------------------------------------------------------------
    def value(self, x: Any) -> Any:
        return self.values[x.name] if isinstance(x, Ref) else x

    def shape(self, r: Ref | None) -> tuple[int, ...]:
        return tuple(self.values[r.name].shape) if r is not None else ()

    def ndim(self, r: Ref | None) -> int:
        return len(self.shape(r))

    def numel(self, r: Ref) -> int:
        return self.values[r.name].numel()

    def dtype(self, r: Ref) -> torch.dtype:
        return self.values[r.name].dtype

    def ancestors(self, name: str) -> set[str]:
        seen, todo = set(), [name]
        while todo:
            for p in self.parents.get(todo.pop(), ()):
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        return seen

    # -- drawing operands -----------------------------------------------------------------------
    def pick(self, draw, like: Ref | None = None, dtype: torch.dtype | None = None, dtype_in=None,
             min_ndim: int = 0, max_ndim: int = 3, nonempty: bool = False, same_shape: bool = False,
             shape: tuple[int, ...] | None = None) -> Ref:
        """A tensor operand: a value of the program that fits, or (sometimes, or when none does)
        a new input. ``like``: another operand it should broadcast with (same dtype or shape
        preferred)."""
        want = shape if shape is not None else (self.shape(like) if same_shape else None)

        def fits(name: str) -> bool:
            t = self.values[name]
            if not isinstance(t, torch.Tensor) or (want is not None and tuple(t.shape) != tuple(want)):
                return False
            if dtype is not None and t.dtype != dtype or dtype_in is not None and t.dtype not in dtype_in:
                return False
            return min_ndim <= t.ndim <= max_ndim and (t.numel() > 0 or not nonempty)
        live = [n for n in self.values if fits(n)]
        if like is not None and want is None:
            # operands of the same shape first: a random pair rarely broadcasts
            same = [n for n in live if tuple(self.values[n].shape) == self.shape(like)]
            live = same if same and draw(st.integers(0, 3)) else live
        if live and (len(self.inputs) >= MAX_INPUTS or draw(st.integers(0, 3))):
            # the latest value half the time: steps chain into one graph instead of side branches
            return Ref(live[-1] if draw(st.booleans()) else draw(st.sampled_from(live)))
        if want is None:
            if like is not None and draw(st.booleans()):
                want = tuple(s if draw(st.integers(0, 3)) else 1 for s in self.shape(like))
            else:
                want = draw_shape(draw, min_ndim, max_ndim, nonempty)
        if dtype is None:
            pool = list(dtype_in or DTYPES)
            dtype = self.dtype(like) if like is not None and self.dtype(like) in pool and draw(st.booleans()) \
                else draw(st.sampled_from(pool))
        return self.new_input(draw, tuple(want), dtype)

    def new_input(self, draw, shape: tuple[int, ...], dtype: torch.dtype, values: list | None = None,
                  layout: str | None = None) -> Ref:
        name = f"x{len(self.inputs)}"
        if layout is None:
            layouts = ["contiguous", "offset"]
            if len(shape) >= 1 and shape[-1] > 0:
                layouts.append("strided")
            if len(shape) >= 2:
                layouts.append("transposed")
            layouts += [f"expanded{d}" for d, s in enumerate(shape) if s > 1]
            layout = draw(st.sampled_from(layouts))
        if values is None:
            base = list(shape)
            if layout.startswith("expanded"):
                base[int(layout[len("expanded"):])] = 1
            n = math.prod(base)
            values = draw(st.lists(elements(dtype), min_size=n, max_size=n))
        inp = Input(name, values, shape, dtype, layout)
        self.inputs.append(inp)
        self.values[name] = inp.build()
        return Ref(name)

    def new_index(self, draw, size: int, shape: tuple[int, ...] | None = None, negative: bool = False,
                  unique_along: int | None = None) -> Ref:
        """A new int64 input of indices into a dim of ``size`` (``negative``: eager wraps -size..-1
        too); ``unique_along``: no index repeats along that dim (a scatter that overwrites must
        not write one place twice: eager's answer would depend on the order)."""
        shape = shape if shape is not None else tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
        lo = -size if negative else 0
        if draw(st.integers(0, 3)) == 0:  # one past each end: eager raises, so must we
            lo, size = lo - 1, size + 1
        if unique_along is None:
            values = draw(st.lists(st.integers(lo, size - 1), min_size=math.prod(shape), max_size=math.prod(shape)))
        else:
            d = unique_along
            shape = shape[:d] + (min(shape[d], size),) + shape[d + 1:]
            fibers = math.prod(shape) // max(shape[d], 1)
            cols = [draw(st.permutations(range(size)))[:shape[d]] for _ in range(fibers)]
            t = torch.tensor(cols, dtype=torch.int64).reshape(*shape[:d], *shape[d + 1:], shape[d])
            values = t.movedim(-1, d).reshape(-1).tolist()
        return self.new_input(draw, shape, torch.int64, values, layout="contiguous")

    # -- steps ----------------------------------------------------------------------------------
    def call(self, op, args: list, kwargs: dict) -> Any:
        def real(v):
            if isinstance(v, Ref):
                return self.values[v.name]
            return [real(x) for x in v] if isinstance(v, list) else v
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return op(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})

    def meta_disagrees(self, op, args: list, kwargs: dict, outs: list[torch.Tensor]) -> bool:
        """Whether ``op``'s meta function gives other dtypes than its eager kernel returned
        (``prims.sinh`` of int64: meta says int64, eager returns float32). torch.compile traces
        with the meta, so no compiler can match eager there: such a step is not drawn."""
        def meta(v):
            if isinstance(v, Ref):
                t = self.values[v.name]
                return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")
            return [meta(x) for x in v] if isinstance(v, list) else v
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = op(*[meta(a) for a in args], **{k: meta(v) for k, v in kwargs.items()})
        except Exception:
            return False  # no meta kernel to disagree with: Dynamo's fake tensors decide
        ms = list(m) if isinstance(m, (tuple, list)) else [m]
        return [getattr(t, "dtype", None) for t in ms] != [t.dtype for t in outs]

    def add_step(self, op, args: list, kwargs: dict, out: Any, raises: bool = False) -> list[str]:
        results = list(out) if isinstance(out, (tuple, list)) else [out]
        base = sum(len(s.outs) for s in self.steps)
        names = [f"v{base + k}" for k in range(len(results))] if not raises else [f"v{base}"]
        step = Step(names, op, args, kwargs, tuple_out=isinstance(out, (tuple, list)) and not raises)
        self.steps.append(step)
        refs = {r.name for r in _refs(args) + _refs(list(kwargs.values()))}
        for n, r in zip(names, results):
            self.values[n] = r
            self.parents[n] = refs
        return names


def _refs(xs: list) -> list[Ref]:
    out = []
    for x in xs:
        if isinstance(x, Ref):
            out.append(x)
        elif isinstance(x, list):
            out += _refs(x)
    return out


def draw_shape(draw, min_ndim: int = 0, max_ndim: int = 3, nonempty: bool = False) -> tuple[int, ...]:
    nd = draw(st.integers(max(min_ndim, 0), min(max_ndim, 3)))
    shape = []
    for _ in range(nd):
        rest = MAX_NUMEL // max(math.prod(shape), 1)
        shape.append(0 if not nonempty and draw(st.integers(0, 15)) == 0 else draw(st.integers(1, min(7, rest))))
    return tuple(shape)


_CATALOGUE: list = []


def fuzzed_ops() -> dict[str, list]:
    if not _CATALOGUE:
        _CATALOGUE.append(catalogue()[0])
    return _CATALOGUE[0]


@st.composite
def programs(draw, mode: str = "auto") -> Program:
    """A random program of 1-:data:`MAX_STEPS` steps for ``mode`` (its exclusions applied)."""
    b = Builder(mode)
    ops = fuzzed_ops()
    families = [f for f, w in FAMILY_WEIGHTS.items() for _ in range(w) if ops[f]]
    b.pick(draw, dtype_in=FLOATS if draw(st.integers(0, 2)) else None)  # the first input
    raises = None
    for _ in range(draw(st.integers(1, MAX_STEPS))):
        for _attempt in range(8):
            op = draw(st.sampled_from(ops[draw(st.sampled_from(families))]))
            mark = (len(b.inputs), dict(b.values))
            args, kwargs = draw_call(draw, b, op)
            try:
                out = b.call(op, args, kwargs)
                outs = list(out) if isinstance(out, (tuple, list)) else [out]
                if not outs or any(not isinstance(t, torch.Tensor) or t.numel() > 4 * MAX_NUMEL for t in outs):
                    raise _Excluded()
                if b.meta_disagrees(op, args, kwargs, outs):
                    raise _Excluded()
            except _Excluded:
                del b.inputs[mark[0]:]
                b.values = mark[1]
                continue
            except Exception as e:  # eager refuses: keep it now and then, as the last step
                if draw(st.integers(0, 9)) == 0:
                    b.add_step(op, args, kwargs, None, raises=True)
                    raises = f"{type(e).__name__}: {e}"[:200]
                    break
                del b.inputs[mark[0]:]
                b.values = mark[1]
                continue
            b.add_step(op, args, kwargs, out)
            break
        if raises:
            break
    if not b.steps:  # nothing eager accepts: return an input as it is (compiles to nothing)
        b.add_step(aten.clone.default, [Ref("x0")], {}, b.values["x0"].clone())
    used = {r.name for s in b.steps for r in _refs(s.args) + _refs(list(s.kwargs.values()))}
    last = b.steps[-1].outs
    leaves = [n for s in b.steps[:-1] for n in s.outs if n not in used]
    extra = draw(st.lists(st.sampled_from(leaves), unique=True, max_size=2)) if leaves and not raises else []
    return Program(b.inputs, b.steps, list(last) + extra, dynamic=draw(st.integers(0, 3)) == 0, raises=raises)


class _Excluded(Exception):
    pass
