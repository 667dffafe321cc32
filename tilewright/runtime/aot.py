"""Ahead-of-time compile driver: rendered kernel source → PTX/cubin or AMDGCN/HSACO for a target
this machine does not have.

Each job is compiled by its language's compiler (``Language.aot_compile``, looked up by the
``AotSpec.language`` name in :mod:`tilewright.runtime.languages`), which lives in the language's
folder: ``triton.compile(ASTSource(...), target=GPUTarget(...))`` for Triton, Helion and Gluon
(:mod:`tilewright.templates.triton.aot`, :mod:`tilewright.templates.gluon.aot`), the rendered
module's own ``compile_aot(arch, dump_dir)`` for CuTeDSL (:mod:`tilewright.templates.cutedsl.runtime`,
whose ``cute.compile`` gets ``--gpu-arch`` explicitly), FlyDSL's compile-only driver for FlyDSL
(:mod:`tilewright.templates.flydsl.runtime`). This module holds what they share: the job and its
result, :func:`load_source`, :func:`sha256_file`, the build cache and the worker pool.
Jobs run in worker processes: some invalid AMD compiles abort the process (LLVM), and a hang must not stall the
build, so a crash or a timeout costs one kernel, and a fresh worker takes the next job. Every
stage's output (ttir or Gluon's IR, ttgir, llir, ptx/amdgcn, cubin/hsaco) is written next to
the source, with a
``job.json`` whose key hashes everything the artifacts depend on: a re-run with nothing changed
rebuilds nothing.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing as mp
import os
import signal
import time
import traceback
from dataclasses import asdict, dataclass, field
from functools import cached_property
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from tilewright._moved import moved_names
from tilewright.errors import RegistrationError

@dataclass(frozen=True)
class AotSpec:
    """How to compile a rendered kernel ahead of time with ``triton.compile``.

    Attributes:
        kernel: the ``@triton.jit`` / ``@gluon.jit`` function's name in the source (CuTeDSL:
            the ``@cute.jit`` host function, for the record).
        language: a registered language's name; its ``aot_compile`` builds the job ("triton",
            "gluon": ``ASTSource`` or ``GluonASTSource``; "cutedsl": the module's
            ``compile_aot(options["gpu_arch"], dump_dir)``; "flydsl": compile-only in a child
            process, :mod:`tilewright.templates.flydsl.runtime`).
        pointer_types: pointer arguments and their Triton types ("*bf16", "*fp32", ...).
        constexprs: values of constexpr arguments, and of int arguments specialised as the JIT
            would (a stride known to be 1).
        divisible_by_16: arguments assumed to be multiples of 16 (pointers, sizes, strides):
            the alignment facts that let the compiler vectorise and use TMA/TDM.
        options: compile options (num_warps, num_stages; CuTeDSL: gpu_arch).
        int_type: the type of every other argument.
    """

    kernel: str
    language: str
    pointer_types: Mapping[str, str]
    constexprs: Mapping[str, Any]
    divisible_by_16: tuple[str, ...]
    options: Mapping[str, Any]
    int_type: str = "i32"

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "language": self.language,
                "pointer_types": dict(self.pointer_types),
                "constexprs": {k: list(v) if isinstance(v, tuple) else v for k, v in self.constexprs.items()},
                "divisible_by_16": list(self.divisible_by_16), "options": dict(self.options),
                "int_type": self.int_type}


@dataclass(frozen=True)
class CompileJob:
    """One kernel to build for one target.

    Attributes:
        name: unique, filesystem-safe label (also the artifact folder's name).
        source: the rendered module's Python source.
        spec: ``AotSpec.to_json()`` of the rendering: kernel name, language, argument types,
            constexprs, alignment facts, options.
        target: (backend, arch, warp_size) for ``GPUTarget``.
    """

    name: str
    source: str
    spec: dict[str, Any]
    target: tuple[str, Any, int]

    @cached_property
    def key(self) -> str:
        """Hash of everything the artifacts depend on: source, spec, target, the triton version
        and the versions the job's language names (``Language.versions``: nvidia-cutlass-dsl's
        for CuTeDSL, flydsl's for FlyDSL). Computed once (in the parent: it travels with the
        job to the worker)."""
        import triton

        from tilewright.runtime.languages import get_language

        facts = {"source": self.source, "spec": self.spec, "target": list(self.target),
                 "triton": triton.__version__}
        facts.update(get_language(self.spec.get("language", "triton")).versions())
        blob = json.dumps(facts, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:24]


@dataclass
class CompileResult:
    """What building one job gave. ``status``: built, cached, failed (compiler error), crashed
    (the worker died), timeout. ``artifacts``: stage → path relative to the output folder;
    ``hashes``: stage → sha256 of the file; ``seconds``: wall time of the compile."""

    name: str
    key: str
    status: str
    seconds: float = 0.0
    artifacts: dict[str, str] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status in ("built", "cached")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sha256_file(path: Path) -> str:
    """The sha256 hex digest of a file's bytes (an artifact's hash in ``job.json``)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()



def cached_result(job: CompileJob, root: Path) -> CompileResult | None:
    """The previous build of this exact job, if its record and every artifact are still there."""
    record = root / job.name / "job.json"
    try:
        data = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if data.get("key") != job.key or data.get("status") != "built":
        return None
    for rel, digest in zip(data["artifacts"].values(), data["hashes"].values()):
        p = root / rel
        if not p.is_file() or sha256_file(p) != digest:
            return None
    data["status"] = "cached"
    data["seconds"] = 0.0
    return CompileResult(**data)


