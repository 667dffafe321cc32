"""The performance gate of the eager FlyDSL overrides (``tilewright.kernels.rms_norm``, ``topk``; was
``tilewright.kernels.gate``):
a FlyDSL kernel replaces ATen only where it was measured faster.

The first call per (op, shape bucket, dtype, device arch) times the FlyDSL launcher and ATen
side by side: alternating calls on the same inputs (so clock and load drift hit both alike),
``GATE_WARMUP`` untimed calls each, then ``GATE_PAIRS`` timed pairs, medians compared, device
events with an L2 flush before each (:func:`tilewright.autotune.bench._time_once`). FlyDSL wins
only if its median is below ATen's by more than ``GATE_MARGIN`` (a tie goes to ATen: same speed,
fewer moving parts), and only if its result on the first call's inputs agreed with ATen's (the
op's ``agree`` rule) before anything was timed. The :class:`GateDecision` is kept for the
process, with the rules it was measured under (:func:`gate_rules`); a decision made under other
rules (another flydsl or torch, other gate constants) is measured again. A launcher that fails to build or to run, or disagrees
with ATen, decides ATen for that class, with one warning.

Decisions are in memory only: the tuning cache (``tilewright.autotune.cache``) keys records by a
problem kind that ``autotune/kinds.py`` can parse back, and top-k has none yet.

Everything device-specific goes through :func:`device_problem` and :data:`FLYDSL_BUILDERS`
(op -> builder of a launcher), the two seams the tests replace to exercise the gate on CPU.
"""

from __future__ import annotations

import statistics
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

GATE_PAIRS = 15       # timed (FlyDSL, ATen) pairs per decision
GATE_WARMUP = 3       # untimed calls of each first (FlyDSL's first call loads its code object)
GATE_MARGIN = 0.02    # FlyDSL must be this much faster (fraction of ATen's median) to be used
FLYDSL_ARCH = "gfx950"


class FlyDslUnavailable(RuntimeError):
    """A FlyDSL launcher cannot be built for this call (missing template, runtime, or shape)."""


def gate_rules() -> str:
    """The settings a decision depends on: gate constants, torch and flydsl versions."""
    from tilewright.templates.flydsl.runtime import dsl_version

    return (f"gate/1 pairs={GATE_PAIRS} warmup={GATE_WARMUP} margin={GATE_MARGIN} "
            f"torch={torch.__version__} flydsl={dsl_version()}")


@dataclass(frozen=True)
class GateKey:
    """One shape class: ``bucket`` is the op's own bucketing of the shape (rows bucketed)."""

    op: str
    bucket: tuple
    dtype: str
    arch: str


@dataclass(frozen=True)
class GateDecision:
    """What the gate measured for one :class:`GateKey`. ``path`` is "flydsl" or "aten"; times
    are medians in ms (None when FlyDSL failed before timing); ``rules`` per :func:`gate_rules`."""

    path: str
    reason: str
    flydsl_ms: float | None = None
    aten_ms: float | None = None
    pairs: int = 0
    rules: str = ""
    created: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Route:
    """Which path a call takes and why (``tilewright.kernels.explain_dispatch``).

    ``path``: "aten", "flydsl", or "gate" (the gate has not measured this class yet; the call
    will measure it, then run the winner). ``decision`` is the recorded one, if any.
    """

    op: str
    path: str
    reason: str
    key: GateKey | None = None
    decision: GateDecision | None = None

    def __str__(self) -> str:
        return f"{self.op}: {self.path} ({self.reason})"


# op -> builder(key, *args) -> launcher(*args) returning what ATen returns; raises
# FlyDslUnavailable (or anything) when it cannot. The ops register their real builders here.
FLYDSL_BUILDERS: dict[str, Callable[..., Callable[..., Any]]] = {}

_lock = threading.Lock()
_decisions: dict[GateKey, GateDecision] = {}
_launchers: dict[GateKey, Callable[..., Any]] = {}
_warned: set[GateKey] = set()


def device_problem(device: torch.device) -> str | None:
    """Why FlyDSL kernels cannot run on ``device`` (None when they can): not a ROCm GPU, not
    gfx950, or flydsl not installed."""
    from tilewright.templates.flydsl import runtime as fly

    if device.type != "cuda" or not getattr(torch.version, "hip", None):
        return f"the tensor is on {device.type}{' (CUDA)' if device.type == 'cuda' else ''}; " \
               f"FlyDSL kernels run on ROCm {FLYDSL_ARCH} only"
    arch = torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    if arch != FLYDSL_ARCH:
        return f"the device is {arch}; the FlyDSL kernels are built for {FLYDSL_ARCH}"
    if not fly.available():
        return fly.NOT_INSTALLED
    return None


def device_arch(device: torch.device) -> str:
    if device.type == "cuda" and getattr(torch.version, "hip", None):
        return torch.cuda.get_device_properties(device).gcnArchName.split(":")[0]
    return device.type


