"""The ATen ops a loop kernel replaced, as a candidate of its own (``aten.unfused_pointwise``,
``aten.unfused_reduction``).

A :class:`~tilewright.problem.LoopProblem` may carry a *program*: the FX nodes the kernel
computes, in graph order, in the kernel's canonical names (built by
:mod:`tilewright.compiler.programs`), or, when the kernel is exactly one decomposed composite
op (softmax, layer norm, ...), that op alone. This template renders it as straight-line calls of
the ATen overloads themselves. Steps marked static (they read no input: iotas, masks, positions)
are computed once per value of the size symbols and kept. On a CPU, where the generated kernels
run as PyTorch operators, this is often the fastest candidate: it makes the calls eager made,
no more.

The candidate's only parameter is ``program``, the program's digest, so the tuning cache keeps
the choice per program (a kernel's identity, its problem key, does not include the program).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from tilewright.problem import LoopProblem
from tilewright.runtime.targets import Target
from tilewright.templates.base import Params, RenderedKernel, Support, TemplateSpec, SUPPORTED


def program_digest(text: str) -> str:
    """A short stable digest of a program's JSON text: the candidate's ``program`` parameter."""
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _literal(x: Any, names: dict[int, str], inputs: list[str]) -> str:
    """Python source for an encoded argument (see :mod:`tilewright.compiler.programs`)."""
    if isinstance(x, list):
        return "[" + ", ".join(_literal(v, names, inputs) for v in x) + "]"
    if isinstance(x, dict):
        if "in" in x:
            return inputs[x["in"]]
        if "v" in x:
            return names[x["v"]]
        if "sym" in x:
            return f"({x['sym']})"
        if "float" in x:
            return f"float({x['float']!r})"
        if "dtype" in x or "layout" in x or "memory_format" in x:
            return f"torch.{next(iter(x.values()))}"
        if "device" in x:
            return f"torch.device({x['device']!r})"
        raise ValueError(f"unknown program argument {x!r}")
    if isinstance(x, float) and not math.isfinite(x):
        return f"float({str(x)!r})"
    if x is None or isinstance(x, (bool, int, float, str)):
        return repr(x)
    raise ValueError(f"unknown program argument {x!r}")


def render_program(problem: LoopProblem) -> str:
    """The module of ``problem``'s program: ``launch(*inputs, *sizes, outs=None)``."""
    prog = json.loads(problem.unfused)
    k = problem.kernel
    inputs = [b.name for b in k.inputs]
    sizes = [s.name for s in k.size_symbols()]
    ops: list[str] = []
    names: dict[int, str] = {}
    static_set = set(prog["static"])
    static, body = [], []
    for j, step in enumerate(prog["steps"]):
        names[j] = f"v{j}"
        args = [_literal(a, names, inputs) for a in step["args"]]
        args += [f"{key}={_literal(v, names, inputs)}" for key, v in sorted(step["kwargs"].items())]
        if step["op"] == "getitem":
            text = f"v{j} = {args[0]}[{args[1]}]"
        elif step["op"] == "constant":  # a small graph constant, carried by value
            text = f"v{j} = torch.tensor({args[0]}, {args[1]}).reshape({args[2].split('=', 1)[1]})"
        else:
            if step["op"] not in ops:
                ops.append(step["op"])
            text = f"v{j} = OP{ops.index(step['op'])}({', '.join(args)})"
        if j in static_set and (late := [v for v in program_reads(step) if v not in static_set]):
            # the kept steps run first, apart: this one would read a value not yet defined
            raise ValueError(f"program step v{j} is marked static but reads "
                             f"{', '.join(f'v{v}' for v in late)}, computed per call "
                             "(a bug in compiler/programs.py's static set)")
        (static if j in static_set else body).append(text)
    results = []
    for j in prog["outputs"]:
        # an output derived from kept values only (a view of a cached iota) must not alias them
        # (one reading no kept value, a reduction of an input, needs no copy)
        reads = program_reads(prog["steps"][j])
        derived = bool(reads) and all(a in static_set for a in reads)
        results.append(f"v{j}.clone()" if derived and prog["static"] else f"v{j}")
    inits = _zero_started_inits(problem, prog, inputs)
    what = (f"the native op {prog['native'][0]} (the kernel is exactly its decomposition)"
            if is_native(problem) else
            f"the {len(prog['steps'])} ATen ops the kernel replaced, unfused"
            + (f" (native: {', '.join(prog['native'])})" if prog["native"] else ""))
    return UnfusedPointwise().render_jinja(
        problem_text=problem.describe(), what=what, ops=ops, sizes=sizes, inputs=inputs,
        static=static, static_names=[f"v{j}" for j in sorted(static_set)], body=body,
        results=results, inits=inits)


