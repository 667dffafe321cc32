"""The ATen ops a loop kernel replaced, kept beside it as a candidate (``LoopProblem.unfused``).

The scheduler fuses pointwise ops and reductions into loop kernels. Where a generated kernel is
no faster than the ops it replaced (on a CPU, a kernel written as PyTorch operators makes more
calls than the graph did), the autotuner should be able to keep the ops. So every fused kernel
carries a *program*: the FX nodes it computes, in graph order, with its inputs and size symbols
in the kernel's canonical names (``in{k}``, ``z{k}``), as JSON text. The template
``aten.unfused_*`` (:mod:`tilewright.templates.aten.unfused`) renders it as straight-line ATen
calls; the tuner times it against the other candidates and records the choice like any other.

Two forms:

* **native**: the kernel is exactly one decomposed composite op (softmax, layer norm, their
  backward formulas, ...), recognised by the tag its decomposition left on its output nodes
  (:mod:`tilewright.compiler.native`): the program is that one op, whose output layout and dtype
  are checked against the kernel's outputs with fake tensors.
* **unfused**: the member FX nodes as they were, plus the views and tuple accesses between them
  and the kernel's inputs. Steps that read no input tensor (iotas, masks, positions) are marked
  *static*: the template computes them once per shape.

A kernel whose nodes cannot be written this way (a value from outside that is not one of its
inputs, a symbolic size that is not one of its size symbols) gets no program, and its
candidates are what they were.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import operator
from typing import Any

import torch
import torch.fx as fx

from tilewright.compiler.graph import FusedNode, KernelGraph, to_sympy
from tilewright.compiler.native import NativeCall, native_of
from tilewright.ir.index import code
from tilewright.templates.aten.unfused import program_reads

log = logging.getLogger("tilewright.compiler")


class NoProgram(Exception):
    """The kernel's nodes cannot be written as a program (the message says why)."""


def attach_programs(kg: KernelGraph, gm: fx.GraphModule) -> int:
    """Give every fused kernel of ``kg`` on the CPU its program (in place, on
    ``FusedNode.problem``); returns how many got one."""
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():  # the compiler's fake-tensor mode: constants are real here
        return _attach(kg, gm)


def _attach(kg: KernelGraph, gm: fx.GraphModule) -> int:
    order = {n.name: i for i, n in enumerate(gm.graph.nodes)}
    by_name = {n.name: n for n in gm.graph.nodes}
    done = 0
    for f in kg.fused:
        if getattr(f.device, "type", "cpu") != "cpu":
            continue  # a candidate on the CPU only (kinds/loop/policy.py)
        try:
            prog = unfused_program(f, by_name, order, gm)
        except NoProgram as e:
            log.debug("%s: no ATen program (%s)", f.name, e)
            continue
        except Exception as e:  # noqa: BLE001 - a program is an extra candidate, never a need
            log.debug("%s: no ATen program (%s: %s)", f.name, type(e).__name__, e)
            continue
        f.problem = dataclasses.replace(f.problem, unfused=json.dumps(prog, sort_keys=True,
                                                                      separators=(",", ":")))
        done += 1
    return done


# -- argument encoding ---------------------------------------------------------------------------
def _literal(x: Any) -> Any:
    """A non-tensor argument as JSON (tagged dicts for what JSON has no form of)."""
    if x is None or isinstance(x, (bool, int, str)):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else {"float": str(x)}
    if isinstance(x, (list, tuple)):
        return [_literal(v) for v in x]
    if isinstance(x, torch.dtype):
        return {"dtype": str(x).removeprefix("torch.")}
    if isinstance(x, torch.device):
        return {"device": str(x)}
    if isinstance(x, torch.layout):
        return {"layout": str(x).removeprefix("torch.")}
    if isinstance(x, torch.memory_format):
        return {"memory_format": str(x).removeprefix("torch.")}
    raise NoProgram(f"argument {x!r} of type {type(x).__name__}")


