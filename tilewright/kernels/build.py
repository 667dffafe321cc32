"""Render-and-load: turns an autotune candidate into a launcher, the glue between templates,
the runtime loader and the autotuner (which must not render source itself)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import torch

from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import GemmInputs, output_shape
from tilewright.errors import KernelCompileError
from tilewright.autotune.kinds import LoopInputs, kind_of
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
        from tilewright._config import config

        # allow_tf32 changes the rendered source of fp32 GEMMs on tensor-core targets
        key = (problem, candidate.key, target.name, config.allow_tf32)
        with self._lock:
            if key in self._launchers:
                return self._launchers[key]
        launch = self.compile(self.render(problem, candidate, target))
        with self._lock:
            self._launchers[key] = launch
        return launch

    def reference(self, problem: GemmProblem | LoopProblem, inputs: GemmInputs | LoopInputs) -> Any:
        """The float64 result (a loop kernel: the tuple of its outputs, floats in float64)."""
        if getattr(problem, "kind", None) == "grouped_gemm":
            from tilewright.grouped import reference

            return reference(problem, inputs)
        if isinstance(problem, LoopProblem):
            aten = get_template(f"aten.{problem.kind}")
            launch = self.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
            return launch(*inputs.tensors, *inputs.sizes, reference=True)
        step = _reference_columns(problem)
        if step >= problem.N:
            return self._gemm_reference(problem, inputs.as_dtype(torch.float64))
        # a wide B (an lm_head weight) in float64 would be 4x its size: go a slab of columns at
        # a time, so the reference costs one slab beside the result
        a = inputs.a.double()
        outs = []
        for n0 in range(0, problem.N, step):
            cols = slice(n0, min(problem.N, n0 + step))
            part = GemmInputs(a, inputs.b[..., cols].double(),
                              [e[..., cols].double() for e in inputs.epilogue_inputs])
            outs.append(self._gemm_reference(dataclasses.replace(problem, N=cols.stop - n0), part))
        if problem.store_acc:
            return tuple(torch.cat([o[i] for o in outs], dim=-1) for i in range(2))
        return torch.cat(outs, dim=-1)

    def special_reference(self, problem: Any, inputs: LoopInputs) -> Any:
        """The float64 reference of a loop kernel on special-value inputs
        (:func:`tilewright.autotune.kinds.special_loop_inputs`), or None where it is no judge:
        the kernel's torch form, computing as eager does (fp32 for narrow floats), disagrees
        with it there (an fp32 intermediate overflows where float64 does not, say), so no
        candidate can be expected to match. Other kinds: None (no special-value check)."""
        if not isinstance(problem, LoopProblem):
            return None
        ref = self.reference(problem, inputs)
        aten = get_template(f"aten.{problem.kind}")
        launch = self.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
        eager = launch(*inputs.tensors, *inputs.sizes)
        err, tol = kind_of(problem).error(problem, eager, ref, False)
        return ref if err <= tol else None

    def _gemm_reference(self, problem: GemmProblem, x: GemmInputs) -> Any:
        aten = get_template("aten.gemm")
        launch = self.build(problem, Candidate.of(aten.id, aten.source_hash), get_target("cpu"))
        out = torch.empty(output_shape(problem), dtype=torch.float64, device=x.a.device)
        if problem.store_acc:
            out = (out, torch.empty_like(out))
        return launch(x.a, x.b, *x.epilogue_inputs, out=out, **x.scale_kwargs)


REFERENCE_SLAB_BYTES = 64 << 20  # float64 B columns converted at a time


def _reference_columns(problem: GemmProblem) -> int:
    """Columns of B the float64 reference converts per step (N when all of them fit in
    :data:`REFERENCE_SLAB_BYTES`, or when the epilogue may depend on the column index: IR
    epilogues and block-scaled operands are computed whole)."""
    if problem.block_scaled or problem.epilogue_ir:
        return problem.N
    per_column = 8 * problem.K * (problem.batch if problem.batched else 1)
    return max(1, min(problem.N, REFERENCE_SLAB_BYTES // max(1, per_column)))


default_factory = TemplateKernelFactory()


_tuned: dict[tuple, object] = {}
_tuned_lock = threading.Lock()

CHOICE_SETTINGS = ("force_backend", "autotune", "max_candidates", "allow_tf32", "pdl",
                   "check_candidates", "cache_dir")
"""Settings that change which kernel the tuner picks for a problem (or the kernel's source): the
ops' launchers are keyed on them, so a call inside ``config.patch(...)`` uses the kernel chosen
under that block's settings, and the next call after it the one chosen under the old ones."""


def tuned_launcher(problem: GemmProblem, device: torch.device):
    """The autotuner's choice for ``problem`` on ``device`` under the current settings, built
    once per process and per value of :data:`CHOICE_SETTINGS`."""
    from tilewright._config import config
    from tilewright.autotune.select import select_gemm
    from tilewright.runtime.targets import detect_target

    config.raise_env_error()
    target = detect_target(device)
    key = (problem, target.name, *[getattr(config, name) for name in CHOICE_SETTINGS])
    launch = _tuned.get(key)
    if launch is None:
        with _tuned_lock:
            launch = _tuned.get(key)
            if launch is None:
                selection = select_gemm(problem, target, default_factory)
                launch = _tuned[key] = default_factory.build(problem, selection.winner, target)
    return launch
