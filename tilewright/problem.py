"""Kernel-level problem descriptions shared by the compiler, the templates and the autotuner:
the dtype names and sizes every kind uses, the GEMM-style epilogue steps (:class:`EpilogueOp`,
:class:`EpilogueInput`; grouped GEMMs share them) and the loop kernels' :class:`LoopProblem`.

A problem is what a template renders for and what the autotuner tunes: concrete sizes, dtypes,
layouts. It knows nothing of FX graphs. The GEMM's problem is the GEMM kind's
(:class:`tilewright.kinds.gemm.problem.GemmProblem`); ``tilewright.problem.GemmProblem`` resolves
to it for one release, with a DeprecationWarning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tilewright.ir.kernel import LoopKernel

import torch

# dtype names used in keys and templates (torch dtype -> short name)
DTYPE_NAMES: dict[torch.dtype, str] = {
    torch.float32: "fp32",
    torch.float16: "fp16",
    torch.bfloat16: "bf16",
    torch.float64: "fp64",
    torch.float8_e4m3fn: "fp8e4m3",
    torch.float8_e5m2: "fp8e5m2",
}
DTYPES: dict[str, torch.dtype] = {v: k for k, v in DTYPE_NAMES.items()}
# Block-scaled formats: values and one scale per block along K (see tilewright.quant)
#   nvfp4: e2m1 values packed two per byte + float8_e4m3fn scale per 16 values
#   mxfp4: e2m1 values packed two per byte + float8_e8m0fnu scale per 32 values
#   mxfp8: float8_e4m3fn values + float8_e8m0fnu scale per 32 values
SCALED_FORMATS = {"nvfp4": 16, "mxfp4": 32, "mxfp8": 32}  # format -> block size along K
VALUES_PER_BYTE = {"nvfp4": 2, "mxfp4": 2, "mxfp8": 1}  # format -> K values per stored byte
# bytes per element (block-scaled formats include their share of the scale)
ELEMENT_BYTES: dict[str, float] = {
    "fp32": 4, "fp16": 2, "bf16": 2, "fp64": 8, "fp8e4m3": 1, "fp8e5m2": 1,
    "nvfp4": 0.5 + 1 / 16, "mxfp4": 0.5 + 1 / 32, "mxfp8": 1 + 1 / 32,
}

# Floating dtypes a GEMM accepts as A/B; fp64 runs only on ATen.
GEMM_INPUT_DTYPES = ("fp32", "fp16", "bf16")

UNARY_EPILOGUES = ("relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")
BINARY_EPILOGUES = ("add", "sub", "mul", "div")
EPILOGUE_KINDS = UNARY_EPILOGUES + BINARY_EPILOGUES


def json_digest(d: dict) -> str:
    """A problem's stable hash: the first 16 hex digits of the SHA-256 of its JSON (sorted keys,
    no spaces), the key its tuning records are filed under."""
    return hashlib.sha256(json.dumps(d, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def decode_epilogue(d: dict) -> dict:
    """``d`` (a GEMM-family problem's JSON, copied) with its epilogue, epilogue inputs and dynamic
    dims decoded back into their types."""
    d["epilogue"] = tuple(EpilogueOp(**e) for e in d.get("epilogue", ()))
    d["epilogue_inputs"] = tuple(EpilogueInput(**e) for e in d.get("epilogue_inputs", ()))
    d["dynamic"] = frozenset(d.get("dynamic", ()))
    return d


def dtype_name(dtype: torch.dtype) -> str:
    """Short name ("fp32", "bf16", ...) of a torch dtype; raises KeyError for non-float dtypes."""
    return DTYPE_NAMES[dtype]


@dataclass(frozen=True)
class EpilogueInput:
    """A tensor the epilogue reads, broadcast to the output (batch, M, N).

    ``broadcast`` names the output dimensions the tensor really spans: "MN" a full matrix
    (residual), "N" one value per output column (bias), "M" one per row, "" a scalar tensor;
    a leading "B" when it also varies over the batch.
    """

    broadcast: str
    dtype: str

    def __post_init__(self) -> None:
        if self.broadcast not in ("", "M", "N", "MN", "B", "BM", "BN", "BMN"):
            raise ValueError(f"bad epilogue broadcast pattern {self.broadcast!r}")


@dataclass(frozen=True)
class EpilogueOp:
    """One elementwise step applied to the fp32 accumulator, in order.

    Unary kinds: relu, gelu (erf), gelu_tanh, silu, sigmoid, tanh. Binary kinds (add, sub, mul,
    div) take either ``input`` (an index into ``GemmProblem.epilogue_inputs``, multiplied by
    ``scale`` first) or ``scalar``; ``reverse`` computes ``other OP acc`` instead of
    ``acc OP other``.
    """

    kind: str
    input: int | None = None
    scalar: float | None = None
    scale: float = 1.0
    reverse: bool = False

    def __post_init__(self) -> None:
        if self.kind not in EPILOGUE_KINDS:
            raise ValueError(f"unknown epilogue kind {self.kind!r}; known: {EPILOGUE_KINDS}")
        binary = self.kind in BINARY_EPILOGUES
        if binary and (self.input is None) == (self.scalar is None):
            raise ValueError(f"epilogue {self.kind} needs exactly one of input= or scalar=")
        if not binary and (self.input is not None or self.scalar is not None):
            raise ValueError(f"epilogue {self.kind} takes no operand")

    def describe(self, inputs: tuple[EpilogueInput, ...]) -> str:
        if self.kind in UNARY_EPILOGUES:
            return self.kind
        if self.scalar is not None:
            other = f"{self.scalar:g}"
        else:
            pattern = inputs[self.input].broadcast or "scalar"  # type: ignore[index]
            other = f"[{pattern}]" + (f"*{self.scale:g}" if self.scale != 1.0 else "")
        return f"{self.kind}{'_rev' if self.reverse else ''}{other}"


@dataclass(frozen=True)
class LoopProblem:
    """A pointwise or reduction kernel as templates and the autotuner see it.

    Attributes:
        kernel: the kernel (:class:`tilewright.ir.kernel.LoopKernel`), sizes symbolic in the
            canonical symbols ``z0, z1, ...``.
        sizes: the value of each size symbol this problem is tuned at, by name (the trace-time
            hint, or a bucket for a dynamic symbol).
        dynamic: names of the size symbols that vary at run time (kernels are rendered
            size-generic anyway; these are bucketed).
        op: a short description of what the kernel computes ("rms_norm", "add+mul"), for display.
        unfused: the ATen ops the kernel replaced, as a program's JSON text
            (:mod:`tilewright.compiler.programs`; "" when it has none): a candidate of its own on
            a CPU. Not part of the problem's identity: its candidate key carries its digest.
    """

    kernel: "LoopKernel"
    sizes: tuple[tuple[str, int], ...] = ()
    dynamic: frozenset[str] = field(default_factory=frozenset)
    op: str = ""
    unfused: str = field(default="", compare=False)

    @property
    def kind(self) -> str:
        return self.kernel.kind

    @property
    def size_map(self) -> dict:
        """Size symbol -> value."""
        from tilewright.ir.kernel import size_symbol

        return {size_symbol(int(k[1:])): v for k, v in self.sizes}

    @property
    def xnumel(self) -> int:
        from tilewright.ir.index import static_or_hint

        return static_or_hint(self.kernel.xnumel, self.size_map)

    @property
    def rnumel(self) -> int:
        from tilewright.ir.index import static_or_hint

        return static_or_hint(self.kernel.rnumel, self.size_map)

    @property
    def min_bytes(self) -> int:
        """Bytes every input must be read and every output written at least once."""
        from tilewright.ir.kernel import buffer_bytes

        sizes = self.size_map
        return sum(buffer_bytes(b, sizes) for b in self.kernel.inputs + self.kernel.outputs)

    @property
    def flops(self) -> int:
        """Pointwise ops per element times elements (a rough count for the cost model)."""
        per = sum(1 for n in self.kernel.nodes() if n.op not in ("load", "const", "index", "cast"))
        return per * self.xnumel * max(self.rnumel, 1)

    def with_sizes(self, **sizes: int) -> "LoopProblem":
        merged = dict(self.sizes) | sizes
        return dataclasses.replace(self, sizes=tuple(sorted(merged.items())))

    def to_json(self) -> dict:
        d = {"kind": self.kind, "kernel": self.kernel.to_json(), "sizes": dict(self.sizes),
             "dynamic": sorted(self.dynamic), "op": self.op}
        if self.unfused:  # carried, never identity: see ``unfused``
            d["unfused"] = self.unfused
        return d

    @classmethod
    def from_json(cls, d: dict) -> "LoopProblem":
        from tilewright.ir.kernel import LoopKernel

        return cls(LoopKernel.from_json(d["kernel"]), tuple(sorted(d["sizes"].items())),
                   frozenset(d.get("dynamic", ())), d.get("op", ""), d.get("unfused", ""))

    def stable_hash(self) -> str:
        d = self.to_json()
        d.pop("op")  # display only
        d.pop("unfused", None)  # its candidate's key carries its digest
        return json_digest(d)

    def describe(self) -> str:
        sizes = " ".join(f"{k}={v}" for k, v in self.sizes)
        red = f" x reduce {self.rnumel}" if self.kind == "reduction" else ""
        return f"{self.op or self.kind} [{self.xnumel}{red}] {sizes}".rstrip()


def __getattr__(name: str) -> Any:
    if name == "GemmProblem":  # the GEMM kind's (kept here for one release)
        import importlib
        import warnings

        new = "tilewright.kinds.gemm.problem"
        warnings.warn(f"tilewright.problem.{name} moved to {new}; import it from there (the old name is removed "
                      f"in the next release)", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
