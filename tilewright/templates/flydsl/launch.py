"""Launching rendered FlyDSL kernels: what each template module's ``launch(...)`` calls once it
has mapped torch tensors onto its ``@flyc.jit`` host function's parameters.

FlyDSL's JIT entry (``flydsl.compiler``, 0.5.0, read from the installed package): calling a
``@flyc.jit`` function traces its Python body every time, then looks the artifact up;
``flyc.compile(fn, *args)`` traces and builds once and returns a ``CompiledFunction`` whose
calls skip the trace (positional arguments only, the same specialisation). A torch tensor
becomes a memref whose shapes and strides are run-time values, except its first unit-stride
dim, which is static (so a tensor needs one; the specialisation changes with which dim it is);
a Python ``int`` becomes a run-time ``Int32``; the ``stream`` parameter takes ``None`` (the
default queue) or any object with a ``cuda_stream`` handle, such as ``torch.cuda.current_stream``
on a ROCm build of torch. ``flyc.compile`` with live device tensors also runs that first call.
With ``COMPILE_ONLY=1`` it traces and compiles and runs nothing, which is how tilewright builds
FlyDSL kernels ahead of time on a machine with no GPU: each module's ``compile_aot()`` calls its
own ``launch`` with CPU placeholder tensors (:mod:`tilewright.templates.flydsl.runtime` runs it in a
child process), so the AOT build goes through the same argument mapping as a device launch.

:func:`run` is the one place a FlyDSL kernel is started: it appends the current stream of the
tensors' device, then (in order) hands the call to a stand-in when one is installed
(:func:`record_launches`, the tests' recording stand-in), compiles it under ``COMPILE_ONLY``, or
compiles once per specialisation and launches on a ROCm gfx950 device. Nothing here imports
FlyDSL until a kernel is compiled.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from tilewright.errors import EnvironmentMismatchError, InvalidInputError

ARCH = "gfx950"
INT32_MIN, INT32_MAX = -2**31, 2**31 - 1

_lock = threading.Lock()
_compiled: dict[tuple, Any] = {}
_stand_in: Callable[[Any, tuple], None] | None = None


def compile_only() -> bool:
    """Whether FlyDSL is in compile-only mode (``COMPILE_ONLY`` set truthy): trace and build,
    never run (FlyDSL reads the variable at each call)."""
    return os.environ.get("COMPILE_ONLY", "").strip().lower() in ("1", "true", "yes", "on")


def current_stream(device: torch.device) -> Any:
    """The stream argument for a launch on ``device``: torch's current stream there (FlyDSL
    passes its ``cuda_stream`` handle, a HIP stream on a ROCm build), or None (FlyDSL's
    default queue) for CPU placeholders, which are only ever compiled."""
    if device.type == "cuda":
        return torch.cuda.current_stream(device)
    return None


def device_arch(device: torch.device) -> str:
    """The AMD architecture of a ROCm ``device`` ("gfx950"; torch's ``gcnArchName`` without
    its feature suffix)."""
    return torch.cuda.get_device_properties(device).gcnArchName.split(":", 1)[0]


def device_problem(device: torch.device) -> str | None:
    """Why a FlyDSL kernel cannot run on ``device`` in this process (None when it can): FlyDSL
    missing, not a ROCm build of torch, not a GPU tensor, a GPU other than gfx950, or CuTeDSL's
    MLIR already in this process."""
    from tilewright.templates.flydsl.runtime import NOT_INSTALLED, available, mlir_conflict

    if not available():
        return NOT_INSTALLED
    if device.type != "cuda":
        return f"FlyDSL kernels run on a ROCm {ARCH} GPU; these tensors are on {device}"
    if getattr(torch.version, "hip", None) is None:
        return f"FlyDSL kernels need a ROCm build of torch (a {ARCH} GPU); this torch is built for CUDA"
    arch = device_arch(device)
    if arch != ARCH:
        return f"this FlyDSL kernel was written for {ARCH}; {device} is {arch}"
    return mlir_conflict()


def specialisation(call: tuple) -> tuple:
    """What a ``CompiledFunction`` is specialised on, per argument: a tensor's dtype, rank and
    first unit-stride dim; a scalar's type (its value is a run-time argument)."""
    out = []
    for a in call:
        if isinstance(a, torch.Tensor):
            unit = next((i for i, s in enumerate(a.stride()) if s == 1), -1)
            out.append(("tensor", a.dtype, a.dim(), unit))
        else:
            out.append(type(a).__name__)
    return tuple(out)


def signature_of(entry: Any) -> inspect.Signature:
    """The parameters of a ``@flyc.jit`` host function (or a plain function standing in for one)."""
    return inspect.signature(getattr(entry, "func", entry))


def entry_name(entry: Any) -> str:
    """The host function's name (a ``JitFunction`` keeps the function as ``.func``)."""
    return getattr(getattr(entry, "func", entry), "__name__", str(entry))


