"""What a generated kernel's error status means: the exception its launcher raises.

Kernels that run on the CPU (C++, the Triton interpreter, SYCL's OpenCL CPU device, Metal run
on the host) cannot raise; a lane that meets an input eager refuses stores a status into a
one-element buffer, and the launcher raises the same exception type eager raises for it once
the kernel has finished. The compiled graph's run-time guard then reruns the graph on ATen,
so the user sees eager's own message (compiler/backend.py).
"""

from __future__ import annotations

ZERO_DIVISION = 1
INDEX = 2
NO_MEMORY = 3

ERR_MESSAGES = {
    ZERO_DIVISION: (RuntimeError, "ZeroDivisionError: integer division or remainder by zero"),
    INDEX: (IndexError, "index out of range in self (a gathered or scattered index outside its dim)"),
    NO_MEMORY: (MemoryError, "no memory for the kernel's row buffers"),
}
"""Kernel status -> the exception the launcher raises (as torch raises for the same input)."""

INPUT_ERRORS = frozenset({ZERO_DIVISION, INDEX})
"""Statuses eager raises for the same input (NO_MEMORY is the kernel's own failure)."""


def raise_status(status: int, op: str) -> None:
    """Raise what a kernel's non-zero ``status`` means (see :data:`ERR_MESSAGES`).

    Raises:
        RuntimeError: "ZeroDivisionError" (status 1), as eager's CPU integer division by 0.
        IndexError: an index outside its dim (status 2).
        MemoryError: status 3; RuntimeError for an unknown status.
    """
    cls, text = ERR_MESSAGES.get(status, (RuntimeError, f"unknown kernel status {status}"))
    error = cls(f"{text} (tilewright kernel {op})")
    if status in INPUT_ERRORS:  # the input's fault: the run-time fallbacks keep the kernel
        error.tilewright_input_error = True  # type: ignore[attr-defined]
    raise error


def is_input_error(error: BaseException) -> bool:
    """Whether ``error`` is a kernel's check of its input failing (raised by
    :func:`raise_status`: an index out of range, an integer division by zero), i.e. eager's own
    error for that input rather than a failure of the generated kernel (which is not raised
    for :data:`NO_MEMORY`)."""
    return bool(getattr(error, "tilewright_input_error", False))
