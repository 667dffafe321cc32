"""The ``torch.compile`` backend: ``torch.compile(model, backend="tilewright")``.

Registered through the ``torch_dynamo_backends`` entry point, so installing the package is enough.
Dynamo's graph goes through aot_autograd with tilewright's decomposition table, which produces
ATen forward and backward graphs (or one inference graph under ``no_grad``); each is compiled by
:func:`tilewright.compiler.pipeline.compile_graph`. A graph tilewright fails to compile runs
unchanged on ATen, with a warning, unless ``config.strict`` is set.
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


def _compile_or_fallback(gm: fx.GraphModule, example_inputs: list[Any], *, kind: str) -> Callable:
    try:
        return compile_graph(gm, example_inputs, kind)
    except Exception as e:
        if config.strict:
            raise
        msg = f"tilewright could not compile a {kind} graph ({type(e).__name__}: {e}); running it on ATen"
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.warning(msg, exc_info=True)
        publish(GraphReport(-1, kind, fallback=f"{type(e).__name__}: {e}"))
        return make_boxed_func(gm.forward)


def tilewright_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """Dynamo backend entry point (``backend="tilewright"``)."""
    backend = aot_autograd(
        fw_compiler=functools.partial(_compile_or_fallback, kind="forward"),
        bw_compiler=functools.partial(_compile_or_fallback, kind="backward"),
        inference_compiler=functools.partial(_compile_or_fallback, kind="inference"),
        decompositions=decomposition_table(),
    )
    return backend(gm, example_inputs, **kwargs)
