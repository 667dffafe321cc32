"""Metal shaders off macOS: a project-owned syntax check, and the one-line refusal to run.

No Apple compiler exists on Linux. :func:`check_shader` compiles a Metal Shading Language
source as C++17 with the host compiler (``g++``, or ``clang++`` where present), ``-fsyntax-only``,
with ``metal_shim.h`` force-included: the shim declares MSL's types, address spaces, attributes
and ``metal::`` functions (only those MSL has). That is a real if partial check: it catches
undeclared or out-of-scope names, type mismatches (a ``float4`` assigned to a ``float``), calls
of functions Metal lacks, stores through ``constant`` memory, and a kernel pointer argument
without an address space (the shim makes address spaces part of the type, and this module
appends a ``static_assert`` on each kernel's signature). It does not check simdgroup semantics,
resource limits or what Apple's compiler alone rejects: on macOS ``torch.mps.compile_shader``
is the real compile.
"""

from __future__ import annotations

import functools
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from tilewright.errors import EnvironmentMismatchError, KernelCompileError

SHIM = Path(__file__).with_name("metal_shim.h")
NO_RUNTIME = "Metal kernels need macOS with MPS; on this host they are compile-checked only"

_KERNEL = re.compile(r"\bkernel\s+void\s+(\w+)\s*\(")


class MetalShaderError(KernelCompileError):
    """A generated Metal shader failed the host syntax check; the message carries the
    compiler's diagnostics (fix the template or emitter that produced the line it names)."""


def require_metal_runtime() -> None:
    """Raise the one-line refusal unless this process can compile and launch Metal kernels
    (macOS with an MPS device and a torch with ``torch.mps.compile_shader``).

    Raises:
        EnvironmentMismatchError: no MPS runtime here.
    """
    import torch

    ok = (getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
          and hasattr(torch.mps, "compile_shader"))
    if not ok:
        raise EnvironmentMismatchError(NO_RUNTIME)


@functools.lru_cache(maxsize=None)
def host_compiler() -> tuple[str, ...]:
    """The compiler command line the check runs (before the input), clang++ preferred.

    Raises:
        EnvironmentMismatchError: neither g++ nor clang++ is on PATH.
    """
    clang, gxx = shutil.which("clang++"), shutil.which("g++")
    if clang:
        return (clang, "-std=c++17", "-fsyntax-only", "-Wno-unknown-attributes", "-Wno-attributes",
                "-Wno-unknown-warning-option")
    if gxx:
        return (gxx, "-std=c++17", "-fsyntax-only", "-Wno-attributes")
    raise EnvironmentMismatchError(
        "checking Metal shaders needs a host C++ compiler: install g++ or clang++ (apt-get install g++)")


def kernel_names(source: str) -> list[str]:
    """The ``kernel void`` functions a shader defines, in order."""
    return _KERNEL.findall(source)


def check_shader(source: str, *, timeout_s: float = 60.0) -> None:
    """Syntax-check a Metal shader with the host compiler and the shim (see the module
    docstring); returns None when it passes.

    Raises:
        MetalShaderError: the compiler rejected it; the message holds its diagnostics, with
            line numbers of ``source``.
        EnvironmentMismatchError: no host C++ compiler.
    """
    names = kernel_names(source)
    if not names:
        raise MetalShaderError("the shader defines no `kernel void` function: nothing MPS could launch")
    # appended after a #line reset, so diagnostics in the shader keep its own line numbers
    checks = "".join(f"static_assert(tw::kernel_signature<decltype({k})>::ok, \"kernel {k}\");\n"
                     for k in names)
    text = source + ("" if source.endswith("\n") else "\n") + '#line 1 "<kernel-signature-check>"\n' + checks
    with tempfile.TemporaryDirectory(prefix="tw-metal-") as inc:
        # `#include <metal_stdlib>` resolves to the shim (the -include already read it once)
        (Path(inc) / "metal_stdlib").write_text(f'#include "{SHIM}"\n')
        cmd = [*host_compiler(), "-I", inc, "-include", str(SHIM), "-x", "c++", "-"]
        try:
            proc = subprocess.run(cmd, input=text, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired as e:
            raise MetalShaderError(f"the Metal syntax check ran over {timeout_s:.0f} s") from e
    if proc.returncode != 0:
        diag = proc.stderr.replace("<stdin>", "shader").strip()
        # the first error (a static_assert's own text for a missing address space) heads the
        # message; the full diagnostics follow
        errors = [ln for ln in diag.splitlines() if "error:" in ln]
        head = errors[0].strip() if errors else diag.splitlines()[0] if diag else f"exit {proc.returncode}"
        raise MetalShaderError(f"Metal shader failed the host syntax check ({Path(cmd[0]).name} with "
                               f"metal_shim.h): {head}\n{diag}")
