"""The registry of problem kinds: GEMM, grouped GEMM, loop kernels (pointwise, reduction), and
whatever is registered next (attention, scans).

A *kind* is everything tilewright knows about one family of kernel problems, in one module: the
problem type (JSON round trip, stable hash, description), its candidate policy and cost
estimate, how the autotuner makes inputs, poisons outputs, runs a launcher and judges its result
against the float64 reference, its ATen template (the fallback), how the compiler finds its
kernels in a kernel graph, and how the wrapper calls them. Shared code (select, evaluate, warm,
the cache, dispatch, the pipeline, capture, ``tilewright aot``) asks the kind of a problem
(:func:`kind_of`) and never lists kinds itself, so a new kind is its own module plus one line of
registration:

* built in: a module ``tilewright/kinds/<name>.py`` defining ``KIND`` and its name in
  :data:`BUILTIN`;
* outside the package: ``register_kind(MyKind())``, or an entry point in the group
  ``tilewright.kinds`` naming the kind object (or its class), found on first use, like Triton's
  ``triton.backends``.

Layering: this package is the junction between the layers of ``docs/architecture.md``. It is
imported by the autotuner and the compiler, and its kind modules import theirs, so every import
of ``autotune/`` or ``compiler/`` in a kind module is made inside the hook that needs it (or, for
the autotuner's policies, at module level of the kind module, which this package only imports
on first use, never at its own import).
"""

from __future__ import annotations

import importlib
import logging
import threading
from importlib.metadata import entry_points
from typing import Any, Callable, ClassVar, Mapping

from tilewright.errors import TilewrightError

log = logging.getLogger("tilewright.kinds")

BUILTIN = ("gemm", "grouped_gemm", "loop", "attention")
"""Modules of ``tilewright.kinds`` whose ``KIND`` is registered first, in this order (the order
``tilewright aot`` lists captured kernels in: GEMMs, grouped GEMMs, loop kernels, attention)."""

ENTRY_POINT_GROUP = "tilewright.kinds"