def _symbolic(node: fx.Node, f: FusedNode) -> dict:
    """A size-valued FX node as code over the kernel's size symbols."""
    val = node.meta.get("val")
    if not isinstance(val, (int, torch.SymInt)) or isinstance(val, bool):
        raise NoProgram(f"{node.name} is neither an input tensor nor a size")
    expr = to_sympy(val)
    names = {s: f"z{k}" for k, s in enumerate(f.symbols)}
    if not expr.free_symbols <= set(names):
        raise NoProgram(f"size {expr} is not one of the kernel's size symbols")
    return {"sym": code(expr, names)}


def _op_name(target: Any) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        return f"{target.namespace}.{target._opname}.{target._overloadname}"
    raise NoProgram(f"call of {target!r}")


def _deterministic(target: Any) -> bool:
    return target is operator.getitem or torch.Tag.nondeterministic_seeded not in target.tags


# ops a view chain may hold that the lowering reads through (cheap to redo in the program)
# (and factories that read only their tensor argument's dtype and device)
_aten = torch.ops.aten
_PASS_THROUGH = {_aten.clone.default, _aten._to_copy.default, _aten.alias.default,
                 _aten._unsafe_view.default, _aten.detach.default, _aten.lift_fresh_copy.default,
                 _aten.new_ones.default,
                 _aten.new_zeros.default, _aten.new_full.default, _aten.new_empty.default,
                 _aten.zeros_like.default, _aten.ones_like.default, _aten.full_like.default}


# scatters whose first argument is the tensor they start from (``self``): their lowering copies it
# into a buffer ``<node>_init`` of the same dtype
_SCATTERS_FROM_SELF = {_aten.scatter.value, _aten.scatter.src, _aten.scatter.reduce,
                       _aten.scatter.value_reduce, _aten.scatter_add.default, _aten.scatter_reduce.two,
                       _aten.index_put.default, _aten._unsafe_index_put.default, _aten.index_add.default}


# -- the unfused form ------------------------------------------------------------------------------
# graph constants (``get_attr``) a program may carry in its text, by element count: the empty
# tensors a KV cache starts from, small tables; anything larger is no program
MAX_CONSTANT = 64


def _constant(node: fx.Node, gm: fx.GraphModule | None) -> dict:
    obj: Any = gm
    for part in str(node.target).split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, torch.Tensor) or obj.numel() > MAX_CONSTANT or obj.is_complex():
        raise NoProgram(f"constant {node.name} is not a small real tensor")
    values = obj.detach().cpu().flatten().tolist()
    return {"op": "constant", "args": [[_literal(v) for v in values]],
            "kwargs": {"dtype": _literal(obj.dtype), "shape": list(obj.shape)}}


@dataclasses.dataclass
class _Step:
    """One step of a program being built: ``args``/``kwargs`` hold FX nodes (or names, as
    :class:`_Name`) until the steps are ordered and numbered."""

    pos: float
    op: str
    args: list
    kwargs: dict
    static: bool
    spec: dict | None = None  # a finished step (a graph constant)


@dataclasses.dataclass(frozen=True)
class _Name:
    name: str


