"""Render-and-load: turns an autotune candidate into a launcher, the glue between templates,
the runtime loader and the autotuner (which must not render source itself): the
:class:`~tilewright.autotune.select.KernelFactory` the pipeline, ``tilewright explain`` and the
public ops (:mod:`tilewright.kernels`) hand the tuner. Was ``tilewright.kernels.build``."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor, wait as wait_all
from typing import Any, Callable

from tilewright.autotune.candidates import Candidate
from tilewright.errors import KernelCompileError
from tilewright.kinds import kind_of
from tilewright.runtime.languages import get_language
from tilewright.runtime.targets import Target
from tilewright.templates import RenderedKernel, get_template


def render(problem: Any, candidate: Candidate, target: Target) -> RenderedKernel:
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
        self._rendered: dict[tuple, RenderedKernel] = {}  # rendered by prepare(), for build()
        self._pending: list[tuple[int, Future]] = []  # (pid, prebuild) started, not yet waited for

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.__init__()  # type: ignore[misc]

    def render(self, problem: Any, candidate: Candidate, target: Target) -> RenderedKernel:
        """The candidate's source (see :func:`render`)."""
        return render(problem, candidate, target)

    def compile(self, rendered: RenderedKernel):
        """The launcher of rendered source, made by its template's language (``Language.load``;
        a Python module, imported once per distinct source, for every language so far)."""
        launch = get_language(rendered.template_id.split(".", 1)[0]).load(rendered)
        launch.rendered = rendered  # for debug dumps and `explain`
        return launch

    @staticmethod
    def _key(problem: Any, candidate: Candidate, target: Target) -> tuple:
        from tilewright._config import config

        # allow_tf32 changes the rendered source of fp32 GEMMs on tensor-core targets
        return (problem, candidate.key, target.name, config.allow_tf32)

    def build(self, problem: Any, candidate: Candidate, target: Target):
        key = self._key(problem, candidate, target)
        with self._lock:
            if key in self._launchers:
                return self._launchers[key]
            rendered = self._rendered.pop(key, None)
        launch = self.compile(rendered or self.render(problem, candidate, target))
        with self._lock:
            self._launchers[key] = launch
        return launch

    def prepare(self, problem: Any, candidates: list[Candidate], target: Target) -> Callable[[], None]:
        """Start building what ``candidates`` build natively ahead of loading (their language's
        ``prebuild``: the C++ libraries) in the background build pool (threads: the work is
        compiler processes; at most ``os.cpu_count()`` at once), and return ``wait()``, which is
        :meth:`settle`: it returns when every build this factory started is done, this problem's
        and any other's (a graph starts all its problems' builds up front), so that nothing is
        timed while a compiler runs. Rendering happens here, in the caller's thread (under its
        settings), once: :meth:`build` takes the rendered source. A failure is left for
        :meth:`build` to meet and report as the candidate's."""
        for cand in candidates:
            key = self._key(problem, cand, target)
            try:
                prebuild = get_language(cand.template_id.split(".", 1)[0]).prebuild
            except Exception:  # noqa: BLE001 - an unknown language: build() reports it
                continue
            with self._lock:
                if prebuild is None or key in self._launchers or key in self._rendered:
                    continue
            try:
                rendered = self.render(problem, cand, target)
            except Exception:  # noqa: BLE001 - build() renders again and reports it
                continue
            with self._lock:
                self._rendered[key] = rendered
                self._pending.append((os.getpid(), _build_pool().submit(_quietly, prebuild, rendered)))
        return self.settle

    def settle(self) -> None:
        """Wait for every background build :meth:`prepare` started (the tuner calls this before
        it times anything)."""
        with self._lock:
            # a forked child inherits the parent's futures but not the threads that would finish
            # them (its pool is made anew, _forget_pool): only this process's builds are waited for
            self._pending = [(pid, f) for pid, f in self._pending if pid == os.getpid()]
            pending = [f for _, f in self._pending]
        wait_all(pending)  # builds started meanwhile are another caller's to wait for
        with self._lock:  # dropped once done, not before: a second caller waits for them too
            self._pending = [(pid, f) for pid, f in self._pending if not f.done()]

    def reference(self, problem: Any, inputs: Any) -> Any:
        """The float64 result, as the problem's kind computes it
        (:meth:`tilewright.kinds.ProblemKind.reference`; a loop kernel: the tuple of its outputs,
        floats in float64)."""
        return kind_of(problem).reference(problem, inputs, self)

    def special_reference(self, problem: Any, inputs: Any) -> Any:
        """The float64 reference on special-value inputs, or None where it is no judge
        (:meth:`tilewright.kinds.ProblemKind.special_reference`)."""
        return kind_of(problem).special_reference(problem, inputs, self)


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _build_pool() -> ThreadPoolExecutor:
    """The process's background build threads: one per CPU, since each waits on a compiler
    process that wants a core of its own."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=os.cpu_count() or 1,
                                       thread_name_prefix="tilewright-prebuild")
        return _pool


def _forget_pool() -> None:
    """In a forked child: the parent's pool threads do not exist here, and a pool that believes
    they do would queue builds no thread runs (``settle`` would wait for ever)."""
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool)


def _quietly(prebuild: Callable[[Any], None], rendered: RenderedKernel) -> None:
    try:
        prebuild(rendered)
    except Exception:  # noqa: BLE001 - loading the module builds again and reports the error
        pass


default_factory = TemplateKernelFactory()