class UnknownKindError(TilewrightError, KeyError):
    """A problem kind that no registered kind owns (a cache entry or JSON from a newer tilewright,
    or a plug-in that is not installed)."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable
        return str(self.args[0]) if self.args else ""


class ProblemKind:
    """Base of every problem kind. A subclass sets the class attributes and overrides the hooks
    it needs; every hook below has a default that is right for a kind with one problem type, an
    ATen template named ``aten.<kind>`` and kernels held as
    :class:`~tilewright.compiler.graph.KernelNode`\\ s.

    Class attributes:
        names: the ``problem.kind`` values this kind owns (most own one; the loop kind owns
            "pointwise" and "reduction"). Templates implementing it declare ``op = <name>``.
        problem_type: the problem class: a frozen (hashable) dataclass with a ``kind``
            attribute, ``to_json()`` (a JSON object; it carries ``"kind"`` unless the kind is
            "gemm", whose JSON predates kinds), ``from_json(d)``, ``stable_hash()``,
            ``describe()``, ``with_sizes(**sizes)``, ``dynamic`` (names of run-time sizes) and
            ``min_bytes`` (modelled traffic of one call). It lives below the templates (they
            import it), never in the kind module, which imports the autotuner.
        display_fields: fields that only label a problem: a change of one may leave the stable
            hash as it is (a loop problem's ``op``); the tuning cache's key always leaves ``op``
            out.
        tune_aten_alone: whether a problem whose only candidate is ATen is still timed and
            recorded (GEMMs: ``tilewright warm`` ships ATen's record as the bar); other kinds
            choose it without measuring.
    """

    names: ClassVar[tuple[str, ...]] = ()
    problem_type: ClassVar[type] = object
    display_fields: ClassVar[tuple[str, ...]] = ("op",)
    tune_aten_alone: ClassVar[bool] = False

    @property
    def name(self) -> str:
        """The kind's first name (what error messages and listings show)."""
        return self.names[0]

    # -- the problem ------------------------------------------------------------------------------
    def from_json(self, d: Mapping[str, Any]) -> Any:
        """The problem back from its ``to_json()``."""
        return self.problem_type.from_json(dict(d))

    def examples(self) -> list[Any]:
        """Problems for the registry's tests: a typical one first, then variants that each
        differ from it in one field, covering every field (the tests check that each changes
        the JSON and, unless it is a display field, the stable hash)."""
        return []

    def aten_template_id(self, problem: Any) -> str:
        """The ATen template of ``problem``: rank 0 of every policy, the fallback when a
        generated kernel fails, and (given float64 inputs) usually the reference."""
        return f"aten.{problem.kind}"

    # -- choosing -----------------------------------------------------------------------------------
    def policy(self, name: str, target: Any) -> Any:
        """The candidate policy for problems of kind ``name`` on ``target``: an object with
        ``candidates(problem, target) -> list[Candidate]`` (ATen first, rank 0) and
        ``ranked(problem, target, template) -> list[(predicted ms, params)]`` (best first; what
        ``tilewright aot`` builds). Default: ATen only."""
        return AtenOnlyPolicy(self)

    def candidates(self, problem: Any, target: Any) -> list[Any]:
        """The policy's candidates for ``problem`` (see :meth:`policy`)."""
        return self.policy(problem.kind, target).candidates(problem, target)

    def ranked(self, problem: Any, target: Any, template: Any) -> list[tuple[float, dict]]:
        """The policy's legal settings of one template, best first (see :meth:`policy`)."""
        return self.policy(problem.kind, target).ranked(problem, target, template)

    def aot_settings(self, problem: Any, target: Any, ranked: list[tuple[float, dict]],
                     chosen: list[tuple[float, dict]]) -> list[tuple[float, dict]]:
        """What ``tilewright aot`` builds of one template for ``problem``: ``chosen`` (the best
        of ``ranked``, the template's legal settings best first, with their PDL twins), to which
        a kind may add settings only a measurement on the device could choose between (GEMMs:
        a block-scaled decode GEMM's swap-AB and split-K). Default: ``chosen``."""
        return chosen

    def estimate(self, problem: Any, params: Mapping[str, Any], target: Any, template: Any) -> Any:
        """The cost model's estimate of one kernel (``.ms``, ``.bound``: "compute", "memory" or
        "latency"), for ranking settings ahead of time.

        Raises:
            NotImplementedError: the kind has no cost model (it cannot be built ahead of time).
        """
        raise NotImplementedError(f"problem kind {self.name!r} has no cost estimate")

    # -- checking a candidate -------------------------------------------------------------------
    def make_inputs(self, problem: Any, device: Any, seed: int = 0) -> Any:
        """Fresh random inputs for one run (normal floats, never zeros), in the problem's
        layouts, made from ``seed`` so every process makes the same ones."""
        raise NotImplementedError(f"problem kind {self.name!r} cannot make inputs")

    def poisoned(self, problem: Any, device: Any) -> Any:
        """Output buffers full of NaN (integers: a value no kernel writes), so an element a
        kernel fails to write shows up in the check."""
        raise NotImplementedError(f"problem kind {self.name!r} cannot make outputs")

    def run(self, launch: Callable, inputs: Any, outs: Any) -> Any:
        """Run ``launch`` on ``inputs`` into ``outs``; returns the result(s)."""
        raise NotImplementedError(f"problem kind {self.name!r} cannot run a launcher")

    def run_timed(self, launch: Callable, inputs: Any, outs: Any) -> Any:
        """The run the tuner times (after :meth:`run` has been checked): the launch as the
        compiled graph's wrapper makes it, so candidates are charged what the graph will pay.
        Default: :meth:`run`, into ``outs``."""
        return self.run(launch, inputs, outs)

    def error(self, problem: Any, result: Any, ref: Any, tf32: bool) -> tuple[float, float]:
        """(relative error of ``result`` against the float64 ``ref``, the tolerance it must be
        within)."""
        raise NotImplementedError(f"problem kind {self.name!r} cannot judge a result")

    def reference(self, problem: Any, inputs: Any, factory: Any) -> Any:
        """The float64 result for ``inputs`` (``factory`` builds launchers, e.g. of the ATen
        template)."""
        raise NotImplementedError(f"problem kind {self.name!r} has no reference")

    def special_inputs(self, problem: Any, device: Any, seed: int = 0) -> Any:
        """A second check input set with special values (inf, NaN, +-0, subnormals) mixed in,
        so a kernel that turns inf into NaN fails its check; None (the default) when the kind
        has none or the problem reads no float."""
        return None

    def special_reference(self, problem: Any, inputs: Any, factory: Any) -> Any:
        """The float64 reference on :meth:`special_inputs`, or None where it is no judge (the
        kind's ATen form, computing as eager does, disagrees with it there, so no candidate can
        be expected to match). Default: None."""
        return None

    # -- the compiler's side ----------------------------------------------------------------------
    def rewrite_dynamo(self, gm: Any) -> int:
        """Rewrite Dynamo's torch-level FX graph before aot_autograd traces it, in place (point a
        call at a function that traces into ops this kind lowers, where the ATen form would
        decompose into ops it cannot); returns the number of nodes changed. The rewritten graph
        must compute what the original does."""
        return 0

    def rewrite_fx(self, gm: Any) -> int:
        """Rewrite the ATen FX graph before lowering, in place (retarget ops, fold epilogues
        into them); returns the number of nodes changed."""
        return 0

    def lower(self, node: Any, index: int) -> Any:
        """The kernel-graph node for FX ``node`` when this kind takes it (``index``: how many
        nodes this kind lowered before in this graph, for naming), else None. Asked for every
        ``call_function`` node, the kinds in registration order (the first that takes it wins):
        GEMMs first."""
        return None

    def fuse(self, kg: Any, gm: Any) -> int:
        """Fuse what follows this kind's kernels into them in the lowered kernel graph ``kg``
        (of FX graph ``gm``), in place, before the loop kernels are formed (GEMMs: their
        epilogue chains; run when ``config.fuse_epilogues`` is on); returns the number of FX
        nodes absorbed. Default: nothing."""
        return 0

    def schedule(self, kg: Any, gm: Any) -> int:
        """Group this kind's nodes of the lowered kernel graph ``kg`` (from the ATen FX graph
        ``gm``) into kernels, in place, and return how many it made. The fuse stage asks every
        kind once the loop nodes are lowered (the loop kind fuses them into loop kernels,
        :mod:`tilewright.kinds.loop.fusion`). What it raises costs the graph's loop kernels, not
        the graph; a :class:`~tilewright.compiler.fallbacks.LoopBuildFailure` leaves the FX
        nodes it names to ATen and the stage runs again without them. Default: 0, nothing to
        group."""
        return 0

    def extern_label(self, node: Any) -> str | None:
        """The label (``ExternNode.kind``, shown in reports and graph listings) of an FX call
        left to ATen that is one of this kind's ops, e.g. an SDPA this kind did not lower:
        "attention"; None (the default) when it is not this kind's."""
        return None

    def owns(self, node: Any) -> bool:
        """Whether a node of a lowered and fused kernel graph is one of this kind's kernels."""
        from tilewright.compiler.graph import KernelNode  # the compiler imports this package

        return isinstance(node, KernelNode) and node.kind in self.names

    def problem_of(self, node: Any) -> Any:
        """The problem of a kernel node this kind owns, at its trace-time sizes (dynamic sizes
        at their bucket)."""
        return node.problem

    def capture(self, kg: Any) -> list[tuple[str, Any]]:
        """How ``tilewright aot`` and ``warm`` find this kind in a lowered and fused kernel
        graph: (node name, problem) of each of its kernels, in graph order."""
        return [(n.name, self.problem_of(n)) for n in kg.nodes if self.owns(n)]

    def capture_key(self, problem: Any) -> Any:
        """What makes two captured problems one kernel for ``tilewright aot``/``warm``."""
        return problem

    def call_options(self, node: Any) -> dict[str, Any]:
        """Extra facts the wrapper's call needs from the node (``KernelCall.options``)."""
        return {}

    # -- the wrapper's call at run time -----------------------------------------------------------
    def dims(self, problem: Any) -> tuple[str, ...]:
        """The sizes a compiled call keys its kernels on (the dynamic ones are bucketed)."""
        return tuple(sorted(problem.dynamic))

    def sizes(self, problem: Any) -> dict[str, int]:
        """The value of each of :meth:`dims` in ``problem``."""
        return {d: getattr(problem, d) for d in self.dims(problem)}

    def call_sizes(self, problem: Any, args: tuple) -> dict[str, int]:
        """The run-time value of each dynamic size, read off a call's arguments."""
        if problem.dynamic:
            raise NotImplementedError(f"problem kind {self.name!r} cannot read its dynamic sizes at run time")
        return {}

    def direct_entry(self, call: Any) -> Callable[..., Any] | None:
        """What the wrapper may call instead of :meth:`invoker` for ``call`` once its launcher is
        bound: an ATen op itself where the bound kernel is nothing but that op on a static
        problem (it fails where eager fails, so no rescue is lost); None (the default): the
        invoker."""
        return None

    def invoker(self, call: Any) -> Callable[..., Any]:
        """The function the wrapper's ``call`` runs for a
        :class:`~tilewright.compiler.dispatch.KernelCall`: by default ``launch(*args)`` of the
        kernel for the sizes :meth:`call_sizes` reads."""
        problem = call.problem

        def invoke(*args: Any) -> Any:
            launch = call._fast or call._launcher(self.call_sizes(problem, args))
            try:
                return launch(*args)
            except Exception as e:  # noqa: BLE001 - costs this bucket (KernelCall.rescue)
                return call.recover(self.call_sizes(problem, args), e, args)
        return invoke

    # -- reports and names ----------------------------------------------------------------------
    def report(self, node: Any, call: Any) -> Any:
        """What the graph report lists for one compiled kernel (a
        :class:`~tilewright.compiler.report.KernelReport`)."""
        from tilewright.compiler.report import KernelReport, candidate_reports  # compiler imports us

        sel = next(iter(call.selections.values()))
        rec = sel.winner_record
        p = call.problem
        return KernelReport(node=node.name, kind=p.kind, op=getattr(p, "op", "") or p.kind, members=0,
                            winner=sel.winner.name, reason=sel.reason, bytes=int(getattr(p, "min_bytes", 0)),
                            tune_seconds=sel.seconds, problem=p.describe(), problem_json=p.to_json(),
                            winner_ms=rec.median_ms if rec else None, candidates=candidate_reports(sel))

    def describe_short(self, problem: Any) -> str:
        """The problem in a table cell (``tilewright aot``'s table)."""
        return problem.describe()

    def aot_label(self, problem: Any) -> str:
        """The problem's part of an ahead-of-time kernel's folder name (no "/" or spaces)."""
        return f"{problem.kind}_{problem.stable_hash()[:8]}"

    def warm_problems(self, problem: Any) -> list[tuple[str, Any]]:
        """What ``tilewright warm`` tunes for a problem captured from a model: (name suffix,
        problem) pairs, at the sizes a compiled model looks up."""
        return [(self.aot_label(problem), problem)]

    def bucket_variants(self, problem: Any, max_m: int | None) -> list[tuple[str, Any]]:
        """The problems ``tilewright warm`` expands a dynamic problem to (name suffix, problem);
        default: the problem itself."""
        return [("", problem)]

    def __repr__(self) -> str:
        return f"<problem kind {'/'.join(self.names)}>"


class AtenOnlyPolicy:
    """The policy of a kind without one: its ATen template, nothing generated."""

    def __init__(self, kind: ProblemKind):
        self.kind = kind

    def candidates(self, problem: Any, target: Any) -> list[Any]:
        from tilewright.autotune.candidates import Candidate  # autotune imports this package
        from tilewright.templates import get_template

        aten = get_template(self.kind.aten_template_id(problem))
        return [Candidate.of(aten.id, aten.source_hash, {}, rank=0)]

    def ranked(self, problem: Any, target: Any, template: Any) -> list[tuple[float, dict]]:
        return []


# -- the registry -----------------------------------------------------------------------------------
_lock = threading.RLock()
_BY_NAME: dict[str, ProblemKind] = {}
_ORDER: list[ProblemKind] = []
_loaded = False
_loading = False

_REQUIRED = ("to_json", "from_json", "stable_hash", "describe", "with_sizes")


def _validate(kind: ProblemKind) -> None:
    if not kind.names or not all(isinstance(n, str) and n.isidentifier() for n in kind.names):
        raise ValueError(f"{type(kind).__name__}.names must be identifiers (the problem.kind values it owns), "
                         f"got {kind.names!r}")
    missing = [m for m in _REQUIRED if not hasattr(kind.problem_type, m)]
    if kind.problem_type is object or missing:
        raise ValueError(f"{type(kind).__name__}.problem_type {kind.problem_type.__name__} lacks "
                         f"{', '.join(missing or _REQUIRED)}: see ProblemKind's docstring")


def _add(kind: ProblemKind) -> None:
    taken = [n for n in kind.names if n in _BY_NAME and _BY_NAME[n] is not kind]
    if taken:
        raise ValueError(f"problem kind {', '.join(taken)} is already registered by {_BY_NAME[taken[0]]!r}; "
                         f"unregister_kind it first to replace it")
    if kind in _ORDER:
        return
    _ORDER.append(kind)
    for n in kind.names:
        _BY_NAME[n] = kind


def _load() -> None:
    """Register the built-in kinds, then the entry points' (once per process; other threads wait
    for it, and a kind module that asks the registry while loading does not recurse)."""
    global _loaded, _loading
    if _loaded:
        return
    with _lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            for module in BUILTIN:
                kind = importlib.import_module(f"{__name__}.{module}").KIND
                _validate(kind)
                _add(kind)
            _load_entry_points()
            _loaded = True
        except BaseException:
            _ORDER.clear()
            _BY_NAME.clear()
            raise
        finally:
            _loading = False


def _load_entry_points() -> list[ProblemKind]:
    """Register the kinds the ``tilewright.kinds`` entry points name (a kind object or class);
    one that fails to load or validate is skipped with a warning naming it."""
    added = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            kind = obj() if isinstance(obj, type) else obj
            _validate(kind)
            with _lock:
                _add(kind)
            added.append(kind)
        except Exception as e:  # noqa: BLE001 - a broken plug-in costs its kind, not tilewright
            log.warning("problem kind entry point %s (%s) not registered: %s: %s", ep.name, ep.value,
                        type(e).__name__, e)
    return added


def register_kind(kind: ProblemKind) -> ProblemKind:
    """Register a problem kind (an instance; a class is instantiated), after the built-in ones.

    Raises:
        ValueError: ``names`` or ``problem_type`` are not what :class:`ProblemKind` asks for, or a
            name is already registered by another kind.
    """
    kind = kind() if isinstance(kind, type) else kind
    _load()
    _validate(kind)
    with _lock:
        _add(kind)
    return kind


def unregister_kind(kind: ProblemKind) -> None:
    """Remove a registered kind (tests, plug-ins being unloaded); unknown kinds are ignored."""
    with _lock:
        if kind in _ORDER:
            _ORDER.remove(kind)
        for n in kind.names:
            if _BY_NAME.get(n) is kind:
                del _BY_NAME[n]


def kinds() -> list[ProblemKind]:
    """Every registered kind, each once, in registration order (the built-in ones first)."""
    _load()
    with _lock:
        return list(_ORDER)


def kind_names() -> list[str]:
    """Every registered ``problem.kind`` value."""
    _load()
    with _lock:
        return list(_BY_NAME)


def get_kind(name: str) -> ProblemKind:
    """The kind that owns ``problem.kind == name``.

    Raises:
        UnknownKindError: no registered kind owns it; the message lists those that are.
    """
    _load()
    try:
        return _BY_NAME[name]
    except (KeyError, TypeError):
        raise UnknownKindError(
            f"no problem kind {name!r} is registered (known: {', '.join(_BY_NAME)}); a kind outside "
            f"tilewright is registered with tilewright.kinds.register_kind or the "
            f"'{ENTRY_POINT_GROUP}' entry-point group") from None


def kind_name(problem: Any) -> str:
    """``problem.kind``: "gemm", "grouped_gemm", "pointwise", "reduction", ..."""
    return problem.kind


def kind_of(problem: Any) -> ProblemKind:
    """The registered kind of a problem (see :func:`get_kind` for the error)."""
    return get_kind(problem.kind)


def kind_of_node(node: Any) -> ProblemKind | None:
    """The kind whose kernel a kernel-graph node is (None for ATen calls and loop nodes)."""
    return next((k for k in kinds() if k.owns(node)), None)


def kernel_nodes(kg: Any) -> list[tuple[Any, ProblemKind]]:
    """The kernels of a lowered and fused kernel graph with their kinds, in graph order."""
    order = kinds()
    out = []
    for n in kg.nodes:
        kind = next((k for k in order if k.owns(n)), None)
        if kind is not None:
            out.append((n, kind))
    return out


def policy_for(name: str, target: Any) -> Any:
    """The candidate policy for problems of kind ``name`` on ``target`` (:meth:`ProblemKind.policy`)."""
    return get_kind(name).policy(name, target)


def problem_from_json(d: Mapping[str, Any]) -> Any:
    """A problem back from its ``to_json()``; JSON without a "kind" is a GEMM's (its JSON
    predates kinds, and tuning caches hold it so).

    Raises:
        UnknownKindError: the "kind" is not registered.
        ValueError, TypeError, KeyError: the JSON does not describe a problem of that kind.
    """
    if not isinstance(d, Mapping):
        raise ValueError(f"a problem's JSON is an object, got {type(d).__name__}")
    return get_kind(d.get("kind", "gemm")).from_json(d)


__all__ = [
    "AtenOnlyPolicy", "BUILTIN", "ENTRY_POINT_GROUP", "ProblemKind", "UnknownKindError",
    "get_kind", "kernel_nodes", "kind_name", "kind_names", "kind_of", "kind_of_node", "kinds", "policy_for",
    "problem_from_json", "register_kind", "unregister_kind",
]