def unfused_program(f: FusedNode, by_name: dict[str, fx.Node], order: dict[str, int],
                    gm: fx.GraphModule | None = None) -> dict:
    """The FX nodes ``f`` computes, as a program (see the module docstring). A decomposed
    composite op whose every node is among them is collapsed back into its one native call
    (:func:`_collapse_natives`); a kernel that is exactly one such op is its call alone.

    Raises:
        NoProgram: a node reads a value that is neither an input of the kernel nor computable
            from its inputs by the nodes walked.
    """
    inputs = {name: k for k, name in enumerate(f.args)}
    for n in f.fx_nodes:
        # a scatter fused with the ops after its target's producer reads that target through the
        # buffer the lowering made of it (``<scatter>_init``, kinds/loop/lower/scatters.py), which
        # holds exactly ``self``'s values: ``self`` is that input
        init = f"{n.name}_init"
        if (n.target in _SCATTERS_FROM_SELF and init in inputs and isinstance(n.args[0], fx.Node)
                and n.args[0].name not in inputs):
            inputs[n.args[0].name] = inputs[init]
    # a scatter whose kernel holds only the buffer it starts from (``<scatter>_init``, an output
    # here) is not computed here: that buffer is
    loops = set(f.members)
    fx_nodes = [n for n in f.fx_nodes if n.name in loops or f"{n.name}_init" not in loops]
    members = {n.name for n in fx_nodes}
    steps: dict[str, _Step] = {}

    def walk(node: fx.Node) -> bool:  # whether the value reads no input tensor
        if node.name in inputs:
            return False
        if node.name in steps:
            return steps[node.name].static
        if node.op == "get_attr":
            steps[node.name] = _Step(order[node.name], "constant", [], {}, True, _constant(node, gm))
            return True
        if node.op != "call_function":
            _symbolic(node, f)  # a size placeholder (raises otherwise)
            return True
        if node.name not in members and not _tensors(node.meta.get("val")) \
                and node.target is not operator.getitem:
            _symbolic(node, f)  # a size computed outside (sym_size): read from the symbols
            return True
        name = _op_name(node.target)
        if node.name not in members and not (_transparent(node) or node.target in _PASS_THROUGH):
            if any(_tensors(a.meta.get("val")) for a in node.all_input_nodes):
                # a load-free value the kernel recomputes where it reads it (an iota and what is
                # computed from it alone): a step of the program like the kernel's own
                if not (all([walk(a) for a in node.all_input_nodes]) and _deterministic(node.target)):
                    raise NoProgram(f"{node.name} ({node.target}) is computed outside the kernel")
                steps[node.name] = _Step(order[node.name], name, list(node.args), dict(node.kwargs), True)
                return True
        reads = [walk(a) for a in node.all_input_nodes]
        steps[node.name] = _Step(order[node.name], name, list(node.args), dict(node.kwargs),
                                 all(reads) and _deterministic(node.target))
        return steps[node.name].static

    for n in fx_nodes:
        walk(n)
    out_nodes = []
    for name in f.outputs:
        node = by_name.get(name) or _init_of(name, by_name)
        if node is None:
            raise NoProgram(f"output {name} is not in the graph")
        if name not in by_name and (node.target in _ZERO_STARTS or node.target in _SCATTERS_FROM_ZEROS):
            # the buffer a later scatter starts from, zeros: made here (a factory's tensor
            # argument, read for dtype and device only, need not be an input)
            steps[name] = _zeros_step(name, by_name[name.removesuffix("_init")], order)
            out_nodes.append(name)
            continue
        walk(node)
        if node.name not in steps:
            raise NoProgram(f"output {name} is an input")
        out_nodes.append(node.name)
    natives = _collapse_natives(f, steps, inputs, by_name)
    ordered = sorted(steps, key=lambda s: steps[s].pos)
    index = {name: j for j, name in enumerate(ordered)}

    def arg(x: Any) -> Any:
        if isinstance(x, (fx.Node, _Name)):
            if x.name in inputs:
                return {"in": inputs[x.name]}
            if x.name in index:
                return {"v": index[x.name]}
            if isinstance(x, _Name):
                raise NoProgram(f"{x.name} is not computed in the program")
            return _symbolic(x, f)
        if isinstance(x, (list, tuple)) and any(isinstance(v, (fx.Node, _Name)) for v in x):
            return [arg(v) for v in x]
        return _literal(x)

    outputs = [index[o] for o in out_nodes]
    encoded = [steps[s].spec if steps[s].spec is not None else
               {"op": steps[s].op, "args": [arg(a) for a in steps[s].args],
                "kwargs": {k: arg(v) for k, v in steps[s].kwargs.items()}} for s in ordered]
    # computed once per shape; never an output (a caller may write into those), and so never
    # a step that reads an output either: the kept steps run before the others, and one
    # reading a value computed per call read it before its definition (a NameError)
    static: set[int] = set()
    for j, s in enumerate(ordered):  # in order: a step's reads are decided before it
        if steps[s].static and j not in outputs and all(v in static for v in program_reads(encoded[j])):
            static.add(j)
    return {"native": natives, "steps": encoded, "outputs": outputs, "static": sorted(static)}


_ZERO_STARTS = {_aten.new_zeros.default, _aten.zeros_like.default, _aten.zeros.default,
                _aten.empty_like.default, _aten.empty.memory_format, _aten.new_empty.default,
                _aten.empty_strided.default, _aten.new_empty_strided.default}
