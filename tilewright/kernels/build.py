"""Render-and-load: turns an autotune candidate into a launcher, the glue between templates,
the runtime loader and the autotuner (which must not render source itself)."""

from __future__ import annotations

import threading
from typing import Any

import torch

from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import GemmInputs, output_shape
from tilewright.errors import KernelCompileError
from tilewright.autotune.kinds import LoopInputs
from tilewright.problem import GemmProblem, LoopProblem
from tilewright.runtime.loader import load_module
from tilewright.runtime.targets import Target, get_target
from tilewright.templates import RenderedKernel, get_template


def render(problem: GemmProblem, candidate: Candidate, target: Target) -> RenderedKernel:
    """Source for a candidate (see :meth:`TemplateSpec.render` for the errors it raises)."""
    template = get_template(candidate.template_id)
    if template.source_hash != candidate.template_hash:
        raise KernelCompileError(
            f"candidate {candidate.name} was chosen for template source {candidate.template_hash} "
            f"but {template.source_hash} is installed; re-tune (the cache keeps both apart)")
    return template.render(problem, candidate.param_dict, target)


class TemplateKernelFactory:
    """Builds launchers from the installed templates; one module per distinct source.

    Picklable: a tuning worker process receives an empty factory and rebuilds each candidate
    there from its template id and parameters (only choices are cached, never code).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._launchers: dict[tuple, object] = {}

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]

    def render(self, problem: GemmProblem | LoopProblem, candidate: Candidate, target: Target) -> RenderedKernel:
        """The candidate's source (see :func:`render`)."""
        return render(problem, candidate, target)

    def compile(self, rendered: RenderedKernel):
        """The launcher of rendered source (imported once per distinct source)."""
        module = load_module(rendered.source, name=rendered.name, interpret=rendered.interpret)
        launch = getattr(module, rendered.entry)
        launch.rendered = rendered  # for debug dumps and `explain`
        return launch

    def build(self, problem: GemmProblem | LoopProblem, candidate: Candidate, target: Target):
        key = (problem, candidate.key, target.name)
        with self._lock:
            if key in self._launchers:
                return self._launchers[key]
        launch = self.compile(self.render(problem, candidate, target))
        with self._lock:
            self._launchers[key] = launch
        return launch

    def reference(self, problem: GemmProblem | LoopProblem, inputs: GemmInputs | LoopInputs) -> Any:
        """The float64 result (a loop kernel: the tuple of its outputs, floats in float64)."""
        if isinstance(problem, LoopProblem):
            aten = get_template(f"aten.{problem.kind}")
            launch = self.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
            return launch(*inputs.tensors, *inputs.sizes, reference=True)
        aten = get_template("aten.gemm")
        launch = self.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
        x = inputs.as_dtype(torch.float64)
        out = torch.empty(output_shape(problem), dtype=torch.float64, device=x.a.device)
        if problem.store_acc:
            out = (out, torch.empty_like(out))
        return launch(x.a, x.b, *x.epilogue_inputs, out=out, **x.scale_kwargs)


default_factory = TemplateKernelFactory()


_tuned: dict[tuple, object] = {}
_tuned_lock = threading.Lock()


def tuned_launcher(problem: GemmProblem, device: torch.device):
    """The autotuner's choice for ``problem`` on ``device``, built (once per process)."""
    from tilewright._config import config
    from tilewright.autotune.select import select_gemm
    from tilewright.runtime.targets import detect_target

    config.raise_env_error()
    target = detect_target(device)
    key = (problem, target.name)
    launch = _tuned.get(key)
    if launch is None:
        with _tuned_lock:
            launch = _tuned.get(key)
            if launch is None:
                selection = select_gemm(problem, target, default_factory)
                launch = _tuned[key] = default_factory.build(problem, selection.winner, target)
    return launch