def decisions() -> dict[GateKey, GateDecision]:
    """A copy of this process's decisions."""
    with _lock:
        return dict(_decisions)


def reset() -> None:
    """Forget every decision, launcher and warning (tests; a changed environment)."""
    with _lock:
        _decisions.clear()
        _launchers.clear()
        _warned.clear()


def recorded(key: GateKey) -> GateDecision | None:
    """The decision for ``key`` if one was made under the current rules."""
    d = _decisions.get(key)
    return d if d is not None and d.rules == gate_rules() else None


def _median_pair(fly: Callable[[], Any], aten: Callable[[], Any], device: torch.device) -> tuple[float, float]:
    from tilewright.autotune.bench import _time_once

    gpu = device.type == "cuda"
    for _ in range(GATE_WARMUP):
        fly()
        aten()
    f_times, a_times = [], []
    for i in range(GATE_PAIRS):
        # alternate which goes first, so neither always follows the other's cache state
        order = ((f_times, fly), (a_times, aten)) if i % 2 == 0 else ((a_times, aten), (f_times, fly))
        for times, fn in order:
            times.append(_time_once(fn, gpu, device))
    return statistics.median(f_times), statistics.median(a_times)


def _fail(key: GateKey, what: str, e: BaseException) -> GateDecision:
    reason = (f"the FlyDSL kernel failed to {what} ({type(e).__name__}: {e}); "
              f"ATen is used for this shape class")
    if key not in _warned:
        _warned.add(key)
        warnings.warn(f"tilewright.kernels.{key.op}: {reason}", RuntimeWarning, stacklevel=4)
    return GateDecision("aten", reason, pairs=0, rules=gate_rules())


def _measure(key: GateKey, args: tuple, aten: Callable[..., Any], device: torch.device,
             agree: Callable[[Any, Any], str | None] | None) -> GateDecision:
    builder = FLYDSL_BUILDERS.get(key.op)
    if builder is None:
        return GateDecision("aten", f"no FlyDSL launcher is registered for {key.op}", rules=gate_rules())
    try:
        launcher = builder(key, *args)
    except FlyDslUnavailable as e:
        return GateDecision("aten", str(e), rules=gate_rules())
    except Exception as e:  # noqa: BLE001 - any build failure falls through to ATen
        return _fail(key, "build", e)
    try:
        mismatch = agree(launcher(*args), aten(*args)) if agree is not None else None
        if mismatch is None:
            fly_ms, aten_ms = _median_pair(lambda: launcher(*args), lambda: aten(*args), device)
    except Exception as e:  # noqa: BLE001 - a kernel that cannot run is never used
        return _fail(key, "run", e)
    if mismatch is not None:  # a wrong kernel is never used, however fast
        return _fail(key, "match ATen", ValueError(mismatch))
    _launchers[key] = launcher
    faster = fly_ms < aten_ms * (1 - GATE_MARGIN)
    reason = (f"measured FlyDSL {fly_ms:.4f} ms vs ATen {aten_ms:.4f} ms (medians of {GATE_PAIRS} "
              f"alternating pairs); {'FlyDSL' if faster else 'ATen'} is used"
              + ("" if faster else f" (FlyDSL must be > {GATE_MARGIN:.0%} faster)"))
    return GateDecision("flydsl" if faster else "aten", reason, fly_ms, aten_ms, GATE_PAIRS, gate_rules())


def run(key: GateKey, args: tuple, aten: Callable[..., Any], device: torch.device,
        agree: Callable[[Any, Any], str | None] | None = None) -> Any:
    """Run one call of a supported input through the gate: measure the class at its first call,
    then follow the decision. Returns what ``aten(*args)`` returns (or the FlyDSL kernel's).

    ``agree(flydsl_result, aten_result)`` says why the FlyDSL result is wrong (None when it is
    right); it is asked once, on the first call's inputs, before anything is timed.
    """
    with _lock:
        decision = recorded(key)
        if decision is None:
            decision = _decisions[key] = _measure(key, args, aten, device, agree)
        launcher = _launchers.get(key) if decision.path == "flydsl" else None
    if launcher is None:
        return aten(*args)
    try:
        return launcher(*args)
    except Exception as e:  # noqa: BLE001 - a kernel that stops working falls back for good
        with _lock:
            _decisions[key] = _fail(key, "run", e)
            _launchers.pop(key, None)
        return aten(*args)


def route(op: str, key: GateKey | None, why_not: str | None) -> Route:
    """The :class:`Route` of a call whose input checks gave ``key`` (None when unsupported, with
    ``why_not`` saying why)."""
    if key is None:
        return Route(op, "aten", why_not or "unsupported input")
    d = recorded(key)
    if d is None:
        return Route(op, "gate", "not measured yet: the first call times FlyDSL against ATen "
                                 "and uses FlyDSL only if it is faster", key)
    return Route(op, d.path, d.reason, key, d)


def bucket_rows(n: int) -> int:
    """Rows are bucketed to the next power of two (a row count in a bucket shares a decision)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()
