"""The run-time side of every generated kernel in the wrapper: one :class:`KernelCall` type.

A kernel's problem (a GEMM, a loop kernel, a grouped GEMM, any registered problem kind) has its
kernel chosen at compile time for static sizes. For a problem with a symbolic size the kernel is
chosen per *bucket* of that size (see :mod:`tilewright.autotune.buckets`: powers of two up to
``config.bucket_max``), and each call dispatches on the run-time size to its bucket's kernel. A
bucket is tuned the first time a size in it is seen, or at compile time for every bucket up to the
trace-time size with ``config.pretune_buckets``; kernels are size-generic, so any size in the
bucket runs correctly. How a call's arguments map to the launcher and where its run-time sizes
come from is the problem kind's (:meth:`tilewright.kinds.ProblemKind.invoker`).

The call path is short on purpose (its cost is measured by ``tilewright bench``'s launch-overhead
row): a static kernel binds its launcher once and every call goes straight to it.
"""

from __future__ import annotations

import math
import threading
from typing import Any, Mapping

from tilewright._config import config
from tilewright.errors import NoValidCandidateError
from tilewright.autotune.buckets import all_buckets, bucket, bucket_problem
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.select import KernelFactory, Launcher, Selection, select
from tilewright.kinds import kind_of
from tilewright.runtime.status import is_input_error
from tilewright.runtime.targets import Target
from tilewright.templates import get_template

__all__ = ["KernelCall", "bucket"]


