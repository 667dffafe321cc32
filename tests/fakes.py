"""A simulated device for autotuner tests: candidates whose behaviour is scripted (good, slow,
wrong, crashing at build or run, leaving outputs unwritten) and timings from a deterministic cost
plus injected noise."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable

import torch

from tilewright.autotune.bench import Timing
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import GemmInputs
from tilewright.problem import GemmProblem


def reference(problem: GemmProblem, inputs: GemmInputs) -> torch.Tensor:
    return inputs.a.double() @ inputs.b.double()


@dataclass
class Behaviour:
    """What a scripted candidate does: ``kind`` in good, wrong, unwritten, build_error,
    run_error; ``ms`` its true time."""

    kind: str = "good"
    ms: float = 1.0


@dataclass
class FakeFactory:
    behaviours: dict[str, Behaviour]
    builds: list[str] = field(default_factory=list)
    last_ms: float = 0.0

    def build(self, problem: GemmProblem, cand: Candidate, target) -> Callable:
        name = cand.param_dict.get("name", "aten")
        self.builds.append(name)
        b = self.behaviours[name]
        if b.kind == "build_error":
            raise RuntimeError("ptxas fatal: simulated compile failure")

        def launch(a, b_, *eps, out=None):
            self.last_ms = b.ms
            if b.kind == "run_error":
                raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
            res = (a.double() @ b_.double()).to(out.dtype if out is not None else a.dtype)
            if b.kind == "wrong":
                res = res * 1.1
            if out is None:
                return res
            if b.kind == "unwritten":
                out[: out.shape[0] // 2].copy_(res[: out.shape[0] // 2])
            else:
                out.copy_(res)
            return out

        return launch

    def reference(self, problem, inputs):
        return reference(problem, inputs)


class FakePolicy:
    """Candidates named in ``params['name']``, ranked in the order given."""

    def __init__(self, names: list[str], hashes: dict[str, str] | None = None):
        self.names = names
        self.hashes = hashes or {}

    def candidates(self, problem, target):
        return [Candidate.of("triton.gemm" if n != "aten" else "aten.gemm",
                             self.hashes.get(n, "h0"), {} if n == "aten" else {"name": n}, rank=i,
                             predicted_ms=float(i))
                for i, n in enumerate(self.names)]


def noisy_timer(factory: FakeFactory, noise: float, seed: int):
    """A stand-in for ``time_callable``: the candidate's true time times (1 ± noise)."""
    rng = random.Random(seed)

    def time_callable(fn, device, *, warmup, rep, budget_ms, abort_above_ms=None):
        fn()
        ms = factory.last_ms
        samples = [ms * (1 + rng.uniform(-noise, noise)) for _ in range(max(rep, 1))]
        samples.sort()
        spread = (samples[3 * len(samples) // 4] - samples[len(samples) // 4]) / 2
        return Timing(samples[len(samples) // 2], spread, len(samples))

    return time_callable
