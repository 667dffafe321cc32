"""The ``torch.compile`` backend: ``torch.compile(model, backend="tilewright")``.

Registered through the ``torch_dynamo_backends`` entry point, so installing the package is enough.
Dynamo's graph goes through aot_autograd with tilewright's decomposition table, which produces
ATen forward and backward graphs (or one inference graph under ``no_grad``); each is compiled by
:func:`tilewright.compiler.pipeline.compile_graph`. A graph tilewright fails to compile runs
unchanged on ATen, with a warning; so does a compiled graph that fails when it runs. With
``config.strict`` set, both errors are raised instead.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from tilewright._config import config
from tilewright.compiler.decompositions import decomposition_table
from tilewright.compiler.pipeline import compile_graph
from tilewright.compiler.report import GraphReport, publish

log = logging.getLogger("tilewright.compiler")


def _run_or_fall_back(compiled: Callable, gm: fx.GraphModule, kind: str) -> Callable:
    """The compiled graph, guarded: if it raises at run time (a tilewright bug the compile-time
    checks missed), warn, switch this graph to ATen for good and rerun the call there, so the
    model still gets its answer. An error the graph itself raises (bad user input) raises
    again from ATen, unchanged. ``config.strict`` lets the first error through instead."""
    aten: list[Callable] = []

    def call(args: list) -> Any:
        if aten:
            return aten[0](args)
        saved = list(args)  # the compiled call clears its argument list
        try:
            return compiled(args)
        except Exception as e:
            if config.strict:
                raise
            msg = (f"a tilewright-compiled {kind} graph failed at run time ({type(e).__name__}: {e}); "
                   "running it on ATen from now on")
            warnings.warn(msg, RuntimeWarning, stacklevel=2)
            log.warning(msg, exc_info=True)
            aten.append(make_boxed_func(gm.forward))
            return aten[0](saved)

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def _compile_or_fallback(gm: fx.GraphModule, example_inputs: list[Any], *, kind: str) -> Callable:
    try:
        return _run_or_fall_back(compile_graph(gm, example_inputs, kind), gm, kind)
    except Exception as e:
        if config.strict:
            raise
        msg = f"tilewright could not compile a {kind} graph ({type(e).__name__}: {e}); running it on ATen"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.warning(msg, exc_info=True)
        publish(GraphReport(-1, kind, fallback=f"{type(e).__name__}: {e}"))
        return make_boxed_func(gm.forward)


def partition_options() -> dict[str, Any]:
    """aot_autograd's partitioning options for the backend's configuration (also used by
    :mod:`tilewright.compiler.capture`, so ahead-of-time builds see the same graphs)."""
    extra: dict[str, Any] = {}
    if config.loop_kernels:
        # Inductor's partitioner: the backward recomputes cheap pointwise values from what it
        # saves instead of having the forward store them; with fused loop kernels a recompute
        # costs no launch and saves a store and a load
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        extra["partition_fn"] = min_cut_rematerialization_partition
    return extra


def tilewright_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """Dynamo backend entry point (``backend="tilewright"``).

    Raises:
        ConfigError: a ``TILEWRIGHT_*`` environment variable has a bad value.
    """
    config.raise_env_error()
    extra = partition_options()
    backend = aot_autograd(
        fw_compiler=functools.partial(_compile_or_fallback, kind="forward"),
        bw_compiler=functools.partial(_compile_or_fallback, kind="backward"),
        inference_compiler=functools.partial(_compile_or_fallback, kind="inference"),
        decompositions=decomposition_table(),
        **extra,
    )
    return backend(gm, example_inputs, **kwargs)