def _kind(annotation: Any) -> str:
    return getattr(annotation, "__name__", str(annotation))


def call_problems(entry: Any, call: tuple, device: torch.device) -> list[str]:
    """Every way ``call`` does not fit ``entry``'s signature (empty when it fits): the count,
    and per parameter its annotation against the value: ``Tensor`` a torch tensor on ``device``
    with a unit-stride dim (FlyDSL's dynamic-layout rule), ``Int32`` an int in range, ``Stream``
    None or a stream handle, and on a GPU the current stream of ``device``."""
    params = list(signature_of(entry).parameters.values())
    if len(call) != len(params):
        return [f"{len(call)} arguments for {len(params)} parameters ({', '.join(p.name for p in params)})"]
    problems = []
    for p, v in zip(params, call):
        kind = _kind(p.annotation)
        if kind == "Tensor":
            if not isinstance(v, torch.Tensor):
                problems.append(f"{p.name}: a tensor expected, got {type(v).__name__}")
            elif v.device != device:
                problems.append(f"{p.name}: on {v.device}, the launch is on {device}")
            elif v.dim() and 1 not in v.stride():
                problems.append(f"{p.name}: strides {v.stride()} have no unit-stride dim (FlyDSL needs one)")
        elif kind in ("Int32", "Int64"):
            lo, hi = (INT32_MIN, INT32_MAX) if kind == "Int32" else (-2**63, 2**63 - 1)
            if isinstance(v, bool) or not isinstance(v, int):
                problems.append(f"{p.name}: an int expected, got {type(v).__name__}")
            elif not lo <= v <= hi:
                problems.append(f"{p.name}: {v} is outside {kind}")
        elif kind == "Stream":
            if device.type == "cuda":
                if v is None or getattr(v, "cuda_stream", None) != torch.cuda.current_stream(device).cuda_stream:
                    problems.append(f"{p.name}: not the current stream of {device}")
            elif v is not None and not hasattr(v, "cuda_stream"):
                problems.append(f"{p.name}: None or a stream expected, got {type(v).__name__}")
        else:
            problems.append(f"{p.name}: annotation {kind} is not one the launchers pass")
    return problems


def _ensure_rocm_env(device: torch.device) -> None:
    """Name the arch and the ROCm folder for FlyDSL when the user has not: FlyDSL otherwise asks
    ``rocm_agent_enumerator`` and falls back to gfx942 silently."""
    from tilewright.templates.flydsl.runtime import rocm_root

    os.environ.setdefault("FLYDSL_GPU_ARCH", device_arch(device))
    os.environ.setdefault("ROCM_PATH", str(rocm_root()))


def run(entry: Any, args: tuple | list, device: torch.device) -> None:
    """Launch the ``@flyc.jit`` host function ``entry`` with ``args`` (its parameters in order,
    the stream left out) on the current stream of ``device``.

    A recording stand-in (:func:`record_launches`) takes the call when installed; under
    ``COMPILE_ONLY`` the call is traced and compiled, not run; otherwise the first call per
    specialisation compiles (and runs) through ``flyc.compile``, later ones call the compiled
    function directly.

    Raises:
        EnvironmentMismatchError: no FlyDSL, not a ROCm gfx950 device (the message says which).
        InvalidInputError: the arguments do not fit ``entry``'s parameters (a launcher bug).
    """
    call = (*args, current_stream(device))
    if _stand_in is not None:
        _stand_in(entry, call)
        return
    if compile_only():
        from tilewright.templates.flydsl.runtime import mlir_conflict

        if (why := mlir_conflict()) is not None:
            raise EnvironmentMismatchError(why)
        import flydsl.compiler as flyc

        flyc.compile(entry, *call)
        return
    # refused before FlyDSL is imported: its MLIR bindings abort the process when another MLIR
    # (CuTeDSL's) is already loaded in it, and a refusal must cost nothing
    why = device_problem(device)
    if why:
        raise EnvironmentMismatchError(why)
    import flydsl.compiler as flyc

    key = (id(entry), device.index, specialisation(call))
    fn = _compiled.get(key)
    if fn is None:
        with _lock:
            fn = _compiled.get(key)
            if fn is None:
                problems = call_problems(entry, call, device)
                if problems:
                    raise InvalidInputError(f"tilewright: FlyDSL launch of {entry_name(entry)}: "
                                            + "; ".join(problems))
                _ensure_rocm_env(device)
                _compiled[key] = flyc.compile(entry, *call)  # compiles, and runs this first call
                return
    fn(*call)


@dataclass
class LaunchRecord:
    """One launch a stand-in received: the host function's name, its parameter names and
    annotations, the arguments (stream last) and what :func:`call_problems` found."""

    entry: str
    params: list[str]
    annotations: list[str]
    call: tuple
    problems: list[str] = field(default_factory=list)

    def arg(self, name: str) -> Any:
        return self.call[self.params.index(name)]


