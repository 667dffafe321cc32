"""The GEMM problems a model will ask the autotuner about, found without tuning anything.

The model is captured exactly as ``torch.compile(model, backend="tilewright")`` captures it
(Dynamo, aot_autograd with tilewright's decomposition table, lowering and epilogue fusion), but
each graph then runs unchanged on ATen: nothing is selected, rendered or benchmarked. The
problems come out as the pipeline would build them (:func:`~tilewright.compiler.pipeline.gemm_problem`),
so their tuning-cache keys are the ones the compiled model will look up.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from tilewright._config import config
from tilewright.compiler.decompositions import decomposition_table
from tilewright.compiler.fuse import fuse_epilogues
from tilewright.compiler.lower import lower
from tilewright.errors import TilewrightError
from tilewright.problem import GemmProblem


class ModelSpecError(TilewrightError):
    """A ``module:callable`` model spec that cannot be loaded; the message says why."""


def load_model_spec(spec: str) -> tuple[torch.nn.Module, tuple]:
    """Call ``module:callable`` and return its ``(model, example_inputs)``.

    Raises:
        ModelSpecError: malformed spec, module or attribute missing, or a wrong return value.
    """
    if ":" not in spec:
        raise ModelSpecError(f"{spec!r} is not a model spec; write module:callable, e.g. "
                             f"tilewright.demo.models:llama_bf16_example")
    mod_name, attr = spec.split(":", 1)
    try:
        fn = getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError) as e:
        raise ModelSpecError(f"cannot load {spec}: {e}") from None
    out = fn() if callable(fn) else fn
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.nn.Module)):
        raise ModelSpecError(f"{spec} must return (model, example_inputs), got {type(out).__name__}")
    model, inputs = out
    return model, tuple(inputs) if isinstance(inputs, (list, tuple)) else (inputs,)


def collect_gemm_problems(model: Callable[..., Any], example_inputs: tuple, *,
                          train: bool = False) -> list[GemmProblem]:
    """The distinct GEMM problems of ``model`` on ``example_inputs``, in graph order.

    Args:
        model: a module or function, as it would be handed to ``torch.compile``.
        example_inputs: positional inputs for one call.
        train: also run backward (of the output's sum, or ``.loss``) to collect the backward
            graph's GEMMs; otherwise the model runs under ``no_grad`` (an inference graph).
    """
    from tilewright.compiler.pipeline import gemm_problem

    found: dict[GemmProblem, None] = {}

    def compiler(gm: torch.fx.GraphModule, _inputs: list[Any]) -> Callable:
        kg = lower(gm)
        if config.fuse_epilogues:
            fuse_epilogues(kg, gm)
        for g in kg.gemms:
            found.setdefault(gemm_problem(g), None)
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=compiler, bw_compiler=compiler,
                           inference_compiler=compiler, decompositions=decomposition_table())
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend)
    if train:
        out = compiled(*example_inputs)
        loss = out.loss if hasattr(out, "loss") and out.loss is not None else (
            out if isinstance(out, torch.Tensor) else out[0])
        loss.float().sum().backward()
    else:
        with torch.no_grad():
            compiled(*example_inputs)
    torch._dynamo.reset()
    return list(found)
