"""Wrapper codegen: the kernel graph becomes a Python module whose ``call(args)`` Dynamo runs.

The module calls ATen for extern nodes and the chosen kernel (through its
:class:`~tilewright.compiler.dispatch.KernelCall`) for each kernel node: a loop kernel, a
kernel of a kind's own node type (which writes its call: ``Node.wrapper_lines``, a GEMM's) and
one of another problem kind (:class:`~tilewright.compiler.graph.KernelNode`), in order, and
drops every value after its last use so memory is freed as early as eager would. It takes its
inputs as one list and clears it (aot_autograd's boxed calling convention), so inputs can be
freed early too. Symbolic sizes a loop kernel needs are read off the graph's inputs once, at the
top (a SymInt input, or a tensor input's size or stride).
"""

from __future__ import annotations

import itertools
import linecache
import math
import operator
from typing import Any, Callable

import torch
import torch.fx as fx

import sympy

from tilewright.compiler.graph import ExternNode, FusedNode, KernelGraph, KernelNode, produced, to_sympy

RESERVED = {"torch", "aten", "prims", "operator", "math", "kernels", "consts", "_entry", "args", "call",
            "device", "inf", "nan"}
_counter = itertools.count()

_aten = torch.ops.aten
# view ops written as the tensor's own method: the same ATen op, reached through the method's
# argument parser instead of OpOverload's Python __call__ (a view costs ~1.3 us instead of ~3.5;
# a training backward makes ~100 of them per call). Only calls with exactly these positional
# arguments and no keyword ones (expand's ``implicit`` aside) take this form. A non-empty size
# list is passed as separate arguments, which the parser takes faster than a list (view 0.96 us
# against 1.57, permute and expand alike: measured, one thread).
VIEW_METHODS: dict[Any, tuple[str, int]] = {
    _aten.view.default: ("view", 2),
    _aten.t.default: ("t", 1),
    _aten.transpose.int: ("transpose", 3),
    _aten.permute.default: ("permute", 2),
    _aten.unsqueeze.default: ("unsqueeze", 2),
    _aten.squeeze.dim: ("squeeze", 2),
    _aten.expand.default: ("expand", 2),
    _aten.select.int: ("select", 3),
    _aten.detach.default: ("detach", 1),
}


class WrapperError(Exception):
    """Writing or loading the wrapper failed at the line of kernel ``node`` (None: of no
    kernel); ``error`` is what failed. The pipeline runs that kernel's ops on ATen instead."""

    def __init__(self, node: str | None, error: BaseException):
        super().__init__(f"{node or 'the wrapper'}: {type(error).__name__}: {error}")
        self.node, self.error = node, error