def _zero_started_inits(problem: LoopProblem, prog: dict, inputs: list[str]) -> list[str]:
    """Per output, the input its values are added to ("None" for none). A scatter the lowering
    started from zeros of its own (``embedding_dense_backward``, ``histc``: the op has no
    ``self``) writes into a kernel input holding those zeros (``Buffer.init``), and the kernel
    adds into whatever that input holds; the op in the program starts from zeros of its own
    and never reads that input. Adding the input keeps the program the kernel's exact equal
    (a zero input adds nothing), and lets it update that input in place as the kernel does."""
    read = {x["in"] for step in prog["steps"] for x in _inputs_read(step)}
    out = []
    for b, j in zip(problem.kernel.outputs, prog["outputs"]):
        k = inputs.index(b.init) if b.init in inputs else None
        # a scatter from its ``self`` (index_put, scatter_add...) already holds what the input
        # holds: its program reads ``self`` under its own name where the kernel reads it too
        # (``y[x] += y[x]``), so the input is unread, and adding it counted y twice
        from_self = prog["steps"][j]["op"] in _SCATTERS_FROM_SELF
        out.append(inputs[k] if k is not None and k not in read and not from_self else "None")
    return out


# the ops (program step names) of scatters that start from their first argument
_SCATTERS_FROM_SELF = frozenset({
    "aten.scatter.value", "aten.scatter.src", "aten.scatter.reduce", "aten.scatter.value_reduce",
    "aten.scatter_add.default", "aten.scatter_reduce.two", "aten.index_put.default",
    "aten._unsafe_index_put.default", "aten.index_add.default"})


def _inputs_read(step: dict) -> list[dict]:
    found: list[dict] = []

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict):
            if "in" in x:
                found.append(x)

    walk(step["args"])
    walk(list(step["kwargs"].values()))
    return found


def program_reads(step: dict) -> list[int]:
    """The program values (``{"v": j}``) an encoded step of an unfused program reads."""
    out: list[int] = []

    def walk(x: Any) -> None:
        if isinstance(x, list):
            for v in x:
                walk(v)
        elif isinstance(x, dict) and "v" in x:
            out.append(x["v"])

    walk(step["args"])
    walk(list(step["kwargs"].values()))
    return out


class _AtenUnfused(TemplateSpec):
    backend = "aten"
    jinja = "unfused.py.jinja"

    def problem_support(self, problem: Any, target: Target) -> Support:
        if not isinstance(problem, LoopProblem) or problem.kind != self.op:
            return Support(False, f"{self.id} runs {self.op} loop kernels")
        if not problem.unfused:
            return Support(False, "the kernel carries no ATen program (see compiler/programs.py)")
        if problem.xnumel * problem.rnumel == 0:
            # some ATen ops warn on empty inputs from C++ straight to stderr, where no warnings
            # filter reaches (var_mean: "degrees of freedom is <= 0", once per call: a flood
            # while timing); the torch form does nothing for an empty kernel, and warns not
            return Support(False, "an empty kernel (a size of 0): the torch form skips its work")
        return SUPPORTED

    def check(self, params: Params, problem: Any, target: Target) -> str | None:
        if not (why := self.problem_support(problem, target)):
            return why.reason
        want = program_digest(problem.unfused)
        if dict(params) != {"program": want}:
            return f"{self.id} takes one parameter, program={want} (this kernel's program)"
        return None

    def render_kernel(self, problem: LoopProblem, params: dict[str, Any], target: Target) -> RenderedKernel:
        return RenderedKernel(template_id=self.id, params=dict(params), target=target.name,
                              source=render_program(problem), name=f"aten_unfused_{problem.kind}",
                              meta={"kind": problem.kind, "native": is_native(problem)})


class UnfusedPointwise(_AtenUnfused):
    id = "aten.unfused_pointwise"
    op = "pointwise"


class UnfusedReduction(_AtenUnfused):
    id = "aten.unfused_reduction"
    op = "reduction"


def is_native(problem: LoopProblem) -> bool:
    """Whether ``problem``'s program is exactly one native op (and the tuple accesses of its
    outputs): the kernel is that op's decomposition, fused back."""
    if not problem.unfused:
        return False
    prog = json.loads(problem.unfused)
    calls = [s for s in prog["steps"] if s["op"] != "getitem"]
    return len(prog["native"]) == 1 and len(calls) == 1
