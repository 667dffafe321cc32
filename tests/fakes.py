"""A simulated device for autotuner tests: candidates whose behaviour is scripted (good, slow,
wrong, crashing, hanging, out of memory, leaving outputs unwritten) and a clock that reports each
candidate's scripted time times deterministic noise.

The factory is picklable, so the same simulation runs inside the tuning worker processes.
Candidates are named by ``params['name']`` (``FakePolicy``) or, for real policies, by
``Candidate.name``; a candidate without a scripted behaviour is good and takes its predicted
time (the cost model's), so the real policy can be driven through the simulation too.
"""

from __future__ import annotations

import ctypes
import os
import random
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from tilewright.autotune.bench import summarise
from tilewright.autotune.candidates import Candidate
from tilewright.autotune.inputs import GemmInputs
from tilewright.problem import GemmProblem

# behaviour kinds that are safe in-process, and those that only a worker process may meet
IN_PROCESS_FAULTS = ("wrong", "unwritten", "build_error", "run_error", "oom", "memory_error")
PROCESS_FAULTS = ("segfault", "abort", "exit", "hang_build", "hang_run")


def reference(problem: GemmProblem, inputs: GemmInputs) -> torch.Tensor:
    return inputs.a.double() @ inputs.b.double()


@dataclass
class Behaviour:
    """What a scripted candidate does: ``kind`` in good, wrong, unwritten, scribble (right,
    but writes into its input), scribble_late (the same, after its first run), scribble_raise
    (writes into its input, then raises), build_error,
    run_error, oom, memory_error, segfault, abort, exit, hang_build, hang_run; ``ms`` its true
    time."""

    kind: str = "good"
    ms: float = 1.0


def _name(cand: Candidate) -> str:
    if cand.template_id == "aten.gemm":
        return "aten"
    return cand.param_dict.get("name", cand.name)


@dataclass
class FakeFactory:
    """The simulated device. ``noise``: relative timing noise (uniform ±); ``seed`` seeds it
    per candidate, so a candidate's timings are the same in every process. ``build_log``: a file
    that gets one line per build ("<M>x<N>x<K> <name>"). ``hang_m``: every build for a problem
    with this M hangs (to kill a warmer mid-problem)."""

    behaviours: dict[str, Behaviour] = field(default_factory=dict)
    noise: float = 0.0
    seed: int = 0
    build_log: str = ""
    hang_m: int = -1
    builds: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    last_ms: float = 0.0
    last_name: str = ""

    def behaviour(self, cand: Candidate) -> Behaviour:
        b = self.behaviours.get(_name(cand))
        return b if b is not None else Behaviour("good", cand.predicted_ms or 1.0)

    def build(self, problem: GemmProblem, cand: Candidate, target) -> Callable:
        name = _name(cand)
        self.builds.append(name)
        if self.build_log:
            with open(self.build_log, "a") as f:
                f.write(f"{problem.M}x{problem.N}x{problem.K} {name}\n")
        if problem.M == self.hang_m:
            time.sleep(3600)
        b = self.behaviour(cand)
        if b.kind == "build_error":
            raise RuntimeError("ptxas fatal: simulated compile failure")
        if b.kind == "hang_build":
            time.sleep(3600)

        def launch(a, b_, *eps, out=None):
            self.last_ms, self.last_name = b.ms, name
            if b.kind == "run_error":
                raise RuntimeError("CUDA error: an illegal memory access was encountered (simulated)")
            if b.kind == "oom":
                raise torch.cuda.OutOfMemoryError(
                    "CUDA out of memory. Tried to allocate 80.00 GiB (simulated)")
            if b.kind == "memory_error":
                bytearray(1 << 62)  # a real MemoryError: no machine has 4 EiB
            if b.kind == "segfault":
                ctypes.string_at(0)  # a real SIGSEGV
            if b.kind == "abort":
                os.abort()
            if b.kind == "exit":
                os._exit(3)
            if b.kind == "hang_run":
                time.sleep(3600)
            res = (a.double() @ b_.double()).to(out.dtype if out is not None else a.dtype)
            if b.kind == "wrong":
                res = res * 1.1
            if b.kind == "scribble":  # right answer, but it leaves garbage in its input
                a.view(-1)[0] = float("nan") if a.is_floating_point() else 7
            if b.kind == "scribble_raise":  # writes into its input, then fails
                a.view(-1)[0] = 99.0
                raise RuntimeError("simulated failure after a stray write")
            if b.kind == "scribble_late" and self.calls.setdefault(name, 0) >= 1:
                a.view(-1)[-1] = 1234.5  # only after its checked first run
            self.calls[name] = self.calls.get(name, 0) + 1
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

    def timer(self, fns, device, *, warmup, rep, budget_ms, abort_above_ms=None, min_rep=1,
              stable_pct=0.0):
        """The simulated clock: runs the work once, then reports ``rep`` samples of the
        candidate's scripted time x (1 ± noise), seeded by (seed, candidate, rep)."""
        fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
        fns[0]()
        rng = random.Random(f"{self.seed}:{self.last_name}:{rep}")
        samples = [self.last_ms * (1 + rng.uniform(-self.noise, self.noise))
                   for _ in range(max(min(rep, 20), 1))]
        return summarise(samples)


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


def warm_factory() -> FakeFactory:
    """The simulated device for warmer subprocess tests, configured by the environment:
    FAKE_BUILD_LOG (file of builds), FAKE_HANG_M (hang on problems with this M)."""
    return FakeFactory(build_log=os.environ.get("FAKE_BUILD_LOG", ""),
                       hang_m=int(os.environ.get("FAKE_HANG_M", "-1")))
