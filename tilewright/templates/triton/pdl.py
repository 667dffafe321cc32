"""PDL in the Triton templates: the ``PDL`` knob every Triton GEMM and loop template has, what it
renders, when it is legal and what the compiled kernel must then contain.

``PDL=True`` renders ``gdc_wait()`` before the kernel's first global access (loads of produced
inputs, stores that may overwrite what the previous kernel still reads, device-side descriptor
writes), ``gdc_launch_dependents()`` once its inputs are read (a GEMM: after its K loop; a loop
kernel: before its first store), and launches the kernel with ``launch_pdl=True``. The knob is
not tuned per kernel: the autotuner measures kernels one at a time, where PDL changes nothing.
Whether a kernel and the one before it overlap is an *edge* decision of the compiled graph
(:mod:`tilewright.compiler.pdl`), which sets the knob on both ends of each chosen edge.

What the installed Triton offers is checked here too (:func:`triton_pdl_refusal`; this was
``tilewright.runtime.pdl``). A kernel launched with PDL (``launch_pdl=True``: the CUDA launch
attribute ``programmaticStreamSerializationAllowed``) may start while the previous kernel on its
stream is still running, once every program of that kernel has executed
``griddepcontrol.launch_dependents`` (or finished). It must execute ``griddepcontrol.wait``
before it touches memory the previous kernel writes or reads: the wait returns when that kernel
has completed and its writes are visible. Triton spells the two ``tl.extra.cuda.gdc_wait()``
and ``gdc_launch_dependents()``; both are harmless in a kernel launched without PDL (PTX ISA,
"griddepcontrol"). Measured: triton 3.9 and 3.6 export both from ``triton.language.extra.cuda``
and take ``launch_pdl`` as a launch option of the CUDA backend (``CUDAOptions.launch_pdl``); the
interpreter cannot run them (a ``_semantic`` error), and AMD's backend has no such option.
Everything is checked, not assumed, so an older Triton simply gets no PDL.
"""

from __future__ import annotations

import dataclasses
import functools

from tilewright._config import config
from tilewright.runtime.targets import Target
from tilewright.templates.base import InstructionCheck, Knob, Params


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

PDL_KNOB = Knob("PDL", (False, True), False, PDL_DOC)
GDC = (r"griddepcontrol\.wait", r"griddepcontrol\.launch_dependents")
GDC_IMPORT = "from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait"


def pdl_refusal(params: Params, target: Target) -> str | None:
    """Why ``PDL=True`` cannot be rendered for ``target`` (None when it can, or PDL is off)."""
    if not params.get("PDL"):
        return None
    if config.pdl == "off":
        return "TILEWRIGHT_PDL=off rules out PDL=True"
    return triton_pdl_refusal(target)


def pdl_checks(params: Params, target: Target) -> list[InstructionCheck]:
    """A PDL kernel waits and releases; a kernel without PDL has neither instruction (CUDA only:
    other targets have no griddepcontrol)."""
    if target.backend != "cuda":
        return []
    if params.get("PDL"):
        return [InstructionCheck("ptx", GDC, (), "programmatic dependent launch (PDL=True)")]
    return [InstructionCheck("ptx", (), GDC, "a kernel without PDL (PDL=False)")]


def signal_before_stores(lines: list[str]) -> list[str]:
    """A loop kernel's body with ``gdc_launch_dependents()`` before its first top-level store
    (after the last one when none is at top level: a looped reduction stores inside its loop)."""
    for i, line in enumerate(lines):
        if line.startswith("tl.store("):
            return lines[:i] + ["gdc_launch_dependents()"] + lines[i:]
    return lines + ["gdc_launch_dependents()"]
