"""A 64x64x32 bf16 tile GEMM in FlyDSL's layout API (one workgroup, 2x2 waves of MFMA 16x16x32):
the smallest kernel that exercises the compile driver, MFMA and buffer loads."""

import torch
import flydsl.compiler as flyc
import flydsl.expr as fx

BM, BN, BK = 64, 64, 32

@flyc.kernel
def gemm_kernel(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor):
    tid = fx.thread_idx.x
    bid = fx.block_idx.x
    A = fx.rocdl.make_buffer_tensor(A)
    B = fx.rocdl.make_buffer_tensor(B)
    C = fx.rocdl.make_buffer_tensor(C)
    bA = fx.slice(fx.zipped_divide(A, (BM, BK)), (None, bid))
    bB = fx.slice(fx.zipped_divide(B, (BN, BK)), (None, bid))
    bC = fx.slice(fx.zipped_divide(C, (BM, BN)), (None, bid))
    mma_atom = fx.make_mma_atom(fx.rocdl.MFMA(16, 16, 32, fx.BFloat16))
    tiled_mma = fx.make_tiled_mma(mma_atom, fx.make_layout((2, 2, 1), (1, 2, 0)))
    thr_mma = tiled_mma.thr_slice(tid)
    copy_atom = fx.make_copy_atom(fx.rocdl.BufferCopy128b(), fx.BFloat16)
    tA = fx.make_tiled_copy_A(copy_atom, tiled_mma).get_slice(tid)
    tB = fx.make_tiled_copy_B(copy_atom, tiled_mma).get_slice(tid)
    c_atom = fx.make_copy_atom(fx.rocdl.BufferCopy32b(), fx.Float32)
    tC = fx.make_tiled_copy_C(c_atom, tiled_mma).get_slice(tid)
    frag_A = thr_mma.make_fragment_A(bA)
    frag_B = thr_mma.make_fragment_B(bB)
    frag_C = thr_mma.make_fragment_C(bC)
    fx.copy(copy_atom, tA.partition_S(bA), tA.retile(frag_A), pred=None)
    fx.copy(copy_atom, tB.partition_S(bB), tB.retile(frag_B), pred=None)
    frag_C.fill(0)
    fx.gemm(mma_atom, frag_C, frag_A, frag_B, frag_C)
    fx.copy(c_atom, tC.retile(frag_C), tC.partition_S(bC), pred=None)

@flyc.jit
def launch(A: fx.Tensor, B: fx.Tensor, C: fx.Tensor, stream: fx.Stream = fx.Stream(None)):
    gemm_kernel(A, B, C).launch(grid=(1, 1, 1), block=(256, 1, 1), stream=stream)

def compile_aot():
    A = torch.empty(BM, BK, dtype=torch.bfloat16)
    B = torch.empty(BN, BK, dtype=torch.bfloat16)
    C = torch.empty(BM, BN, dtype=torch.float32)
    launch(A, B, C)