@contextlib.contextmanager
def stand_in(fn: Callable[[Any, tuple], None]) -> Iterator[None]:
    """Hand every :func:`run` in the block to ``fn(entry, call)`` instead of FlyDSL (``call``:
    the host function's arguments, stream last). The tests run the rendered source through a
    CPU interpreter of the FlyDSL surface this way, and :func:`record_launches` records."""
    global _stand_in
    with _lock:
        previous, _stand_in = _stand_in, fn
    try:
        yield
    finally:
        with _lock:
            _stand_in = previous


@contextlib.contextmanager
def record_launches(*, compile: bool = False, device: torch.device | None = None) -> Iterator[list[LaunchRecord]]:
    """A recording stand-in for the launch, for the block: each :func:`run` appends a
    :class:`LaunchRecord` (checked against the host function's signature) to the yielded list
    instead of starting a kernel; with ``compile`` it then traces and compiles the same call
    through ``flyc.compile`` (``COMPILE_ONLY=1`` must be set: nothing may run). ``device`` is
    where the tensors are expected (the first tensor's device by default)."""
    records: list[LaunchRecord] = []

    def record(entry: Any, call: tuple) -> None:
        params = list(signature_of(entry).parameters.values())
        dev = device or next((a.device for a in call if isinstance(a, torch.Tensor)), torch.device("cpu"))
        records.append(LaunchRecord(entry_name(entry), [p.name for p in params],
                                    [_kind(p.annotation) for p in params], call,
                                    call_problems(entry, call, dev)))
        if compile:
            if not compile_only():
                raise RuntimeError("record_launches(compile=True) needs COMPILE_ONLY=1: nothing may run")
            import flydsl.compiler as flyc

            flyc.compile(entry, *call)

    with stand_in(record):
        yield records


# -- argument helpers the launchers share ----------------------------------------------------------
def flat_view(t: torch.Tensor) -> torch.Tensor:
    """A 1-D view of the memory ``t`` spans (from its first element to its last, stride 1), so
    a kernel reads element ``i, j`` at ``i * t.stride(0) + j * t.stride(1)`` of it; broadcast
    (stride 0) dims add nothing. Negative strides are copied away first."""
    if any(s < 0 for s in t.stride()):
        t = t.contiguous()
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return t.as_strided((max(span, 1),), (1,))


def epilogue_input(e: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
    """An epilogue input broadcast to ``shape`` as the FlyDSL kernels read it: its flat view and
    one stride per dim of ``shape`` (0 where it broadcasts), converted to ``dtype`` (a copy)
    when it is another dtype.

    Raises:
        InvalidInputError: ``e`` does not broadcast to ``shape``.
    """
    if e.dtype != dtype:
        e = e.to(dtype)  # before the expand: converting a broadcast view would fill it out
    try:
        e = e.expand(shape)
    except RuntimeError:
        raise InvalidInputError(f"tilewright: an epilogue input of shape {tuple(e.shape)} does not "
                                f"broadcast to the output {tuple(shape)}") from None
    return flat_view(e), [e.stride(d) if shape[d] > 1 else 0 for d in range(len(shape))]


def natural_input(t: torch.Tensor, pattern: str, dims: str, dtype: torch.dtype) -> tuple[torch.Tensor, list[int]]:
    """An epilogue input in its natural shape (one dim per letter of ``pattern``, as grouped
    GEMMs take them) as the kernels read it: its flat view and its stride along each letter of
    ``dims`` (0 for letters it lacks, and for dims of size 1).

    Raises:
        InvalidInputError: ``t`` has another rank than ``pattern`` has letters.
    """
    if t.dim() != len(pattern):
        raise InvalidInputError(f"tilewright: an epilogue input of pattern {pattern!r} is {len(pattern)}-D "
                                f"(one dim per letter), got shape {tuple(t.shape)}")
    if t.dtype != dtype:
        t = t.to(dtype)
    strides = [t.stride(pattern.index(d)) if d in pattern and t.shape[pattern.index(d)] > 1 else 0
               for d in dims]
    return flat_view(t), strides


def with_unit_stride(t: torch.Tensor) -> torch.Tensor:
    """``t`` when one of its dims has stride 1 (FlyDSL's dynamic layouts need one), else a
    contiguous copy (correct, slower: a broadcast or every-other-element view)."""
    return t if t.dim() == 0 or 1 in t.stride() else t.contiguous()


def k_major(t: torch.Tensor) -> torch.Tensor:
    """``t`` (rows, K) when its rows are dense and K-contiguous (strides (K, 1)) and it starts
    16-byte aligned, as the GEMM kernels' 128-bit buffer copies read it; else such a copy."""
    ok = t.stride(-1) == 1 and (t.dim() < 2 or t.stride(-2) == t.shape[-1]) and t.data_ptr() % 16 == 0
    if ok and t.dim() == 3:
        ok = t.stride(0) == t.shape[1] * t.shape[2]
    return t if ok else t.clone(memory_format=torch.contiguous_format)
