"""Containing a failure to the kernel that failed: what the pipeline and the run-time calls do
when one kernel cannot be lowered, fused, chosen, rendered, compiled or launched.

A failure of one kernel costs that kernel only: at compile time its op runs on ATen (or its
fused group is split, see :mod:`tilewright.kinds.loop.fusion.schedule`), at run time the kernel's size
bucket switches to its ATen form for that call and the later calls of that bucket, while every
other kernel and bucket keeps its generated code. Each contained failure warns once (one line;
the traceback goes to the ``tilewright.compiler`` log) and is recorded as a
:class:`KernelFallback` in the report of the graph it happened in
(``GraphReport.kernel_fallbacks``), so ``tilewright.launch_report`` shows it. With
``config.strict`` set, the failure is raised instead.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Iterator

from tilewright._config import config

log = logging.getLogger("tilewright.compiler")

STAGES = ("lower", "fuse", "select", "render", "compile", "wrap", "launch", "run")
"""Where a kernel can fail: the pipeline's stages at compile time (``wrap``: building its call
object or its line of the wrapper); ``launch`` its first call at the compiled sizes, ``run`` a
later call (a new size bucket tuned or launched)."""


@dataclass
class KernelFallback:
    """One contained failure: ``kernel`` (the wrapper's kernel name, or the FX node's name for a
    ``lower``/``fuse`` failure), the ``stage`` it failed at, the ``bucket`` (size name -> bucket
    size) it costs at run time (None: every bucket), ``error`` (``Type: first line``) and
    ``runs`` (what runs instead)."""

    kernel: str
    stage: str
    error: str
    bucket: dict[str, int] | None = None
    runs: str = "ATen"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        where = "" if not self.bucket else " at " + ",".join(f"{k}={v}" for k, v in self.bucket.items())
        return f"{self.kernel}{where} on {self.runs} ({self.stage}: {self.error})"


class RerunGraph(Exception):
    """Raised by a kernel that failed after it may have written part of its in-place output
    (a scatter into its target): the compiled graph's call is rerun from its inputs, the
    kernel's bucket now on ATen (:func:`tilewright.compiler.backend._run_or_fall_back`)."""


class LoopBuildFailure(Exception):
    """A loop kernel of one loop node could not be built: the pipeline lowers again with the
    FX nodes ``fx_names`` left to ATen (:func:`tilewright.compiler.pipeline.fuse`)."""

    def __init__(self, fx_names: set[str], error: BaseException):
        super().__init__(f"{', '.join(sorted(fx_names))}: {first_line(error)}")
        self.fx_names = set(fx_names)
        self.error = error


_state = threading.local()


@contextlib.contextmanager
def recording(sink: list) -> Iterator[None]:
    """Record the failures contained inside the block (this thread) into ``sink``."""
    prev = getattr(_state, "sink", None)
    _state.sink = sink
    try:
        yield
    finally:
        _state.sink = prev


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return f"{type(e).__name__}: {text.splitlines()[0] if text else '-'}"


def contain(error: BaseException, kernel: str, stage: str, what: str, *, sink: list | None = None,
            bucket: dict[str, int] | None = None, runs: str = "ATen") -> KernelFallback:
    """Record that ``kernel`` failed at ``stage`` (``what`` says what it did, for the warning)
    and runs on ``runs`` instead; raises ``error`` under ``config.strict``. ``sink`` (default:
    the :func:`recording` block's) gets the :class:`KernelFallback`."""
    if config.strict:
        raise error
    fb = KernelFallback(kernel, stage, first_line(error), dict(bucket) if bucket else None, runs)
    target = sink if sink is not None else getattr(_state, "sink", None)
    if target is not None:
        target.append(fb)
    msg = f"tilewright: {what} for {kernel} failed ({fb.error}); that kernel runs on {runs}" + (
        "" if not bucket else " for sizes in " + ",".join(f"{k}={v}" for k, v in bucket.items()))
    warnings.warn(msg, RuntimeWarning, stacklevel=3)  # one line; the traceback only in the log
    log.info("%s", msg, exc_info=error)
    return fb


class NoOpsFallback(Exception):
    """A fused kernel's FX nodes cannot be run on their own (a value they read is not one of
    the kernel's inputs or size symbols)."""


