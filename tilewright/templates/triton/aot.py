"""Triton's ahead-of-time compile (``Language.aot_compile``): ``triton.compile(ASTSource(...),
target=GPUTarget(...))`` of a rendering's ``@triton.jit`` kernel for a target this machine does
not have, every stage's output (ttir, ttgir, llir, ptx/amdgcn, cubin/hsaco) written beside the
source. Run in a worker of :func:`tilewright.runtime.aot.compile_jobs`; the Gluon and Helion
folders build their kernels through :func:`compile_ast` too (both are compiled by
``triton.compile``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from tilewright.runtime.aot import CompileJob, CompileResult, load_source, sha256_file


def compile_triton(job: CompileJob, root: Path) -> CompileResult:
    """``triton.compile(ASTSource(...))`` of the job's ``@triton.jit`` kernel for its target.

    Raises:
        Exception: whatever Triton's compiler raises (the worker reports it as the job's failure).
    """
    from triton.compiler import ASTSource

    return compile_ast(job, root, ASTSource)


def compile_ast(job: CompileJob, root: Path, Source: Any) -> CompileResult:
    """Build ``job`` into ``root/<job.name>/`` with ``triton.compile(Source(fn, signature,
    constexprs, attrs))``, ``Source`` being Triton's ``ASTSource`` or a dialect's (Gluon's
    ``GluonASTSource``): the signature, constexprs and 16-byte divisibility facts come from the
    job's ``AotSpec``, the target from ``job.target``."""
    import triton
    from triton.backends.compiler import GPUTarget

    folder = root / job.name
    t0 = time.perf_counter()
    module, src_path = load_source(job, folder)
    s = job.spec
    fn = getattr(module, s["kernel"])
    constexprs = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v
                  for k, v in s["constexprs"].items()}
    signature = {n: s["pointer_types"].get(n) or ("constexpr" if n in constexprs else s["int_type"])
                 for n in fn.arg_names}
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in s["divisible_by_16"] if n in fn.arg_names and n not in constexprs}
    compiled = triton.compile(Source(fn, signature, constexprs, attrs),
                              target=GPUTarget(*job.target), options=dict(s["options"]))
    seconds = time.perf_counter() - t0
    artifacts, hashes = {"source": f"{job.name}/kernel.py"}, {"source": sha256_file(src_path)}
    for stage, data in compiled.asm.items():
        if stage == "source" or not isinstance(data, (str, bytes)):
            continue
        path = folder / f"kernel.{stage}"
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        artifacts[stage] = f"{job.name}/{path.name}"
        hashes[stage] = sha256_file(path)
    meta = compiled.metadata
    metadata = {k: getattr(meta, k) for k in ("shared", "num_warps", "num_stages", "name")
                if hasattr(meta, k)}
    return CompileResult(job.name, job.key, "built", seconds, artifacts, hashes, metadata)
