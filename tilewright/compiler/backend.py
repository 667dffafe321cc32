"""The ``torch.compile`` backend: ``torch.compile(model, backend="tilewright")``.

Registered through the ``torch_dynamo_backends`` entry point (installing the package is enough)
and by ``import tilewright`` itself (a checkout on PYTHONPATH, tilewright._dynamo_registration).
Dynamo's graph goes through aot_autograd with tilewright's decomposition table, which produces
ATen forward and backward graphs (or one inference graph under ``no_grad``); each is compiled by
:func:`tilewright.compiler.pipeline.compile_graph`. A graph tilewright fails to compile runs
unchanged on ATen, with a warning; so does a compiled graph that fails when it runs. With
``config.strict`` set, both errors are raised instead.

The user's own mistakes are not tilewright's failures and are reported as such, once, in one
line: a bad ``TILEWRIGHT_*`` value or another :data:`USER_ERRORS` raised while compiling comes out
of ``torch.compile``'s call as itself (a ``ConfigError``, not Dynamo's 40-line
``BackendCompilerFailed``, see :func:`shorten`), and a graph that fails at run time and fails the
same way on ATen (a dtype mismatch, a bad shape) raises ATen's error, as eager would, once and
without switching the graph to ATen.
"""

from __future__ import annotations

import functools
import logging
import warnings
from typing import Any, Callable

import torch
import torch.fx as fx
from torch._dynamo.backends.common import aot_autograd

from tilewright._config import config
from tilewright.compiler import cudagraphs
from tilewright.compiler.decompositions import decomposition_table
from tilewright.compiler.fallbacks import RerunGraph
from tilewright.compiler.pipeline import compile_graph
from tilewright.compiler.race import aten_graph, eager_forward, race_rounds, raced_with_eager
from tilewright.compiler.report import GraphReport, collect_reports, publish
from tilewright.errors import ConfigError, InvalidInputError

log = logging.getLogger("tilewright.compiler")

USER_ERRORS = (ConfigError, InvalidInputError)
"""Errors that are the user's to fix (the message says how): never a reason to fall back."""

_short_types: dict[type, type] = {}


def shorten(e: BaseException) -> BaseException:
    """``e`` as an exception Dynamo lets through unwrapped, for the backend to raise.

    Dynamo wraps whatever a backend raises in ``BackendCompilerFailed``: the message twice over,
    "report a bug to PyTorch", and some 40 lines of compiler frames. It lets an exception that is
    a ``ShortenTraceback`` through instead and, where the user's call enters Dynamo, re-raises it
    after ``remove_dynamo_frames()``. The returned exception is an instance of a subclass of both
    ``type(e)`` (so ``except ConfigError`` still catches it, and it prints as
    ``tilewright.errors.ConfigError: ...``) and ``ShortenTraceback``, whose
    ``remove_dynamo_frames`` drops every frame below that call (``TORCHDYNAMO_VERBOSE=1`` keeps
    them) and the text Dynamo appends to the message. Where the installed torch has no
    ``ShortenTraceback``, ``e`` comes back unchanged (and Dynamo wraps it as before).
    """
    try:
        from torch._dynamo.exc import ShortenTraceback
    except ImportError:  # pragma: no cover - torch without it
        return e
    if isinstance(e, ShortenTraceback):
        return e
    cls = _short_types.get(type(e))
    if cls is None:
        base = type(e)

        def __init__(self, *args: Any) -> None:
            ShortenTraceback.__init__(self, *args, first_useful_frame=None)
            self._tilewright_args = args

        def remove_dynamo_frames(self):  # called by Dynamo where the user's call entered it
            import torch._dynamo.config as dynamo_config

            self.args = self._tilewright_args  # without what Dynamo appended
            return self if dynamo_config.verbose else self.with_traceback(None)

        def __reduce__(self):  # pickles (a worker's report) as the plain error
            return base, self._tilewright_args

        try:
            cls = type(base.__name__, (base, ShortenTraceback),
                       {"__init__": __init__, "remove_dynamo_frames": remove_dynamo_frames,
                        "__reduce__": __reduce__, "__module__": base.__module__,
                        "__qualname__": base.__qualname__, "__doc__": base.__doc__})
        except TypeError:  # pragma: no cover - a base whose layout cannot mix with RuntimeError
            return e
        _short_types[base] = cls
    short = cls(*e.args)
    short.__dict__.update({k: v for k, v in vars(e).items() if k not in vars(short)})
    return short


