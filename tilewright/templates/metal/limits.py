"""The per-threadgroup limits every Metal candidate is checked against before it renders.

Apple GPUs give one threadgroup at most ``Target.max_threads_per_block`` threads (1024,
``maxTotalThreadsPerThreadgroup``) and ``Target.smem_per_block`` bytes of threadgroup memory
(32 KiB, ``maxThreadgroupMemoryLength``). A shader over either still compiles but its pipeline
state fails to build (or the dispatch is rejected) on the Mac, so the templates' ``check()``
refuses such parameters here, with the numbers, and the policies never propose them.
"""

from __future__ import annotations

from tilewright.runtime.targets import Target


def threadgroup_refusal(threads: int, threadgroup_bytes: int, target: Target, *,
                        fewer_threads: str, less_memory: str) -> str | None:
    """Why a threadgroup of ``threads`` threads using ``threadgroup_bytes`` bytes of threadgroup
    memory cannot launch on ``target`` (None when it can).

    Args:
        threads: threads per threadgroup (simdgroups x 32).
        threadgroup_bytes: bytes of ``threadgroup`` arrays the shader declares.
        target: the target whose limits apply (``max_threads_per_block``, ``smem_per_block``).
        fewer_threads, less_memory: the fix to name in the refusal (which knob to lower).
    """
    if threads > target.max_threads_per_block:
        return (f"{threads} threads per threadgroup, over the {target.max_threads_per_block} "
                f"{target.name} allows: {fewer_threads}")
    if threadgroup_bytes > target.smem_per_block:
        return (f"{threadgroup_bytes} bytes of threadgroup memory, over the {target.smem_per_block} "
                f"a threadgroup may use on {target.name}: {less_memory}")
    return None
