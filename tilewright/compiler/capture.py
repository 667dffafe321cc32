"""Capture a model's kernel problems without running any kernel: for ahead-of-time builds
(``tilewright aot``) and cache warming (``tilewright warm``).

The model is traced exactly as ``torch.compile(backend="tilewright")`` would (Dynamo, then
aot_autograd with tilewright's decomposition table), then lowered and fused by the pipeline's
own stages (:func:`tilewright.compiler.pipeline.fuse`); then each registered problem kind
(:mod:`tilewright.kinds`, its ``capture`` hook) names its kernels in the graph with their
problems: every GEMM node a :class:`~tilewright.kinds.gemm.problem.GemmProblem` at its trace-time sizes,
every grouped GEMM its :class:`~tilewright.kinds.grouped_gemm.problem.GroupedGemmProblem` (the ragged total
bucketed, as the compiled model tunes it), every loop kernel (pointwise, reduction) its
:class:`~tilewright.problem.LoopProblem`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from tilewright._moved import moved_names
from tilewright.compiler.decompositions import decomposition_table
from tilewright.compiler.lower import lower
from tilewright.errors import InvalidInputError
from tilewright.kinds import kinds
from tilewright.runtime.targets import Target


@dataclass
class ModelSpec:
    """A model and the inputs to trace it with."""

    model: Any
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    name: str = ""
    # positional input -> its dims that are dynamic (from an exported program's symbolic shapes)
    dynamic: dict[int, list[int]] = field(default_factory=dict)


def load_model(spec: str) -> ModelSpec:
    """Resolve ``package.module:callable`` or a ``torch.export`` ``.pt2`` file.

    The callable takes no arguments and returns ``(model, args)``, ``(model, args, kwargs)``
    or ``(model, kwargs_dict)``.

    Raises:
        InvalidInputError: the spec does not name a callable or a file, or returns something else.
    """
    if spec.endswith(".pt2"):
        path = Path(spec)
        if not path.is_file():
            raise InvalidInputError(f"no exported program at {spec}")
        try:
            ep = torch.export.load(str(path))
        except Exception as e:  # noqa: BLE001 - torch raises zip, pickle and runtime errors here
            raise InvalidInputError(f"{spec} is not a loadable torch.export program ({type(e).__name__}: {e})") from e
        args, kwargs = ep.example_inputs if ep.example_inputs is not None else ((), {})
        return ModelSpec(ep.module(), tuple(args), dict(kwargs), path.stem, _exported_dynamic_dims(ep))
    if ":" not in spec:
        raise InvalidInputError(
            f"model {spec!r}: give 'package.module:callable' (returning (model, example_inputs)) "
            "or a torch.export .pt2 file")
    mod_name, attr = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise InvalidInputError(f"model {spec!r}: cannot import {attr!r} from {mod_name!r} ({e})") from e
    if not callable(fn):
        raise InvalidInputError(f"model {spec!r}: {attr} is a {type(fn).__name__}, not a callable")
    try:
        got = fn()
    except Exception as e:  # noqa: BLE001 - the user's factory failed: say so, with its error
        raise InvalidInputError(f"model {spec!r}: calling {attr}() failed: {type(e).__name__}: {e}") from e
    if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], dict):
        return ModelSpec(got[0], (), got[1], spec)
    if isinstance(got, tuple) and len(got) in (2, 3):
        args = got[1] if isinstance(got[1], tuple) else (got[1],)
        return ModelSpec(got[0], args, got[2] if len(got) == 3 else {}, spec)
    raise InvalidInputError(f"model {spec!r} returned {type(got).__name__}; expected (model, example_inputs)")


def _exported_dynamic_dims(ep: Any) -> dict[int, list[int]]:
    """Which dims of each positional user input the exported program keeps symbolic."""
    user_inputs = [n for n in ep.graph.nodes if n.op == "placeholder"
                   and n.name in set(ep.graph_signature.user_inputs)]
    out: dict[int, list[int]] = {}
    for i, node in enumerate(user_inputs):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            dims = [d for d, size in enumerate(val.shape) if isinstance(size, torch.SymInt)]
            if dims:
                out[i] = dims
    return out


def aten_graphs(spec: ModelSpec, *, train: bool = False) -> dict[str, fx.GraphModule]:
    """The ATen graphs the backend would compile: "inference", or "forward" and "backward"."""
    graphs: dict[str, fx.GraphModule] = {}

    def keep(kind: str):
        def compiler(gm: fx.GraphModule, example_inputs: list) -> Any:
            graphs[f"{kind}{'' if kind not in graphs else len(graphs)}"] = gm
            return make_boxed_func(runs_or_stands_in(gm))
        return compiler

    from tilewright.compiler.backend import partition_options, rewrite_dynamo_graph

    traced = aot_autograd(fw_compiler=keep("forward"), bw_compiler=keep("backward"),
                          inference_compiler=keep("inference"), decompositions=decomposition_table(),
                          **partition_options())

    def backend(gm: fx.GraphModule, example_inputs: list) -> Any:
        rewrite_dynamo_graph(gm)  # as the backend does
        return traced(gm, example_inputs)

    torch._dynamo.reset()
    for i, dims in spec.dynamic.items():  # keep an export's symbolic sizes symbolic
        torch._dynamo.mark_dynamic(spec.args[i], dims)
    compiled = torch.compile(spec.model, backend=backend)
    if train:
        out = compiled(*spec.args, **spec.kwargs)
        loss = getattr(out, "loss", None)
        if loss is None:
            leaves = [t for t in pytree.tree_leaves(out)
                      if isinstance(t, torch.Tensor) and t.requires_grad]
            if not leaves:
                raise InvalidInputError("train=True but the model's outputs need no gradient")
            loss = sum(t.float().sum() for t in leaves)
        loss.backward()
    else:
        with torch.no_grad():
            compiled(*spec.args, **spec.kwargs)
    return graphs


def _concrete(x: Any) -> Any:
    """A traced size as an int (a symbolic one at its trace-time hint)."""
    if isinstance(x, torch.SymInt):
        return x.node.hint if x.node.hint is not None else 1
    return x


def stand_in_outputs(gm: fx.GraphModule) -> list:
    """Zero tensors shaped, strided and typed as the graph's traced (fake) outputs: what its
    call returns when the graph cannot run on this host."""
    out = next(n for n in gm.graph.nodes if n.op == "output")

    def make(node: Any) -> Any:
        val = node.meta.get("val") if isinstance(node, fx.Node) else node
        if isinstance(val, torch.Tensor):
            shape = [_concrete(s) for s in val.shape]
            stride = [_concrete(s) for s in val.stride()]
            return torch.empty_strided(shape, stride, dtype=val.dtype, device="cpu").zero_()
        return _concrete(val)
    return [make(n) for n in pytree.tree_leaves(out.args[0])]


def runs_or_stands_in(gm: fx.GraphModule):
    """``gm``'s forward, run eagerly when this host can; when it cannot (an op with no kernel
    here, such as a block-scaled ``F.scaled_mm`` on a CPU: "CPU does not support swizzle"), the
    call returns :func:`stand_in_outputs`: only the traced graph matters to a capture, and
    Dynamo and aot_autograd traced it with fake tensors, so building for chips this host lacks
    never needs their ops to run here."""
    def run(*args: Any) -> Any:
        try:
            return gm.forward(*args)
        except Exception as e:  # noqa: BLE001 - any op this host cannot run: the trace is what counts
            import logging

            logging.getLogger("tilewright.compiler").info(
                "capture: the traced graph does not run on this host (%s: %s); its outputs are "
                "stood in by zeros of the traced shapes", type(e).__name__, e)
            return stand_in_outputs(gm)
    return run


@dataclass
class CapturedKernel:
    """One kernel problem (of any registered kind) and where it occurs (graph kind and node
    names)."""

    problem: Any
    uses: list[str] = field(default_factory=list)
    # launched right before or after another generated kernel somewhere (a PDL edge's end:
    # tilewright.compiler.pdl.chained), so ahead-of-time builds give it PDL where they can
    chained: bool = False


_COMPILED_STAND_IN = "cuda:sm_90a"  # a compiled target: only its policies' fusion answers are read


def capture_kernels(spec: ModelSpec, *, train: bool = False, target: Target | None = None) -> list[CapturedKernel]:
    """Distinct kernel problems of the model, kind by kind in registration order (GEMMs, grouped
    GEMMs, loop kernels, ...), each in first-seen order, with their uses. ``target``: the target
    the kernels are for, whose policies decide the fusion: a model captured on the host is
    mostly built for GPUs (``tilewright aot``), whose GEMMs take the epilogues a CPU GEMM leaves
    to the loop kernels (:meth:`~tilewright.kinds.gemm.policy.GemmPolicy.fuses_epilogues`), so
    None fuses as for a compiled GPU target; ``tilewright warm``/``explain`` pass the target
    they tune for, so a CPU's problems are those its compiled models look up."""
    from tilewright.compiler.pdl import chained
    from tilewright.compiler.pipeline import fuse, fusing_for  # the pipeline imports this module
    from tilewright.runtime.targets import get_target

    registered = kinds()
    found: list[dict[Any, CapturedKernel]] = [{} for _ in registered]
    for graph, gm in aten_graphs(spec, train=train).items():
        kg = lower(gm)
        with fusing_for(target or get_target(_COMPILED_STAND_IN)):
            fuse(kg, gm)
        links = chained(kg)
        for kind, seen in zip(registered, found):
            for name, p in kind.capture(kg):
                c = seen.setdefault(kind.capture_key(p), CapturedKernel(p))
                c.uses.append(f"{graph}.{name}")
                c.chained |= name in links
    return [c for seen in found for c in seen.values()]


# the GEMM kind's names that lived here (kept for one release, with a DeprecationWarning)
_MOVED = {"capture_gemms": "tilewright.kinds.gemm.capture", "gemm_problem": "tilewright.kinds.gemm.kind"}


__getattr__ = moved_names(__name__, _MOVED)
