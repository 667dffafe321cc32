"""Helpers the rendered kernel launchers call: strides, index-range checks, TMA/TDM alignment,
the device-side tensor-descriptor allocator. Kept here so each template's launcher stays short."""

from __future__ import annotations

import threading

import torch

INT32_MAX = 2**31 - 1
_allocator_lock = threading.Lock()
_allocator_set = False


def strides3(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, row, column) strides; a 2-D tensor gets batch stride 0."""
    if t.dim() == 3:
        return t.stride(0), t.stride(1), t.stride(2)
    return 0, t.stride(0), t.stride(1)


def check_32bit_indexing(*tensors: torch.Tensor) -> None:
    """Raise if any tensor spans more elements than 32-bit offsets reach.

    Raises:
        ValueError: the kernel was rendered with 32-bit indexing for smaller sizes.
    """
    for t in tensors:
        span = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        if span > INT32_MAX:
            raise ValueError(
                "tilewright: an operand spans more than 2**31 elements but this kernel was rendered "
                "with 32-bit indexing; re-render it for the actual sizes")


def tma_ready(t: torch.Tensor, row_major: bool) -> torch.Tensor:
    """``t`` itself when a TMA/TDM descriptor can read it (unit inner stride, 16-byte aligned
    base and outer stride), else a copy in the wanted layout with rows padded to 16 bytes
    (correct, slower: a size that is dynamic at compile time can turn out ragged).

    ``row_major`` asks for the last dim contiguous; otherwise the second-to-last.
    """
    inner, outer = (-1, -2) if row_major else (-2, -1)
    es = t.element_size()
    ok = (t.stride(inner) == 1 and (t.stride(outer) * es) % 16 == 0 and t.data_ptr() % 16 == 0
          and (t.dim() < 3 or (t.stride(0) * es) % 16 == 0))
    if ok:
        return t
    if not row_major:
        return tma_ready(t.transpose(-1, -2), row_major=True).transpose(-1, -2)
    # a fresh buffer (allocators align to >= 64 bytes) whose rows are padded to 16 bytes
    cols = t.shape[-1]
    pad = (-cols * es) % 16 // es
    buf = torch.empty(*t.shape[:-1], cols + pad, dtype=t.dtype, device=t.device)
    view = buf[..., :cols]
    view.copy_(t)
    return view


def ensure_descriptor_allocator() -> None:
    """Device-side tensor descriptors need scratch memory on the GPU: give Triton an allocator
    (once per process) unless one is already set."""
    global _allocator_set
    if _allocator_set:
        return
    with _allocator_lock:
        if _allocator_set:
            return
        import triton

        def alloc(size: int, alignment: int, stream):
            return torch.empty(size, dtype=torch.int8, device="cuda")

        if hasattr(triton, "set_allocator"):
            triton.set_allocator(alloc)
        _allocator_set = True


def num_sms(device: torch.device) -> int:
    """Persistent kernels launch one program per SM/CU; on the CPU (interpreter) a few, so the
    persistent loop really loops."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 3
