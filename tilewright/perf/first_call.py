"""A backend's first call as a user meets it: compile and first call of one model suite case,
timed in a fresh process with empty caches.

Timed in one long process, a first call is not honest: whatever one-time work a backend does
(its imports; Inductor's C++ toolchain and ISA probes and its compile worker pool; our C++
toolchain probe) lands on the first case only, and in-memory caches carry from case to case.
Here every (case, backend) gets its own interpreter (:func:`first_call_s` starts it, :func:`main`
is what runs in it):

1. the case is built (its model, weights and inputs; untimed);
2. it is compiled with ``aot_eager`` and called once, untimed, so that Dynamo's own one-time
   warm-up (its imports, the first trace) lands on neither backend;
3. the clock starts, ``torch.compile(model, backend=...)`` and the first call run, the clock
   stops: the backend pays its own imports and one-time setup, as a user's first call does.

Caches start empty: tilewright's ``cache_dir`` (tuning records and built C++ kernels) and
Inductor's ``TORCHINDUCTOR_CACHE_DIR`` are fresh folders, and Inductor's FX graph and autograd
caches are off (``TORCHINDUCTOR_FX_GRAPH_CACHE=0``, ``TORCHINDUCTOR_AUTOGRAD_CACHE=0``). The
child inherits the environment, so ``TILEWRIGHT_*`` settings reach it; settings patched in the
parent's process (``config.patch``) do not.

The package's modules are compiled to bytecode first (:func:`compile_bytecode`), as installing
it does: run from a checkout under ``PYTHONDONTWRITEBYTECODE`` (this project's machines), each
child would otherwise compile every tilewright module from source, 0.3-0.8 s that neither an
installed tilewright nor torch (installed, so compiled) pays.

Before the clock starts the child has loaded torch, Dynamo, ``tilewright._config`` and
``tilewright.errors`` (the package's light top level) and the case's module; it reports which
tilewright modules those were (``preloaded``), so that a case that pulls in more (the demo
models import ``tilewright.demo``) says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TIMEOUT_S = 3600
_MARK = "tilewright-first-call:"


class FirstCallError(RuntimeError):
    """The child process failed: the message holds the last lines of its output."""


def first_call_s(suite: str, case: str, backend: str, *, cpu_threads: int, cache_dir: Path,
                 inductor_dir: Path, timeout_s: float = TIMEOUT_S) -> dict[str, Any]:
    """Compile and first call of ``case`` of ``suite`` with ``backend``, in a fresh process.

    Args:
        backend: a ``torch.compile`` backend name ("tilewright", "inductor", ...).
        cpu_threads: torch threads in the child (0: torch's default).
        cache_dir: tilewright's cache folder for the child (should be empty: the first call is
            then a cold one; it holds the child's tuning records and kernels afterwards).
        inductor_dir: ``TORCHINDUCTOR_CACHE_DIR`` for the child (likewise).

    Returns:
        ``{"first_call_s": seconds (wall), "cpu_s": CPU seconds of the child and its finished
        children over the same span (on a busy host wall time includes waiting for a core;
        worker processes still alive at the end are not counted), "preloaded": [tilewright
        modules loaded before the clock started]}``.

    Raises:
        FirstCallError: the child failed or ran past ``timeout_s``.
    """
    env = dict(os.environ, TILEWRIGHT_CACHE_DIR=str(cache_dir), TORCHINDUCTOR_CACHE_DIR=str(inductor_dir),
               TORCHINDUCTOR_FX_GRAPH_CACHE="0", TORCHINDUCTOR_AUTOGRAD_CACHE="0")
    cmd = [sys.executable, "-m", "tilewright.perf.first_call", suite, case, backend, str(cpu_threads)]
    # run from the folder holding this tilewright: ``-m`` puts the working folder first on the
    # path, so the child imports the same tilewright as this process whatever its own folder is
    root = Path(__file__).resolve().parents[2]
    try:
        proc = subprocess.run(cmd, env=env, cwd=str(root), capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise FirstCallError(f"{backend} first call of {case} ran past {timeout_s:.0f} s") from e
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(_MARK) and proc.returncode == 0:
            return json.loads(line[len(_MARK):])
    tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
    raise FirstCallError(f"{backend} first call of {case} failed (exit {proc.returncode}): {tail}"[:600])


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have finished (compiler runs)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def compile_bytecode() -> None:
    """Compile the tilewright package's modules to bytecode beside them (``__pycache__``, as
    ``pip install`` does; files already compiled are skipped). A package folder that cannot be
    written is left as it is."""
    import compileall

    try:
        compileall.compile_dir(str(Path(__file__).resolve().parents[1]), quiet=2)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    """The child: ``python -m tilewright.perf.first_call SUITE CASE BACKEND THREADS``; prints one
    line ``tilewright-first-call: {json}`` (see :func:`first_call_s`)."""
    suite, name, backend, threads = argv
    import torch
    import torch._dynamo

    from tilewright.perf.cpu_cases import find_case

    if int(threads):
        torch.set_num_threads(int(threads))
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
    setup = find_case(suite, name).build()
    setup.step(torch.compile(setup.make(), backend="aot_eager", fullgraph=setup.fullgraph))
    model = setup.make()
    preloaded = sorted(m for m in sys.modules if m.startswith("tilewright."))
    cpu0, t0 = _cpu_s(), time.perf_counter()
    compiled = torch.compile(model, backend=backend, fullgraph=setup.fullgraph)
    setup.step(compiled)
    seconds, cpu = time.perf_counter() - t0, _cpu_s() - cpu0
    print(_MARK + json.dumps({"first_call_s": seconds, "cpu_s": cpu, "preloaded": preloaded}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