class KernelCall:
    """The wrapper's callable for one kernel; what it takes is its kind's
    (:meth:`~tilewright.kinds.ProblemKind.invoker`): a GEMM ``call(a, b, *epilogue_inputs,
    view=None, **scales) -> Tensor`` (``(out, product)`` when the problem stores its product
    too), a loop kernel ``call(*inputs, *sizes)`` -> its output or a tuple of outputs, a grouped
    GEMM ``call(a, b, offs[, bias]) -> Tensor``.

    Args:
        name: the kernel's name in the wrapper ("gemm_3", "kernel_7", "grouped_gemm_0").
        problem: the problem at its trace-time sizes (``dynamic`` names the symbolic dims).
        target: where it runs.
        factory: builds launchers for candidates.
        options: what the kind's call needs from the node
            (:meth:`~tilewright.kinds.ProblemKind.call_options`; a GEMM: ``spaces``, per
            epilogue input "gemm" or "view", the shape it broadcasts against).
        fixed: a candidate to use without tuning (unknown targets fall back to ATen this way).
    """

    def __init__(self, name: str, problem: Any, target: Target, factory: KernelFactory, *,
                 options: Mapping[str, Any] | None = None, fixed: Candidate | None = None):
        self.name = name
        self.problem = problem
        self.kind = problem.kind
        self.target = target
        self.factory = factory
        self.options = dict(options or {})
        self.fixed = fixed
        self.fixed_reason = "fixed"
        self.selections: dict[tuple[int, ...], Selection] = {}
        self._launchers: dict[tuple[int, ...], Launcher] = {}
        self._aten_keys: set[tuple[int, ...]] = set()  # buckets switched to ATen at run time
        self.fallbacks: list = []  # where run-time fallbacks are recorded (the graph's report)
        self._bound_key: tuple[int, ...] | None = None  # the bucket the pipeline compiled
        # the last resort when the kind's ATen form fails too (a loop kernel: its FX nodes run
        # as the graph had them; compiler/fallbacks.py fx_ops_launcher), made when first needed
        self.last_resort: Any = None
        self._last_keys: set[tuple[int, ...]] = set()
        self._eager_check: Any = None  # the last resort, built to tell the input's errors apart
        self._lock = threading.Lock()
        self._fast: Launcher | None = None
        # a dynamic call's last bucket as (bucket_max, ((dim, low, high), ...), launcher): a call
        # whose dynamic sizes are all in low < size <= high (a decode loop's growing KV length
        # between two powers of two, a static graph's grouped GEMM every call) skips the bucket
        # lookup (~100 Python opcodes a call); cleared whenever a launcher changes
        self._recent: tuple[int, tuple[tuple[str, int, float], ...], Launcher] | None = None
        self._kind = kind_of(problem)
        self.dims = self._kind.dims(problem)
        self._static = self._kind.sizes(problem)  # the trace-time sizes (the problem is immutable)
        self._invoke = self._kind.invoker(self)

    def _sizes_of(self, problem: Any) -> dict[str, int]:
        return self._kind.sizes(problem)
    # -- choosing ---------------------------------------------------------------------------------
    def tuned_problem(self) -> Any:
        """The problem :meth:`choose` tunes first: the trace-time sizes' bucket."""
        return bucket_problem(self.problem, self._sizes_of(self.problem))

    def choose(self, sizes: dict[str, int] | None = None) -> tuple[Any, Selection]:
        """The problem at the bucket of ``sizes`` and the selection for it (tuned if new), without
        building anything."""
        sizes = sizes or self._sizes_of(self.problem)  # the trace-time sizes: valid, as the trace
        problem = bucket_problem(self.problem, sizes)
        key = tuple(self._sizes_of(problem)[d] for d in self.dims)
        with self._lock:
            if key in self.selections:
                return problem, self.selections[key]
        if self.fixed is not None:
            selection = Selection(problem, self.target, self.fixed, reason=self.fixed_reason, measured=False)
        else:
            selection = self._select_bucket(problem, sizes)
        with self._lock:
            self.selections[key] = selection
        return problem, selection

    def _select_bucket(self, problem: Any, sizes: dict[str, int] | None) -> Selection:
        """The selection for a bucket's problem. Its sizes are each symbol's power of two, which
        can break a relation the graph's sizes keep (a mask of z1 columns indexed by positions
        0..z0, with z1 = z0 + 1 in every call): then no tuning input is valid there, and the
        bucket is tuned at the sizes of the call that reached it (valid, since the call is)."""
        try:
            return select(problem, self.target, self.factory)
        except NoValidCandidateError:
            exact = None
            if sizes:
                exact = self.problem.with_sizes(**{d: int(sizes[d]) for d in self.problem.dynamic if d in sizes})
            if exact is None or exact == problem:
                raise
            return select(exact, self.target, self.factory)

    def choose_aten(self) -> tuple[Any, Selection]:
        """Give up on generated kernels for this call: from now on every bucket uses the ATen
        candidate of its kind (a loop kernel's torch form), untimed. Returns the trace-time
        problem and its selection."""
        aten = get_template(self._kind.aten_template_id(self.problem))
        self.fixed = Candidate.of(aten.id, aten.source_hash)
        self.fixed_reason = "ATen after the generated kernel failed"
        with self._lock:
            self.selections.clear()
            self._launchers.clear()
            self._fast = None
            self._recent = None
        return self.choose()

    def prepare(self, sizes: dict[str, int] | None = None) -> Selection:
        """Choose and build the kernel for these sizes (the trace-time ones by default); with
        ``config.pretune_buckets``, first every bucket up to the trace-time sizes."""
        if sizes is None:
            selection = self.prepare(self._sizes_of(self.problem))  # first: the one reports show
            if config.pretune_buckets and self.problem.dynamic:
                for p in all_buckets(self.problem):
                    self.prepare(self._sizes_of(p))
            if not self.problem.dynamic and len(self._launchers) == 1:
                self._fast = next(iter(self._launchers.values()))
            return selection
        problem, selection = self.choose(sizes)
        key = tuple(self._sizes_of(problem)[d] for d in self.dims)
        with self._lock:
            if key in self._launchers:
                return selection
        launch = self.factory.build(problem, selection.winner, self.target)
        with self._lock:
            self._launchers[key] = launch
            self._recent = None
        return selection

    def bind(self, problem: Any, launch: Launcher) -> None:
        """Use ``launch`` for ``problem``'s bucket (the pipeline renders and compiles the chosen
        kernels as stages of their own, then binds them here)."""
        key = tuple(self._sizes_of(problem)[d] for d in self.dims)
        with self._lock:
            self._launchers[key] = launch
            self._recent = None
            if self._bound_key is None:
                self._bound_key = key
        if not self.problem.dynamic and len(self._launchers) == 1:
            self._fast = launch

    def _key(self, sizes: dict[str, int] | None) -> tuple[int, ...]:
        static = self._static
        if sizes is None:
            return tuple(static[d] for d in self.dims)
        return tuple(bucket(sizes[d]) if d in self.problem.dynamic else static[d] for d in self.dims)

    def _launcher(self, sizes: dict[str, int]) -> Launcher:
        recent = self._recent
        if recent is not None and recent[0] == config.bucket_max:
            for d, low, high in recent[1]:
                if not low < sizes[d] <= high:
                    break
            else:
                return recent[2]
        key = self._key(sizes)
        launch = self._launchers.get(key)
        if launch is None:
            try:
                self.prepare(sizes)
            except Exception as e:  # noqa: BLE001 - a new bucket's tuning or build failed
                        return self.rescue(sizes, e, stage="run", what="tuning a new size bucket")
            launch = self._launchers[key]
        with self._lock:
            if self._launchers.get(key) is launch:  # not replaced meanwhile (a rescue)
                self._recent = (config.bucket_max, self._bucket_ranges(key), launch)
        return launch

    def _bucket_ranges(self, key: tuple[int, ...]) -> tuple[tuple[str, int, float], ...]:
        """Per dynamic dim of bucket key ``key``, the sizes (low, high] that :func:`bucket` maps to
        that bucket: (b/2, b], the cap's bucket unbounded above, 0 and 1 themselves."""
        top = bucket(1 << 62)  # the cap's bucket under the current bucket_max
        out = []
        for d, b in zip(self.dims, key):
            if d in self.problem.dynamic:
                out.append((d, b // 2 if b >= 2 else b - 1, math.inf if b >= top else b))
        return tuple(out)

    def rescue(self, sizes: dict[str, int] | None, error: BaseException, *, inplace: bool = False,
               stage: str | None = None, what: str = "running the kernel") -> Launcher:
        """After the launcher of the bucket of ``sizes`` (None: the static sizes) raised
        ``error``: that bucket runs the kind's ATen form from now on (other buckets keep
        theirs), the fallback is recorded (:mod:`tilewright.compiler.fallbacks`) and its
        launcher returned, for the caller to run the call again.

        Raises:
            error: under ``config.strict``, when the bucket already ran ATen's form, or when
                ``error`` is a kernel's input check failing
                (:func:`~tilewright.runtime.status.is_input_error`): the input is at fault,
                not the generated kernel, and nothing is demoted.
            RerunGraph: ``inplace``: the kernel may have written part of its in-place output,
                so the whole graph's call reruns (with this bucket on ATen).
        """
        from tilewright.compiler.fallbacks import RerunGraph, contain

        if is_input_error(error):
            raise error  # eager's error for this input (a kernel's bounds or divisor check)
        key = self._key(sizes)
        aten = get_template(self._kind.aten_template_id(self.problem))
        chosen = self.selections.get(key)
        if key in self._aten_keys or (key in self._launchers and chosen is not None
                                      and chosen.winner.template_id == aten.id):
            return self._last_resort(key, sizes, error, inplace)  # ATen's own form failed
        full = sizes if sizes is not None else self._sizes_of(self.problem)
        problem = bucket_problem(self.problem, full)
        candidate = Candidate.of(aten.id, aten.source_hash)
        bucket_sizes = {d: self._sizes_of(problem)[d] for d in self.dims if d in self.problem.dynamic}
        contain(error, self.name, stage or ("launch" if key == self._bound_key else "run"),
                f"{what} ({self.problem.describe()})", sink=self.fallbacks, bucket=bucket_sizes or None)
        launch = self.factory.build(problem, candidate, self.target)
        selection = Selection(problem, self.target, candidate, measured=False,
                              reason=f"ATen: the generated kernel failed ({type(error).__name__})")
        with self._lock:
            self.selections[key] = selection
            self._launchers[key] = launch
            self._recent = None
            self._aten_keys.add(key)
            if self._fast is not None:
                self._fast = launch
        if inplace:
            raise RerunGraph(f"{self.name} failed after it may have written its output") from error
        return launch

    def recover(self, sizes: dict[str, int] | None, error: BaseException, args: tuple,
                kwargs: Mapping[str, Any] | None = None, *, inplace: bool = False) -> Any:
        """Run the call again after its launcher raised ``error``: on each fallback
        :meth:`rescue` gives in turn (the ATen form, then the last resort) until one runs;
        raises what :meth:`rescue` raises when none is left.

        The input may be at fault rather than the kernel: a kernel's input check failed
        (:func:`~tilewright.runtime.status.is_input_error`), or the kernel's eager ops (its
        last resort; else its ATen form, failing with the same exception class) raise for these
        arguments too. Then eager's error is raised and nothing is demoted: the kernel and its
        bucket keep running for later, valid, calls (the graph's run-time guard in
        compiler/backend.py reruns the call on ATen and raises eager's message, once)."""
        if is_input_error(error):
            raise error
        eager_error = self._eager_error(sizes, error, args, kwargs)
        if eager_error is not None:
            raise eager_error from None
        while True:
            launch = self.rescue(sizes, error, inplace=inplace)
            try:
                return launch(*args, **(kwargs or {}))
            except Exception as e:  # noqa: BLE001 - the next fallback, or rescue raises
                error = e

    def _eager_error(self, sizes: dict[str, int] | None, error: BaseException, args: tuple,
                     kwargs: Mapping[str, Any] | None) -> BaseException | None:
        """What running this call's arguments without the generated kernel raises (None: it
        runs, so the generated kernel is at fault). The eager ops (:attr:`last_resort`) decide
        where the kernel has them; otherwise its ATen form, whose failure counts only when it
        is of ``error``'s class or has its message (a torch-form kernel raises ATen's text as
        eager's RuntimeError, the ATen form as IndexError). Nothing is recorded or switched;
        the eager ops' launcher is built once and kept."""
        if self._key(sizes) in self._last_keys:
            return None  # the eager ops themselves failed: rescue raises their error
        check, same_class = self._eager_check, False
        if check is None and self.last_resort is not None:
            try:
                check = self._eager_check = self.last_resort()
            except Exception:  # noqa: BLE001 - no eager ops for this kernel: its ATen form
                check = None
        if check is None:
            try:
                aten = get_template(self._kind.aten_template_id(self.problem))
                full = sizes if sizes is not None else self._sizes_of(self.problem)
                check = self.factory.build(bucket_problem(self.problem, full),
                                           Candidate.of(aten.id, aten.source_hash), self.target)
            except Exception:  # noqa: BLE001 - no ATen form to ask: rescue decides
                return None
            same_class = True
        try:
            check(*args, **(kwargs or {}))
        except Exception as e:  # noqa: BLE001 - the input's error, or the check's own failure
            if not same_class or type(e) is type(error) or str(e) == str(error):
                return e
        return None

    def _last_resort(self, key: tuple[int, ...], sizes: dict[str, int] | None, error: BaseException,
                     inplace: bool) -> Launcher:
        """The bucket's ATen form failed as well: its last resort (see ``last_resort``), or
        ``error`` (where there is none, or it failed too: then the input is at fault, or the
        graph-level fallback takes the call)."""
        from tilewright.compiler.fallbacks import RerunGraph, contain

        if self.last_resort is None or key in self._last_keys:
            raise error
        try:
            launch = self.last_resort()
        except Exception:  # noqa: BLE001 - no last resort for this kernel
            raise error from None
        bucket_sizes = {d: v for d, v in zip(self.dims, key) if d in self.problem.dynamic}
        contain(error, self.name, "launch" if key == self._bound_key else "run",
                f"running its ATen form ({self.problem.describe()})", sink=self.fallbacks,
                bucket=bucket_sizes or None, runs="its ATen ops as the graph had them")
        with self._lock:
            self._launchers[key] = launch
            self._recent = None
            self._last_keys.add(key)
            if self._fast is not None:
                self._fast = launch
        if inplace:
            raise RerunGraph(f"{self.name} failed after it may have written its output") from error
        return launch

    # -- running ----------------------------------------------------------------------------------
    def entry(self) -> Callable[..., Any]:
        """What the wrapper binds for this kernel once its launcher is bound: the kind's direct
        entry (:meth:`~tilewright.kinds.ProblemKind.direct_entry`) where it has one, else the
        invoker."""
        direct = self._kind.direct_entry(self)
        return direct if direct is not None else self._invoke

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._invoke(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<KernelCall {self.name}: {self.problem.describe()}>"