def _run_or_fall_back(compiled: Callable, gm: fx.GraphModule, kind: str) -> Callable:
    """The compiled graph, guarded: if it raises at run time, the call is rerun on ATen.

    * ATen raises too: the input is at fault (a dtype mismatch, a bad shape), not tilewright;
      ATen's error (what eager raises) is raised, once, without the frames of the graph or the
      compiled graph's error chained to it, and the graph stays compiled for the next call.
    * ATen succeeds: a tilewright bug the compile-time checks and the kernels' own run-time
      fallbacks (:meth:`~tilewright.compiler.dispatch.KernelCall.rescue`, which cost one
      kernel's size bucket) missed. One warning line (its traceback goes to the
      ``tilewright.compiler`` log at info level), the graph runs on ATen for good, the graph's
      report says so in ``fallback`` and the model gets its answer; ``config.strict`` raises
      the compiled graph's error instead.

    A kernel that failed after it may have written part of an in-place output raises
    :class:`~tilewright.compiler.fallbacks.RerunGraph` (its bucket now on ATen): the call is
    rerun, compiled, from its inputs.
    """
    aten: list[Callable] = []
    report = getattr(compiled, "tilewright_report", None)

    def call(args: list) -> Any:
        if aten:
            return aten[0](args)
        saved = list(args)  # the compiled call clears its argument list
        for _ in range(_RERUNS):
            try:
                return compiled(args)
            except RerunGraph:
                args = list(saved)
            except Exception as e:
                error = e
                break
        else:
            error = RuntimeError(f"the compiled {kind} graph kept asking for a rerun")
        fallback = aten_graph(gm)
        try:
            out = fallback(list(saved))
        except Exception as again:
            del error
            raise again.with_traceback(None) from None  # the user's error (aten_graph marks it)
        if config.strict:
            raise error
        msg = (f"a tilewright-compiled {kind} graph failed at run time ({type(error).__name__}: "
               f"{_first_line(error)}); running it on ATen from now on")
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.info("the compiled %s graph's error", kind, exc_info=error)
        if report is not None:
            report.fallback = f"at run time: {type(error).__name__}: {_first_line(error)}"
        aten.append(fallback)
        return out

    call._boxed_call = True  # type: ignore[attr-defined]
    return call


def with_eager_errors(compiled: Callable[..., Any], gm: fx.GraphModule) -> Callable[..., Any]:
    """``compiled`` (the backend's result for Dynamo's graph ``gm``, called as Dynamo calls it:
    ``*args``), raising eager's own error for an input eager refuses.

    A call the graph's inputs make fail (an index out of range, an integer division by zero) is
    rerun on aot_autograd's graph by :func:`_run_or_fall_back`, whose decomposed ops word the
    error, and may type it, otherwise than eager: ``F.cross_entropy`` with a target of 10 over 10
    classes raises eager's ``IndexError: Target 10 is out of bounds.`` but a decomposed gather's
    ``RuntimeError: index 10 is out of bounds for dimension 1 with size 10``, which an
    ``except IndexError`` misses. Such an error makes this run ``gm``, the model's own ops, on the
    same arguments, under the caller's grad mode, as eager would, and raise what they raise (once,
    without the compiled graph's frames; the CPU random stream is forked for it, so the rerun
    draws nothing from the caller's); should they run, the first error stands. Other errors pass
    through untouched, and a call that raises nothing costs one Python frame."""
    forward = eager_forward(gm)

    def call(*args: Any) -> Any:
        try:
            return compiled(*args)
        except Exception as e:
            if not getattr(e, "tilewright_refused_input", False):
                raise
            try:
                with torch.random.fork_rng(devices=[]):  # the rerun draws no numbers of the caller's
                    forward(*args)
            except Exception as eager:
                del e
                raise eager.with_traceback(None) from None
            raise

    return call


_RERUNS = 16  # reruns of one call (each switched one kernel's bucket to ATen) before giving up


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _compile_or_fallback(gm: fx.GraphModule, example_inputs: list[Any], *, kind: str,
                         settings: dict[str, Any] | None = None) -> Callable:
    """Compile one aot_autograd graph under ``settings`` (the config when Dynamo handed the model
    to the backend: a training graph's backward compiles at its first ``backward()``, maybe
    outside the ``config.patch`` block its forward compiled in, and must choose alike)."""
    changed = {k: v for k, v in (settings or {}).items() if getattr(config, k) != v}
    with config.patch(**changed):
        return _compile_under_settings(gm, example_inputs, kind)