class WrapperCodegen:
    """Generates the wrapper source for one kernel graph.

    Args:
        kg: the fused kernel graph.
        gm: the FX graph module it came from (for ``get_attr`` constants).
        describe: per kernel node name, a one-line comment (problem and chosen kernel).
    """

    def __init__(self, kg: KernelGraph, gm: fx.GraphModule, describe: dict[str, str] | None = None):
        self.kg = kg
        self.gm = gm
        self.describe = describe or {}
        self.consts: list[Any] = []
        self._names: dict[str, str] = {}
        self.symbols: dict[sympy.Symbol, str] = {}
        self.entries: dict[str, str] = {}  # header name -> the op overload it binds
        self.owners: dict[int, str] = {}  # line number of the source -> the kernel node it calls

    # -- names and literals ----------------------------------------------------------------------
    def name(self, value: str) -> str:
        if value not in self._names:
            ident = value if value.isidentifier() and value not in RESERVED else f"v_{value}"
            self._names[value] = ident.replace(".", "_")
        return self._names[value]

    def const(self, obj: Any) -> str:
        self.consts.append(obj)
        return f"consts[{len(self.consts) - 1}]"

    def literal(self, x: Any) -> str:
        if isinstance(x, fx.Node):
            return self.name(x.name)
        if isinstance(x, list):
            return "[" + ", ".join(self.literal(v) for v in x) + "]"
        if isinstance(x, tuple):
            return "(" + "".join(self.literal(v) + ", " for v in x) + ")"
        if isinstance(x, dict) and all(isinstance(k, str) for k in x):
            return "{" + ", ".join(f"{k!r}: {self.literal(v)}" for k, v in x.items()) + "}"
        if x is None or isinstance(x, (bool, int, str)):
            return repr(x)
        if isinstance(x, float):
            return repr(x) if math.isfinite(x) else f"float({str(x)!r})"
        if isinstance(x, torch.dtype):
            return str(x)
        if isinstance(x, torch.device):
            return f"torch.device({str(x)!r})"
        if isinstance(x, (torch.layout, torch.memory_format)):
            return str(x)
        return self.const(x)

    def target(self, t: Any) -> str:
        if isinstance(t, torch._ops.OpOverload):
            ns = t.namespace
            if ns in ("aten", "prims"):
                path = f"{ns}.{t._opname}.{t._overloadname}"
            elif ns.isidentifier() and t._opname.isidentifier():
                path = f"torch.ops.{ns}.{t._opname}.{t._overloadname}"
            else:
                return self.const(t)
            # bound once in the header to the overload's C++ entry (what its __call__ calls)
            entry = "_op_" + path.replace("torch.ops.", "").replace(".", "_")
            self.entries[entry] = path
            return entry
        if getattr(t, "__module__", None) == "_operator" and hasattr(operator, t.__name__):
            return f"operator.{t.__name__}"
        return self.const(t)

    # -- code --------------------------------------------------------------------------------------
    def _extern(self, n: ExternNode) -> str:
        node = n.fx_node
        if node.op == "get_attr":
            obj = self.gm
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            return f"{self.name(n.name)} = {self.const(obj)}"
        method = VIEW_METHODS.get(node.target)
        kwargs = {k: v for k, v in node.kwargs.items() if not (k == "implicit" and v is False)}
        if (method is not None and not kwargs and len(node.args) == method[1]
                and isinstance(node.args[0], fx.Node)):
            rest = ", ".join(self.literal(a) if not (isinstance(a, (list, tuple)) and a)
                             else ", ".join(self.literal(v) for v in a) for a in node.args[1:])
            return f"{self.name(n.name)} = {self.literal(node.args[0])}.{method[0]}({rest})"
        args = [self.literal(a) for a in node.args]
        args += [f"{k}={self.literal(v)}" for k, v in node.kwargs.items()]
        return f"{self.name(n.name)} = {self.target(node.target)}({', '.join(args)})"

    def _fused(self, f: FusedNode) -> list[str]:
        args = [self.name(v) for v in f.args] + [self.symbol(s) for s in f.symbols]
        outs = ", ".join(self.name(v) for v in f.outputs)
        lines = [f"# {f.name}: {self.describe[f.name]}"] if f.name in self.describe else []
        return lines + [f"{outs} = {f.name}({', '.join(args)})"]

    def _kernel(self, k: KernelNode) -> list[str]:
        args = ", ".join(self.literal(a) for a in k.args)
        outs = ", ".join(self.name(v) for v in k.outputs)
        lines = [f"# {k.name}: {self.describe[k.name]}"] if k.name in self.describe else []
        return lines + [f"{outs} = {k.name}({args})"]  # several outputs: the call returns a tuple

    def symbol(self, s: sympy.Symbol) -> str:
        if s not in self.symbols:
            raise ValueError(f"size {s} is not readable from the graph's inputs")
        return self.symbols[s]

    def _symbol_sources(self) -> list[str]:
        """Lines binding each size symbol the kernels need to a value read off the inputs."""
        needed = {s for f in self.kg.fused for s in f.symbols}
        lines = []
        for p in self.kg.placeholders:
            val = p.meta.get("val")
            if isinstance(val, torch.SymInt):
                e = to_sympy(val)
                if e in needed and e not in self.symbols:
                    self.symbols[e] = self.name(p.name)
            elif isinstance(val, torch.Tensor):
                for d, size in enumerate(val.shape):
                    e = to_sympy(size)
                    if e.is_Symbol and e in needed and e not in self.symbols:
                        var = f"_{e.name}"
                        lines.append(f"{var} = {self.name(p.name)}.size({d})")
                        self.symbols[e] = var
                for d, st in enumerate(val.stride()):
                    e = to_sympy(st)
                    if e.is_Symbol and e in needed and e not in self.symbols:
                        var = f"_{e.name}"
                        lines.append(f"{var} = {self.name(p.name)}.stride({d})")
                        self.symbols[e] = var
        return lines

    def generate(self) -> str:
        kg = self.kg
        outputs = {n.name for n in self.kg.output.all_input_nodes}
        sources = self._symbol_sources()
        # a SymInt input a loop kernel takes as a size is used by that kernel too
        by_var = {self.name(p.name): p.name for p in kg.placeholders}
        last_use: dict[str, int] = {}
        for i, n in enumerate(kg.nodes):
            used = list(n.inputs)
            if isinstance(n, FusedNode):
                used += [by_var[self.symbols[s]] for s in n.symbols if self.symbols.get(s) in by_var]
            for v in used:
                last_use[v] = i
        body = [f"({''.join(self.name(p.name) + ', ' for p in kg.placeholders)}) = args",
                "args.clear()"]
        body += sources
        sizes = set(self.symbols.values())  # SymInt inputs the loop kernels take as sizes
        dead_inputs = [p.name for p in kg.placeholders if p.name not in last_use and p.name not in outputs
                       and self.name(p.name) not in sizes]
        if dead_inputs:
            body.append("del " + ", ".join(self.name(v) for v in dead_inputs))
        kernel_lines: dict[int, str] = {}  # body index -> the kernel node it calls
        for i, n in enumerate(kg.nodes):
            start = len(body)
            try:
                if isinstance(n, FusedNode):
                    body.extend(self._fused(n))
                elif isinstance(n, KernelNode):
                    body.extend(self._kernel(n))
                elif n.launches_kernel:  # a kind's own node (a GEMM) writes its call
                    body.extend(n.wrapper_lines(self))
                else:
                    body.append(self._extern(n))  # type: ignore[arg-type]
            except Exception as e:  # noqa: BLE001 - costs that kernel (the pipeline unlowers it)
                raise WrapperError(n.name if not isinstance(n, ExternNode) else None, e) from e
            if not isinstance(n, ExternNode):
                kernel_lines.update({k: n.name for k in range(start, len(body))})
            used = set(n.inputs)
            if isinstance(n, FusedNode):
                used |= {by_var[self.symbols[s]] for s in n.symbols if self.symbols.get(s) in by_var}
            dead = sorted({v for v in used if last_use.get(v) == i and v not in outputs})
            dead += [v for v in produced(n) if v not in last_use and v not in outputs]
            if dead:
                body.append("del " + ", ".join(self.name(v) for v in dead))
        body.append(f"return {self.literal(tuple(kg.output.args[0]) if isinstance(kg.output.args[0], (list, tuple)) else kg.output.args[0])}")
        header = [
            "# Generated by tilewright: the compiled graph Dynamo calls. Kernels are in `kernels`.",
            "import math",
            "import operator",
            "import torch",
            "aten = torch.ops.aten",
            "prims = torch.ops.prims",
            "",
        ]
        # a kernel's call is its kind's invoker itself, or an ATen op itself (KernelCall.entry):
        # one Python frame less per kernel call
        header += [f"{k.name} = _entry(kernels[{k.name!r}])" for k in kg.kernels]
        header += [f"{name} = getattr({path}, '_op', {path})" for name, path in sorted(self.entries.items())]
        first = len(header) + 4  # the line number of the body's first line
        self.owners = {first + k: name for k, name in kernel_lines.items()}
        return "\n".join(header + ["", "", "def call(args):"] + ["    " + line for line in body]) + "\n"


def kernel_entry(kernel: Any) -> Callable[..., Any]:
    """What a wrapper calls for one entry of its ``kernels``: a
    :class:`~tilewright.compiler.dispatch.KernelCall`'s :meth:`entry`, else the invoker an
    object carries as ``_invoke``, else the object itself (a plain function)."""
    entry = getattr(kernel, "entry", None)
    return entry() if entry is not None else getattr(kernel, "_invoke", kernel)


def load_wrapper(source: str, kernels: dict[str, Callable], consts: list[Any],
                 filename: str | None = None) -> Callable[[list], Any]:
    """Execute wrapper source; returns its ``call`` marked as a boxed function for aot_autograd."""
    filename = filename or f"<tilewright-wrapper-{next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {"kernels": kernels, "consts": consts, "_entry": kernel_entry,
                                 "__name__": "tilewright_wrapper"}
    exec(compile(source, filename, "exec"), namespace)
    call = namespace["call"]
    call._boxed_call = True
    return call