def fx_ops_launcher(f: Any, gm: Any) -> Any:
    """The last resort of a loop kernel (:class:`~tilewright.compiler.graph.FusedNode` ``f`` of
    graph ``gm``) whose own ATen form failed too: its FX nodes, the ATen ops the graph had
    before fusion, run as they are. Called like the kernel's launcher: ``launch(*inputs,
    *sizes, outs=None)`` -> a tuple of its outputs (written into ``outs``' non-None entries,
    the scatter targets, when given).

    Raises:
        NoOpsFallback: the nodes read a value that is neither an input of the kernel nor one of
            its size symbols.
    """
    import torch
    import torch.fx as fx

    from tilewright.compiler.graph import to_sympy

    by_name = {n.name: n for n in gm.graph.nodes}
    args = list(f.args)
    symbols = list(f.symbols)
    needed: set[str] = set()
    sym_inputs: dict[str, int] = {}  # a SymInt placeholder -> its index among the sizes
    stack = list(f.outputs)
    while stack:
        v = stack.pop()
        if v in needed or v in args or v in sym_inputs:
            continue
        node = by_name.get(v)
        if node is None:
            raise NoOpsFallback(f"{v} is no node of the graph")
        if node.op == "placeholder":
            val = node.meta.get("val")
            expr = to_sympy(val) if isinstance(val, torch.SymInt) else None
            if expr is None or expr not in symbols:
                raise NoOpsFallback(f"{v} is an input of the graph the kernel does not take")
            sym_inputs[v] = symbols.index(expr)
            continue
        if node.op not in ("call_function", "get_attr"):
            raise NoOpsFallback(f"{v} is a {node.op} node")
        needed.add(v)
        stack.extend(n.name for n in node.all_input_nodes)
    graph = fx.Graph()
    env: dict[Any, Any] = {}
    for name in args:
        env[by_name[name]] = graph.placeholder(f"in_{name}")
    sizes = [graph.placeholder(f"size_{k}") for k in range(len(symbols))]
    for name, k in sym_inputs.items():
        env[by_name[name]] = sizes[k]
    for node in gm.graph.nodes:
        if node.name in needed:
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(tuple(env[by_name[o]] for o in f.outputs))
    module = fx.GraphModule(gm, graph)
    n_in = len(args)

    def launch(*call_args: Any, outs: Any = None) -> tuple:
        res = module(*call_args[:n_in], *(int(s) for s in call_args[n_in:n_in + len(symbols)]))
        if outs is not None:
            res = tuple(o.copy_(r) if o is not None else r for o, r in zip(outs, res))
        return tuple(res)
    launch.broadcasts = False  # type: ignore[attr-defined]
    return launch


def unlower(kg: Any, node: Any) -> list[Any]:
    """Replace kernel ``node`` of kernel graph ``kg`` (in place) by the FX nodes that compute its
    outputs, each an ATen call (:class:`~tilewright.compiler.graph.ExternNode`): the FX nodes
    between the values available before it (the graph's inputs, what earlier nodes produce) and
    its outputs, in graph order. What a kernel whose wrapper call could not be built runs
    instead; returns the new nodes."""
    from tilewright.compiler.graph import ExternNode, produced

    at = kg.nodes.index(node)
    graph = node.fx_nodes[0].graph
    by_name = {n.name: n for n in graph.nodes}
    available = {p.name for p in kg.placeholders}
    for n in kg.nodes[:at]:
        available.update(produced(n))
    needed: dict[str, Any] = {}
    stack = [by_name[v] for v in produced(node)]
    while stack:
        fx_node = stack.pop()
        if fx_node.name in available or fx_node.name in needed or fx_node.op == "placeholder":
            continue
        if fx_node.op not in ("call_function", "get_attr"):
            raise NoOpsFallback(f"{fx_node.name} is a {fx_node.op} node")
        needed[fx_node.name] = fx_node
        stack.extend(fx_node.all_input_nodes)
    position = {n: i for i, n in enumerate(graph.nodes)}
    externs = [ExternNode(f.name, [f]) for f in sorted(needed.values(), key=position.__getitem__)]
    kg.nodes[at:at + 1] = externs
    return externs