"""Factories a scatter's ``self`` may be whose buffer the lowering fills with zeros."""


def _zeros_step(name: str, scatter: fx.Node, order: dict[str, int]) -> _Step:
    val = scatter.meta["val"]
    if not val.is_contiguous() or any(not isinstance(d, int) for d in val.shape):
        raise NoProgram(f"{name}: zeros of a non-contiguous or symbolic layout")
    return _Step(order[scatter.name] - 0.5, "aten.zeros.default", [list(val.shape)],
                 {"dtype": val.dtype, "device": val.device}, False)


_SCATTERS_FROM_ZEROS = {_aten.embedding_dense_backward.default, _aten.histc.default}
"""Scatters with no ``self``, whose ``<scatter>_init`` buffer the lowering fills with zeros."""


def _init_of(name: str, by_name: dict[str, fx.Node]) -> fx.Node | None:
    """For the lowering's buffer ``name`` = ``<scatter>_init``: the FX node whose values it
    holds (the scatter's ``self``, see :data:`_SCATTERS_FROM_SELF`), or the scatter itself
    where it holds zeros (:data:`_SCATTERS_FROM_ZEROS`); None for any other name."""
    scatter = by_name.get(name.removesuffix("_init")) if name.endswith("_init") else None
    if scatter is not None and scatter.target in _SCATTERS_FROM_ZEROS:
        return scatter
    if scatter is None or scatter.target not in _SCATTERS_FROM_SELF or not isinstance(scatter.args[0], fx.Node):
        return None
    self_node = scatter.args[0]
    val = self_node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != scatter.meta["val"].dtype:
        return None
    return self_node


def _tensors(val: Any) -> bool:
    """Whether an FX value is a tensor or a list of them (``split``'s)."""
    if isinstance(val, (list, tuple)):
        return bool(val) and all(isinstance(v, torch.Tensor) for v in val)
    return isinstance(val, torch.Tensor)


def _transparent(node: fx.Node) -> bool:
    t = node.target
    return t is operator.getitem or (isinstance(t, torch._ops.OpOverload) and t.is_view)


# -- native calls ----------------------------------------------------------------------------------
def _collapse_natives(f: FusedNode, steps: dict[str, _Step], inputs: dict[str, int],
                      by_name: dict[str, fx.Node]) -> list[str]:
    """Replace, in ``steps``, every decomposed composite op whose nodes are all there by its
    native call, when nothing but its outputs is read from outside it and the native op returns
    the dtypes, shapes and strides the graph's nodes have. Returns the ops collapsed."""
    calls: dict[int, NativeCall] = {}
    for name in sorted(steps, key=lambda s: steps[s].pos):
        call = native_of(by_name.get(name))
        if call is not None and call.call_id not in calls:
            calls[call.call_id] = call
    done = []
    for call in calls.values():
        try:
            _collapse(call, f, steps, inputs, by_name)
            done.append(call.op)
        except NoProgram as e:
            log.debug("%s: %s stays decomposed (%s)", f.name, call.op, e)
    return done