def _compile_under_settings(gm: fx.GraphModule, example_inputs: list[Any], kind: str) -> Callable:
    try:
        return _run_or_fall_back(compile_graph(gm, example_inputs, kind), gm, kind)
    except USER_ERRORS:
        raise  # the user's to fix: falling back would hide it (tilewright_backend shortens it)
    except Exception as e:
        if config.strict:
            raise
        article = "an" if kind[0] in "aeiou" else "a"
        msg = (f"tilewright could not compile {article} {kind} graph ({type(e).__name__}: {_first_line(e)}); "
               "running it on ATen")
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        log.info("the %s graph's compile error", kind, exc_info=True)
        publish(GraphReport(-1, kind, fallback=f"{type(e).__name__}: {e}"))
        return aten_graph(gm)


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


def rewrite_dynamo_graph(gm: fx.GraphModule) -> int:
    """Each kind's :meth:`~tilewright.kinds.ProblemKind.rewrite_dynamo` on Dynamo's graph, in
    place, before aot_autograd traces it; returns the nodes changed. A kind whose rewrite fails
    leaves the graph as it was for that kind (logged): it costs that rewrite, not the graph."""
    from tilewright.kinds import kinds

    changed = 0
    for kind in kinds():
        try:
            changed += kind.rewrite_dynamo(gm)
        except Exception:  # noqa: BLE001 - the graph as traced is still right
            if config.strict:
                raise
            log.info("the %s kind's Dynamo-graph rewrite failed", kind.name, exc_info=True)
    return changed


def _inference(example_inputs: list[Any]) -> bool:
    """Whether Dynamo's graph runs without autograd (Dynamo guards on the grad mode, so the
    mode at compile time is the mode of every call of this graph)."""
    return not torch.is_grad_enabled() or not any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def tilewright_backend(gm: torch.fx.GraphModule, example_inputs: list[Any], **kwargs: Any) -> Callable:
    """Dynamo backend entry point (``backend="tilewright"``).

    ``mode="reduce-overhead"`` (or ``options={"cudagraphs": True}``, or ``config.cudagraphs``)
    runs the compiled graphs under PyTorch's CUDA-graph trees (:mod:`.cudagraphs`).

    Raises:
        ConfigError: a ``TILEWRIGHT_*`` environment variable has a bad value, or ``mode`` or
            ``options`` one the backend does not read (raised as itself, in one line, not
            wrapped by Dynamo: see :func:`shorten`).
    """
    try:
        config.raise_env_error()
        # torch.compile hands a custom backend its mode and options as keywords
        graphs_on, sizes = cudagraphs.requested(kwargs.pop("mode", None), kwargs.pop("options", None))
        extra = partition_options()
        settings = config.as_dict()  # the backward, compiled later, chooses under these too
        # an inference graph races the model's own ops (compiler/race.py), which covers the
        # race of aot_autograd's graph inside it
        eager_race = _inference(example_inputs) and race_rounds(example_inputs) > 0
        if eager_race:
            settings["graph_race"] = "off"
        fw, bw, inference = (functools.partial(_compile_or_fallback, kind=kind, settings=settings)
                             for kind in ("forward", "backward", "inference"))
        if graphs_on:  # each compiled graph under PyTorch's CUDA-graph trees, or refused with why
            graphs = cudagraphs.GraphCudagraphs(len(example_inputs), sizes)
            fw, bw, inference = graphs.forward(fw, "forward"), graphs.backward(bw), graphs.forward(
                inference, "inference")
        backend = aot_autograd(
            fw_compiler=fw,
            bw_compiler=bw,
            inference_compiler=inference,
            decompositions=decomposition_table(),
            **extra,
        )
        rewrite_dynamo_graph(gm)
        if not eager_race:
            return with_eager_errors(backend(gm, example_inputs, **kwargs), gm)
        with collect_reports() as reports:
            compiled = backend(gm, example_inputs, **kwargs)
        return with_eager_errors(raced_with_eager(compiled, gm, example_inputs, reports), gm)
    except USER_ERRORS as e:
        raise shorten(e) from None


# torch._dynamo.reset() resets a backend that has a reset: the CUDA-graph trees, as Inductor's does
tilewright_backend.reset = cudagraphs.reset  # type: ignore[attr-defined]
