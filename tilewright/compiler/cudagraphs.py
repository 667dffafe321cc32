"""CUDA graphs for tilewright's compiled graphs, through PyTorch's own CUDA-graph trees.

``torch.compile(m, backend="tilewright", mode="reduce-overhead")`` (or ``options={"cudagraphs":
True}``, or ``tilewright.config.cudagraphs`` / ``TILEWRIGHT_CUDAGRAPHS=1``) runs each graph
tilewright compiled under ``torch._inductor.cudagraph_trees``, as PyTorch's ``cudagraphs``
backend runs aot_autograd's graphs: the first call of a graph runs as it is (warm-up: kernels
tuned, built and loaded), the next records a CUDA graph, and later calls replay it. Nothing here
captures or replays by itself; the trees own the memory pool, the static input copies, the
re-recording when a static input moves, and the forward/backward generations.

* **Static inputs**: the parameters and buffers (and tensors marked with
  ``torch._dynamo.mark_static_address``, a static KV cache) are read in place, not copied into
  the graph's own input buffers: aot_autograd's ``static_input_indices``, as Inductor uses them.
* **Refusals**: a graph that cannot be captured runs uncaptured, which costs that graph only:
  CPU tensors or several devices in the graph, an in-place write to an input that is not static
  (aot_autograd moves ordinary input mutations out of the graph, so this concerns graphs that
  keep one), symbolic sizes with no capture sizes named (``options={"cudagraph_sizes": [...]}``:
  one graph per size otherwise, re-recorded as a KV cache grows), an op that cannot be captured
  (data-dependent sizes, ops PyTorch tags unsafe). Each refusal is one ``UserWarning`` naming the
  graph and the reason, a line in the ``tilewright.compiler`` log, one on PyTorch's
  ``counters["inductor"]["cudagraph_skips"]`` (``torch._inductor.config.triton.cudagraph_or_error``
  makes it an error, as for Inductor), and the graph report's ``cudagraphs`` entry
  (``tilewright.launch_report`` prints it).
* **Replays** are counted per graph in ``GraphReport.cudagraphs``: ``calls``, ``warmups`` and
  ``recordings`` (the calls that ran the compiled graph itself, outside and inside a capture),
  ``replays`` (calls that replayed a recorded graph), ``uncaptured`` (calls at a size not named,
  the first few of those sizes in ``uncaptured_sizes``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Sequence

import torch
import torch.fx as fx

from tilewright._config import config
from tilewright.compiler.report import GraphReport, collect_reports
from tilewright.errors import ConfigError

log = logging.getLogger("tilewright.compiler")

CAPTURING_MODES = ("reduce-overhead", "max-autotune")
"""``torch.compile`` modes that turn CUDA graphs on (as they do for Inductor)."""
PLAIN_MODES = ("default", "max-autotune-no-cudagraphs")
OPTIONS = ("cudagraphs", "triton.cudagraphs", "cudagraph_sizes")
"""The ``options`` keys the backend reads (``triton.cudagraphs`` is Inductor's spelling)."""


def requested(mode: str | None, options: dict[str, Any] | None) -> tuple[bool, tuple | None]:
    """(whether CUDA graphs are on, the capture sizes or None) from ``torch.compile``'s
    ``mode`` and ``options`` as a custom backend receives them (``torch.compile`` passes both to
    the backend as keyword arguments when they are set) and ``config.cudagraphs``.

    ``options["cudagraphs"]`` (or ``"triton.cudagraphs"``), when given, wins over the mode and
    the setting. ``options["cudagraph_sizes"]``: the sizes a graph with symbolic sizes is
    captured at, each an int (a graph with one symbolic size) or a tuple (its symbolic sizes in
    the order of the graph's inputs); other sizes run uncaptured.

    Raises:
        ConfigError: a mode other than PyTorch's four, an unknown option, or sizes that are not
            ints or tuples of ints.
    """
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ConfigError(f"torch.compile(backend='tilewright') got options {unknown} it does not read; "
                          f"it reads {list(OPTIONS)} (other settings: tilewright.config)")
    if mode is not None and mode not in CAPTURING_MODES + PLAIN_MODES:
        raise ConfigError(f"torch.compile(backend='tilewright', mode={mode!r}): choose one of "
                          f"{list(PLAIN_MODES + CAPTURING_MODES)}")
    on = bool(config.cudagraphs) or mode in CAPTURING_MODES
    for key in ("cudagraphs", "triton.cudagraphs"):
        if key in options:
            on = bool(options[key])
    return on, _sizes(options.get("cudagraph_sizes"))


def _sizes(sizes: Any) -> tuple | None:
    if sizes is None:
        return None
    try:
        keys = tuple((s,) if isinstance(s, int) else tuple(s) for s in sizes)
    except TypeError:
        keys = ()
    if not keys or not all(isinstance(v, int) and not isinstance(v, bool) for k in keys for v in k):
        raise ConfigError(f"options['cudagraph_sizes']={sizes!r}: give a list of sizes, each an int "
                          "or a tuple of ints (one per symbolic size of the graph), e.g. [128, 256]")
    return keys


# -- why a graph is not captured ------------------------------------------------------------------
def _val(node: fx.Node) -> Any:
    return node.meta.get("val", node.meta.get("fake_result"))


def input_mutations(gm: fx.GraphModule) -> set[int]:
    """Indices of the graph's inputs that an op of the graph writes in place (by the op's
    schema; an input aliased by another input counts for both)."""
    from torch._dynamo.backends.cudagraphs import find_input_mutations

    return set(find_input_mutations(gm.graph))


def _symbolic(x: Any) -> bool:
    if isinstance(x, torch.SymInt):
        return True
    return isinstance(x, torch.Tensor) and any(not isinstance(s, int) for s in x.shape)


def refusal(gm: fx.GraphModule, example_inputs: Sequence[Any], static: Sequence[int],
            sizes: tuple | None) -> str | None:
    """Why ``gm`` (an aot_autograd graph) cannot run under CUDA graphs, or None.

    ``static``: the indices of inputs whose address is fixed (parameters, buffers); an in-place
    write to one of those is captured, one to any other input is a refusal."""
    from torch._dynamo.backends.cudagraphs import get_device_node_mapping
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    devices = {d for d in get_device_node_mapping(gm) if d.type != "meta"}
    devices |= {x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type != "meta"}
    cpu = sorted(n.name for n in gm.graph.nodes
                 if isinstance(_val(n), torch.Tensor) and _val(n).device.type == "cpu")
    if any(d.type == "cpu" for d in devices):
        where = f" ({', '.join(cpu[:3])}{', ...' if len(cpu) > 3 else ''})" if cpu else ""
        return f"CPU tensors{where}: CUDA graphs capture CUDA work only"
    if len(devices) != 1 or next(iter(devices)).type != "cuda":
        return f"devices {sorted(map(str, devices))}: CUDA graphs need every tensor on one CUDA device"
    mutated = sorted(input_mutations(gm) - set(static))
    if mutated:
        names = [n.name for n in gm.graph.find_nodes(op="placeholder")]
        return (f"input mutation: the graph writes in place to input(s) "
                f"{[names[i] for i in mutated if i < len(names)]}, which are not parameters, buffers "
                "or static addresses (torch._dynamo.mark_static_address)")
    if sizes is None and any(_symbolic(x) for x in example_inputs):
        n = sum(isinstance(x, torch.SymInt) for x in example_inputs)
        return (f"dynamic sizes without buckets: a graph with symbolic sizes ({n} size input(s)) would "
                "record one CUDA graph per size; name the sizes to capture (options={'cudagraph_sizes': "
                "[...]}, an int or a tuple of that many ints each) or compile with dynamic=False")
    if sizes is not None and not any(isinstance(x, torch.SymInt) for x in example_inputs) \
            and any(_symbolic(x) for x in example_inputs):
        return "dynamic sizes that are not graph inputs: the capture sizes cannot be matched"
    node = get_first_incompatible_cudagraph_node(gm)
    if node is not None:
        return f"an op that cannot be captured ({node.name}: {node.target})"
    return None


def _refuse(reports: list[GraphReport], kind: str, reason: str) -> None:
    for r in reports:
        r.cudagraphs = {"status": "refused", "reason": reason}
    msg = f"tilewright: the {kind} graph runs without CUDA graphs: {reason}"
    # PyTorch's skip counter and its cudagraph_or_error setting see it as they see Inductor's
    # skips (its own logging helper would print the reason a second time)
    from torch._dynamo.utils import counters

    counters["inductor"]["cudagraph_skips"] += 1
    if getattr(torch._inductor.config.triton, "cudagraph_or_error", False):
        raise RuntimeError(msg)
    warnings.warn(msg, UserWarning, stacklevel=3)
    log.info(msg)


# -- wrapping -------------------------------------------------------------------------------------
def static_input_indices(fixed: int) -> list[int]:
    """The inputs of the forward graph being compiled whose address is fixed: aot_autograd's
    ``static_input_indices`` (parameters, buffers and static addresses, as Inductor takes them)
    where the tracing context has them, else the first ``fixed`` (the lifted parameters)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    found = getattr(meta, "static_input_indices", None)
    return list(found) if found is not None else list(range(fixed))


def _int_key(args: Sequence[Any]) -> tuple:
    return tuple(v for v in args if isinstance(v, int) and not isinstance(v, bool))


def _device_index(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> int:
    from torch._dynamo.backends.cudagraphs import get_device_node_mapping

    devices = [d for d in get_device_node_mapping(gm) if d.type == "cuda"]
    devices += [x.device for x in example_inputs if isinstance(x, torch.Tensor) and x.device.type == "cuda"]
    index = devices[0].index if devices else None
    return torch.cuda.current_device() if index is None else index


def under_trees(compiled: Callable, gm: fx.GraphModule, example_inputs: Sequence[Any], static: Sequence[int],
                reports: list[GraphReport], *, device_index: int, is_backward: bool, is_inference: bool,
                sizes: tuple | None) -> Callable:
    """``compiled`` (a boxed compiled graph) run through ``cudagraphify_impl``, made at the
    first call from that call's inputs (the ints among them key one recording per size, as
    Inductor's lazy cudagraphify does), with the call counts in each report's ``cudagraphs``."""
    from torch._inductor.cudagraph_trees import cudagraphify_impl
    from torch._dynamo.backends.cudagraphs import get_stack_traces
    from torch._inductor.cudagraph_utils import get_placeholder_info

    stats: dict[str, Any] = {"status": "on", "static_inputs": len(static), "calls": 0, "warmups": 0,
                             "recordings": 0, "replays": 0, "uncaptured": 0}
    if sizes is not None:
        stats["sizes"] = [list(k) for k in sizes]
        stats["uncaptured_sizes"] = []
    for r in reports:
        r.cudagraphs = stats
    mutated = tuple(sorted(input_mutations(gm)))
    traces, placeholders = get_stack_traces(gm), get_placeholder_info(gm.graph)
    trees: list[Callable] = []
    # a graph with symbolic sizes is captured at the named sizes only
    dynamic = sizes is not None and any(_symbolic(x) for x in example_inputs)

    def counted(args: list) -> Any:
        # the trees call the graph itself only to warm up and to record: a replay does not
        stats["recordings" if torch.cuda.is_current_stream_capturing() else "warmups"] += 1
        return compiled(args)

    counted._boxed_call = True  # type: ignore[attr-defined]

    def call(args: list) -> Any:
        stats["calls"] += 1
        if dynamic and (key := _int_key(args)) not in sizes:
            stats["uncaptured"] += 1
            if len(stats["uncaptured_sizes"]) < 8 and list(key) not in stats["uncaptured_sizes"]:
                stats["uncaptured_sizes"].append(list(key))  # what to name, for the user
            return compiled(args)
        if not trees:
            trees.append(cudagraphify_impl(counted, args, static, device_index=device_index,
                                           is_backward=is_backward, is_inference=is_inference,
                                           stack_traces=traces, placeholders=placeholders,
                                           mutated_input_idxs=mutated))
        ran = stats["warmups"] + stats["recordings"]
        out = trees[0](args)
        if stats["warmups"] + stats["recordings"] == ran:
            stats["replays"] += 1
        return out

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


class GraphCudagraphs:
    """CUDA graphs for the graphs aot_autograd makes of one Dynamo graph: wraps the backend's
    forward, backward and inference compilers. A forward refused leaves its backward
    uncaptured too (the trees pair them); a backward refused after its forward was captured
    tells the trees it runs (so the forward's generation ends), as PyTorch's backend does."""

    def __init__(self, dynamo_inputs: int, sizes: tuple | None):
        self.dynamo_inputs = dynamo_inputs
        self.sizes = sizes
        self.forward_on = True
        self.device_index: int | None = None

    def _compile(self, inner: Callable, gm: fx.GraphModule, example_inputs: list[Any]) -> tuple[Callable, list]:
        with collect_reports() as reports:
            compiled = inner(gm, example_inputs)
        return compiled, list(reports)

    def forward(self, inner: Callable, kind: str) -> Callable:
        """The forward (or inference, ``kind``) compiler: ``inner`` (tilewright's) wrapped."""
        def compile_forward(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
            from torch._inductor.utils import num_fw_fixed_arguments

            compiled, reports = self._compile(inner, gm, example_inputs)
            static = static_input_indices(num_fw_fixed_arguments(self.dynamo_inputs, len(example_inputs)))
            reason = refusal(gm, example_inputs, static, self.sizes)
            if reason is not None:
                self.forward_on = False
                _refuse(reports, kind, reason)
                return compiled
            self.device_index = _device_index(gm, example_inputs)
            return under_trees(compiled, gm, example_inputs, static, reports, device_index=self.device_index,
                               is_backward=False, is_inference=kind == "inference", sizes=self.sizes)
        return compile_forward

    def backward(self, inner: Callable) -> Callable:
        """The backward compiler: ``inner`` wrapped."""
        def compile_backward(gm: fx.GraphModule, example_inputs: list[Any]) -> Callable:
            from torch._inductor.utils import count_tangents

            compiled, reports = self._compile(inner, gm, example_inputs)
            if not self.forward_on:
                for r in reports:
                    r.cudagraphs = {"status": "refused", "reason": "its forward graph runs without CUDA graphs"}
                return compiled
            static = list(range(count_tangents(gm)))
            reason = refusal(gm, example_inputs, static, self.sizes)
            if reason is None:
                return under_trees(compiled, gm, example_inputs, static, reports,
                                   device_index=_device_index(gm, example_inputs), is_backward=True,
                                   is_inference=False, sizes=self.sizes)
            _refuse(reports, "backward", reason)
            index = self.device_index or 0

            def run_backward(args: list) -> Any:
                from torch._inductor.cudagraph_trees import get_manager

                manager = get_manager(index, create_if_none_exists=False)
                if manager is not None:
                    manager.set_to_running_backward()
                return compiled(args)

            run_backward._boxed_call = True  # type: ignore[attr-defined]
            return run_backward
        return compile_backward


def reset() -> None:
    """Drop every recorded CUDA graph: ``torch._dynamo.reset()`` calls this (the backend's
    ``reset``, as it calls Inductor's), so graphs of code Dynamo forgot do not hold their pool."""
    import sys

    if "torch._inductor.cudagraph_trees" in sys.modules:  # no trees were ever made otherwise
        sys.modules["torch._inductor.cudagraph_trees"].reset_cudagraph_trees()