# -- the worker ------------------------------------------------------------------------------------
# the languages' compilers that lived here, now in their folders (removed in the next release)
_MOVED = {"compile_triton": "tilewright.templates.triton.aot",
          "compile_gluon": "tilewright.templates.gluon.aot"}


__getattr__ = moved_names(__name__, _MOVED)


def load_source(job: CompileJob, folder: Path) -> tuple[Any, Path]:
    """Write the job's source to ``folder/kernel.py`` and import it; returns (module, path).
    What each language's ``aot_compile`` starts with."""
    import importlib.util

    folder.mkdir(parents=True, exist_ok=True)
    src_path = folder / "kernel.py"
    src_path.write_text(job.source)
    spec = importlib.util.spec_from_file_location(f"tw_aot_{job.key}", src_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module, src_path


def _compiler_of(job: CompileJob) -> Callable[[CompileJob, Path], CompileResult] | str:
    """The job's language's ``aot_compile``, or why there is none (looked up in the parent,
    where the languages are registered, and sent to the worker with the job)."""
    from tilewright.runtime.languages import get_language

    name = job.spec.get("language", "triton")
    try:
        lang = get_language(name)
    except RegistrationError as e:
        return str(e)
    return lang.aot_compile or f"language {name!r} has no ahead-of-time compiler"


_STARTED = "started"  # a worker's word that it has the job (its imports are done)


def _worker_main(conn: Connection, root: str) -> None:
    os.environ["TRITON_INTERPRET"] = "0"
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        job, compile_fn = msg
        # the job's clock starts now: a fresh worker's imports (torch, triton: tens of seconds
        # on a loaded machine) are not the job's compile time
        conn.send(_STARTED)
        try:
            if isinstance(compile_fn, str):
                raise RuntimeError(compile_fn)
            result = compile_fn(job, Path(root))
        except Exception as e:  # noqa: BLE001 - any compiler error is this job's failure
            tb = traceback.format_exc(limit=-4)
            result = CompileResult(job.name, job.key, "failed", error=f"{type(e).__name__}: {e}\n{tb}"[-4000:])
        conn.send(result)
    conn.close()
    os._exit(0)  # skip interpreter teardown (triton's bindings print leak warnings there)


# -- the pool ----------------------------------------------------------------------------------------
class _Worker:
    def __init__(self, ctx, root: Path):
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child, str(root)), daemon=True)
        self.proc.start()
        child.close()
        self.job: CompileJob | None = None
        self.started = 0.0

    def stop(self, kill: bool = False) -> None:
        if kill and self.proc.is_alive():
            self.proc.kill()
        else:
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


def _death(proc: mp.Process) -> str:
    proc.join(5)  # exitcode is only set once the process is reaped
    code = proc.exitcode
    if code is not None and code < 0:
        try:
            return f"worker killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"worker killed by signal {-code}"
    return f"worker exited with code {code}"


def compile_jobs(jobs: Iterable[CompileJob], root: Path | str, *, workers: int = 2,
                 timeout_s: float = 600.0,
                 on_result: Callable[[CompileResult], None] | None = None) -> list[CompileResult]:
    """Build every job into ``root/<job.name>/``, ``workers`` at a time.

    Jobs already built with the same key are reused ("cached"). A job whose worker crashes or
    runs past ``timeout_s`` seconds is reported as "crashed"/"timeout" and the rest go on.
    Results come back in job order; ``on_result`` sees each as it lands (for progress bars).
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    jobs = list(jobs)
    results: dict[str, CompileResult] = {}
    pending: list[CompileJob] = []
    unknown: list[CompileResult] = []
    for job in jobs:
        try:
            job.key  # noqa: B018 - computed here, where the languages are registered; it travels with the job
        except RegistrationError as e:  # a job of a language nobody registered costs that job
            unknown.append(CompileResult(job.name, "", "failed", error=str(e)))
            continue
        hit = cached_result(job, root)
        if hit is not None:
            results[job.name] = hit
            if on_result:
                on_result(hit)
        else:
            pending.append(job)

    def finish(result: CompileResult) -> None:
        results[result.name] = result
        record = root / result.name / "job.json"
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(result.to_json(), indent=1))
        if on_result:
            on_result(result)

    for result in unknown:
        finish(result)
    ctx = mp.get_context("spawn")
    pool: list[_Worker] = []
    try:
        pool = [_Worker(ctx, root) for _ in range(max(1, min(workers, len(pending))))] if pending else []
        queue = list(reversed(pending))
        while queue or any(w.job for w in pool):
            for w in pool:
                if w.job is None and queue:
                    w.job, w.started = queue.pop(), time.monotonic()
                    w.conn.send((w.job, _compiler_of(w.job)))
            busy = [w for w in pool if w.job is not None]
            ready = wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=1.0)
            for i, w in enumerate(pool):
                if w.job is None:
                    continue
                job = w.job
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                        if msg == _STARTED:
                            w.started = time.monotonic()
                        else:
                            finish(msg)
                            w.job = None
                        continue
                    except (EOFError, OSError):
                        pass
                dead = w.proc.sentinel in ready or not w.proc.is_alive()
                late = time.monotonic() - w.started > timeout_s
                if dead or late:
                    status = "crashed" if dead else "timeout"
                    why = _death(w.proc) if dead else f"no result after {timeout_s:.0f} s"
                    w.stop(kill=True)
                    finish(CompileResult(job.name, job.key, status,
                                         seconds=time.monotonic() - w.started, error=why))
                    pool[i] = _Worker(ctx, root)
    finally:
        for w in pool:
            w.stop()
    return [results[j.name] for j in jobs]
