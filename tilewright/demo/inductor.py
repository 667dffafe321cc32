"""Inductor's launches per call for the same model, measured in the same process.

The demo compiles each model a second time with ``torch.compile(backend="inductor")`` through a
backend that wraps Inductor's ``compile_fx_inner``, so every graph Inductor compiles (forward,
backward, inference) is seen with the source of its generated wrapper. Launches are counted from
that wrapper's ``call`` function: each call of a generated kernel (C++ ``cpp_fused_*`` on a CPU,
``triton_*.run`` on a GPU) and each call of an extern kernel or ATen op. This counts what runs
per call, which ``torch._inductor.metrics.generated_kernel_count`` does not on a CPU (it counts
loop nests, several per C++ kernel). Inductor's caches are bypassed so every graph is compiled.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

# a statement that launches work: a generated kernel, an extern kernel or an ATen/custom op
_KERNEL = re.compile(r"^\s*(?:\w+\s*=\s*)?(cpp_fused_\w+|triton_\w+\.run|\w+_kernel\w*\.run)\(")
_EXTERN = re.compile(r"^\s*(?:[\w, ]+\s*=\s*)?(extern_kernels\.\w+|aten\.\w+(?:\.\w+)?|torch\.ops\.\w+\.\w+(?:\.\w+)?)\(")


@dataclass
class InductorGraph:
    """One graph Inductor compiled: its generated kernels and extern/ATen calls per call."""

    kind: str
    kernels: int
    externs: int

    @property
    def launches(self) -> int:
        return self.kernels + self.externs


def count_launches(source: str) -> tuple[int, int]:
    """(generated kernel calls, extern/ATen calls) in the ``call`` function of an Inductor
    wrapper module's source."""
    start = source.find("def call(")
    if start < 0:
        return 0, 0
    kernels = externs = 0
    for line in source[start:].splitlines()[1:]:
        if line and not line[0].isspace():
            break  # the end of call()
        if _KERNEL.match(line):
            kernels += 1
        elif _EXTERN.match(line):
            externs += 1
    return kernels, externs


@contextlib.contextmanager
def inductor_counting() -> Iterator[tuple[Callable[..., Any], list[InductorGraph]]]:
    """A ``torch.compile`` backend that is Inductor plus the list it fills with one
    :class:`InductorGraph` per compiled graph."""
    from torch._inductor import compile_fx

    graphs: list[InductorGraph] = []

    def inner(gm, example_inputs, **kwargs):
        out = compile_fx.compile_fx_inner(gm, example_inputs, **kwargs)
        kind = "backward" if kwargs.get("is_backward") else (
            "inference" if kwargs.get("is_inference") else "forward")
        kernels, externs = count_launches(getattr(out, "source_code", "") or "")
        graphs.append(InductorGraph(kind, kernels, externs))
        return out

    def backend(gm, example_inputs):
        return compile_fx.compile_fx(gm, example_inputs, inner_compile=inner)

    with torch._inductor.config.patch(fx_graph_cache=False), \
            torch._functorch.config.patch(enable_autograd_cache=False):
        yield backend, graphs
