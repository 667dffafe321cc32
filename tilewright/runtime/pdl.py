"""Programmatic dependent launch (PDL) for Triton kernels: what the installed Triton offers.

A kernel launched with PDL (``launch_pdl=True``: the CUDA launch attribute
``programmaticStreamSerializationAllowed``) may start while the previous kernel on its stream is
still running, once every program of that kernel has executed ``griddepcontrol.launch_dependents``
(or finished). It must execute ``griddepcontrol.wait`` before it touches memory the previous
kernel writes or reads: the wait returns when that kernel has completed and its writes are
visible. Triton spells the two ``tl.extra.cuda.gdc_wait()`` and ``gdc_launch_dependents()``;
both are harmless in a kernel launched without PDL (PTX ISA, "griddepcontrol").

Measured: triton 3.9 (this machine) and 3.6 (the GPU machine) export both from
``triton.language.extra.cuda`` and take ``launch_pdl`` as a launch option of the CUDA backend
(``CUDAOptions.launch_pdl``); the interpreter cannot run them (a ``_semantic`` error), and
AMD's backend has no such option. Everything here is checked, not assumed, so an older Triton
simply gets no PDL.
"""

from __future__ import annotations

import dataclasses
import functools

from tilewright.runtime.targets import Target


@functools.lru_cache(maxsize=None)
def triton_gdc() -> bool:
    """Whether ``triton.language.extra.cuda`` has ``gdc_wait`` and ``gdc_launch_dependents``."""
    try:
        from triton.language.extra import cuda
    except ImportError:
        return False
    return hasattr(cuda, "gdc_wait") and hasattr(cuda, "gdc_launch_dependents")


@functools.lru_cache(maxsize=None)
def triton_launch_pdl() -> bool:
    """Whether Triton's CUDA backend takes the ``launch_pdl`` launch option."""
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:
        return False
    return any(f.name == "launch_pdl" for f in dataclasses.fields(CUDAOptions))


def triton_pdl_refusal(target: Target) -> str | None:
    """Why a Triton kernel for ``target`` cannot use PDL (None when it can)."""
    if target.interpreted:
        return "the Triton interpreter cannot run griddepcontrol (PDL is a GPU launch property)"
    if target.backend != "cuda" or not target.has("pdl"):
        return f"{target.name} has no programmatic dependent launch (griddepcontrol needs sm_90 or later)"
    if not triton_gdc():
        return "this triton has no tl.extra.cuda.gdc_wait / gdc_launch_dependents"
    if not triton_launch_pdl():
        return "this triton's CUDA backend takes no launch_pdl option"
    return None


PDL_DOC = ("programmatic dependent launch: griddepcontrol.wait before the first global access, "
           "launch_dependents once the inputs are read, launched with launch_pdl")
