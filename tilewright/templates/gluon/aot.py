"""Gluon's ahead-of-time compile (``Language.aot_compile``): ``triton.compile`` of the job's
``@gluon.jit`` kernel through ``GluonASTSource``, the same build as Triton's
(:func:`tilewright.templates.triton.aot.compile_ast`)."""

from __future__ import annotations

from pathlib import Path

from tilewright.runtime.aot import CompileJob, CompileResult
from tilewright.templates.triton.aot import compile_ast


def compile_gluon(job: CompileJob, root: Path) -> CompileResult:
    """``triton.compile(GluonASTSource(...))`` of the job's ``@gluon.jit`` kernel for its target.

    Raises:
        Exception: whatever Triton's compiler raises (the worker reports it as the job's failure).
    """
    from triton.experimental.gluon._runtime import GluonASTSource

    return compile_ast(job, root, GluonASTSource)
