"""Element types of the expression IR, by short name, and the rules for computing in them.

Names are the ones keys and templates already use ("fp32", "bf16", ...) plus the integer and
boolean types pointwise kernels need. Floats narrower than fp32 are *computed* in fp32 (their
"compute type", as eager's own kernels and Inductor do) and rounded where a value is stored or
explicitly cast; fp64 is computed in fp64.
"""

from __future__ import annotations

import torch

TORCH: dict[str, torch.dtype] = {
    "fp64": torch.float64, "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8e4m3": torch.float8_e4m3fn, "fp8e5m2": torch.float8_e5m2,
    "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8,
    "u8": torch.uint8, "bool": torch.bool,
}
NAMES: dict[torch.dtype, str] = {v: k for k, v in TORCH.items()}
FLOATS = ("fp64", "fp32", "fp16", "bf16", "fp8e4m3", "fp8e5m2")
INTS = ("i64", "i32", "i16", "i8", "u8")
ITEMSIZE = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2, "fp8e4m3": 1, "fp8e5m2": 1,
            "i64": 8, "i32": 4, "i16": 2, "i8": 1, "u8": 1, "bool": 1}


def name_of(dtype: torch.dtype) -> str:
    """Short name of a torch dtype.

    Raises:
        KeyError: a dtype the IR does not handle (complex, quantised, packed fp4 ...).
    """
    return NAMES[dtype]


def is_float(dtype: str) -> bool:
    return dtype in FLOATS


def is_int(dtype: str) -> bool:
    return dtype in INTS


def extreme(dtype: str, lowest: bool) -> float | int | bool:
    """The lowest (``lowest``) or highest value of ``dtype``: -inf/inf for floats, False/True
    for bool, the integer type's own range otherwise (uint8: 0/255, int8: -128/127): the
    identity of a max (lowest) or min (highest) reduction held in that type."""
    if is_float(dtype):
        return float("-inf") if lowest else float("inf")
    if dtype == "bool":
        return not lowest
    info = torch.iinfo(TORCH[dtype])
    return info.min if lowest else info.max


def compute_type(dtype: str) -> str:
    """The type a value of ``dtype`` is held in while a kernel computes: fp32 for narrower
    floats, itself otherwise."""
    return "fp32" if dtype in ("fp16", "bf16", "fp8e4m3", "fp8e5m2") else dtype
