"""Timing a producer → consumer kernel pair with and without PDL (``TILEWRIGHT_PDL=auto``).

PDL changes nothing for a kernel timed alone, so the autotuner's one-kernel measurements cannot
choose it; what it saves (the consumer's launch and prologue overlapping the producer's tail)
only shows when the two run back to back. Each variant, both kernels plain and both with
``PDL=True``, is timed as one callable (the producer, then the consumer, each on inputs of its
own problem), in interleaved rounds so machine drift cancels; the decision keeps PDL when its
median is below the plain median by more than the larger spread. Results are kept per process.
Needs a CUDA device: on a CPU there is no PDL to measure.
"""

from __future__ import annotations

import statistics
from typing import Any

import torch

from tilewright.autotune.bench import time_callable
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.kinds import kind_of

ROUNDS = 5
_results: dict[tuple, tuple[float, float, float]] = {}


def _runner(problem: Any, candidate: Candidate, target: Any, device: torch.device, seed: int):
    from tilewright.compiler.kernel_factory import default_factory

    kind = kind_of(problem)
    launch = default_factory.build(problem, candidate, target)
    inputs = kind.make_inputs(problem, device, seed)
    outs = kind.poisoned(problem, device)
    return lambda: kind.run(launch, inputs, outs)


def measure_pair(producer: tuple[Any, Candidate], consumer: tuple[Any, Candidate], target: Any,
                 device: torch.device | str = "cuda") -> tuple[float, float, float]:
    """(plain ms, PDL ms, noise ms) of launching ``producer`` then ``consumer`` back to back.

    Raises:
        RuntimeError: no CUDA device.
    """
    from tilewright.compiler.pdl import with_pdl

    if not torch.cuda.is_available():
        raise RuntimeError("PDL pairs are timed on a CUDA device; this machine has none")
    key = (target.name, producer[0], producer[1].key, consumer[0], consumer[1].key)
    if key in _results:
        return _results[key]
    device = torch.device(device)
    variants = {}
    for on in (False, True):
        p = _runner(producer[0], with_pdl(producer[1], on), target, device, 0)
        c = _runner(consumer[0], with_pdl(consumer[1], on), target, device, 1)

        def pair(p=p, c=c):
            p()
            c()
        variants[on] = pair
    medians: dict[bool, list[float]] = {False: [], True: []}
    spreads: list[float] = []
    for _ in range(ROUNDS):
        for on, fn in variants.items():
            t = time_callable(fn, device, warmup=2, rep=20, budget_ms=50.0, min_rep=5)
            medians[on].append(t.median_ms)
            spreads.append(t.spread_ms)
    result = (statistics.median(medians[False]), statistics.median(medians[True]), max(spreads))
    _results[key] = result
    return result