def _collapse(call: NativeCall, f: FusedNode, steps: dict[str, _Step], inputs: dict[str, int],
              by_name: dict[str, fx.Node]) -> None:
    outs = [o for o in call.outputs if o is not None and o in steps]
    arg_names = {n for a in (*call.args, *(v for _, v in call.kwargs)) if _is_tensor(a) for n in a[1]}
    # the decomposition: every node between the op's outputs and its arguments
    inner: set[str] = set()
    todo = list(outs)
    while todo:
        name = todo.pop()
        if name in inner or name in arg_names:
            continue
        if name not in steps:
            raise NoProgram(f"{name} of its decomposition is not in the kernel")
        inner.add(name)
        todo.extend(a.name for a in by_name[name].all_input_nodes)
    for name, step in steps.items():  # only the op's outputs may be read from outside it
        if name not in inner and any(a in inner and a not in outs for a in _reads_names(step)):
            raise NoProgram(f"{name} reads a value inside the decomposition")
    if any(o in inner and o not in outs for o in f.outputs):
        raise NoProgram("the kernel stores a value inside the decomposition")

    def arg(x: Any) -> Any:
        if not _is_tensor(x):
            return x
        name = next((n for n in x[1] if n in inputs or (n in steps and n not in inner)), None)
        if name is None:
            raise NoProgram(f"its argument {x[1][0]} is neither an input nor computed here")
        return _Name(name)

    args = [arg(a) for a in call.args]
    kwargs = {k: arg(v) for k, v in call.kwargs}
    names = [a.name for a in (*args, *kwargs.values()) if isinstance(a, _Name)]
    after = max([steps[n].pos for n in names if n in steps], default=-1.0)
    pos = min(steps[o].pos for o in outs) - 0.5
    if pos <= after:
        raise NoProgram("an argument is computed after the op's first output")
    _check_native(call, args, kwargs, outs, by_name)
    static = all(steps[n].static for n in names if n in steps) and not any(n in inputs for n in names)
    op_name = call.op.removeprefix("torch.ops.")
    key = f"native{call.call_id}"
    for name in inner:
        del steps[name]
    multi = len(call.outputs) > 1
    steps[key] = _Step(pos, op_name, args, kwargs, static)
    if multi:  # a tuple access per output that is read on (layer norm's mean often is not)
        read = {n for step in steps.values() for n in _reads_names(step)} | set(f.outputs)
        for o in outs:
            if o in read:
                steps[o] = _Step(pos + 0.25, "getitem", [_Name(key), call.outputs.index(o)], {}, static)
    else:
        steps[key].pos = pos
        steps[outs[0]] = steps.pop(key)


def _is_tensor(x: Any) -> bool:
    return isinstance(x, tuple) and x[:1] == ("tensor",)


def _reads_names(step: _Step) -> list[str]:
    out: list[str] = []

    def walk(x: Any) -> None:
        if isinstance(x, (fx.Node, _Name)):
            out.append(x.name)
        elif isinstance(x, (list, tuple)):
            for v in x:
                walk(v)

    walk(step.args)
    walk(list(step.kwargs.values()))
    return out


def _check_native(call: NativeCall, args: list, kwargs: dict, outs: list[str],
                  by_name: dict[str, fx.Node]) -> None:
    """Raise NoProgram unless the native op, run on fake tensors laid out as its arguments'
    graph values, returns the dtypes, shapes and strides its outputs' nodes have (its
    decomposition may compute in another dtype or lay out its result otherwise)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    def meta(name: str) -> torch.Tensor:
        val = by_name[name].meta.get("val")
        if not isinstance(val, torch.Tensor) or any(isinstance(s, torch.SymInt)
                                                     for s in (*val.shape, *val.stride())):
            raise NoProgram(f"{name} has no static tensor meta")  # dynamic: keep it decomposed
        return val

    with FakeTensorMode():
        def fake(x: Any) -> Any:
            if isinstance(x, _Name):
                m = meta(x.name)
                return torch.empty_strided(m.shape, m.stride(), dtype=m.dtype, device=m.device)
            return x

        try:
            result = resolve_op(call.op)(*[fake(a) for a in args], **{k: fake(v) for k, v in kwargs.items()})
        except Exception as e:  # noqa: BLE001 - the op refuses these arguments
            raise NoProgram(f"{call.op} on the graph's layouts: {type(e).__name__}: {e}") from None
    flat = result if isinstance(result, (tuple, list)) else (result,)
    for o in outs:
        want, got = meta(o), flat[call.outputs.index(o)]
        if not isinstance(got, torch.Tensor) or want.dtype != got.dtype \
                or tuple(want.shape) != tuple(got.shape) \
                or any(n > 1 and a != b for n, a, b in zip(want.shape, want.stride(), got.stride())):
            raise NoProgram(f"{call.op} returns another dtype or layout than its decomposition")


# -- ops by name -----------------------------------------------------------
def resolve_op(name: str) -> Any:
    """The OpOverload of a qualified name ("aten.mul.Tensor")."""
    ns, opname, overload = name.removeprefix("torch.ops.").split(".")
    return getattr(getattr(getattr(torch.ops, ns), opname), overload)
