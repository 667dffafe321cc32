"""What the differential fuzzer found (tests/fuzz/test_fuzz.py), each as the minimal program it
shrank to, under the modes it failed in. Each failed before its fix; ``check`` judges it the
way the fuzzer does (fuzz_oracle.py).

A new find: paste the reproducer the fuzzer printed (its ``def f`` and ``inputs``) into a test
here, named after what went wrong.
"""

from __future__ import annotations

import pytest
import torch

from fuzz_oracle import check, unavailable
from fuzz_program import make_input

aten, prims = torch.ops.aten, torch.ops.prims
inf, nan = float("inf"), float("nan")


def _modes(*modes):
    return pytest.mark.parametrize("mode", [pytest.param(m, marks=pytest.mark.skipif(
        bool(unavailable(m)), reason=f"{m}: {unavailable(m)}")) for m in modes])


@_modes("triton", "cpp", "auto")
def test_float_valued_prims_of_an_integer_tensor_stay_aten(mode):
    # prims.exp(int64): the meta says int64, eager returns fp32; the kernel computed exp of an
    # int64 (the interpreter: "Expected dtype ['fp32', 'fp64'] but got int64"), no candidate
    # worked and the strict compile failed. Now it stays ATen, as aot_eager runs it
    def f(x0, x1):
        v0 = aten.t.default(x0)
        v1 = prims.exp.default(v0)
        v2 = prims.sin.default(x1)
        return (v1, v2)

    inputs = [make_input([1, -2, 3, 0, 7, -8], (2, 3), torch.int64, "transposed"),
              make_input([5, -1, 2147483647], (3,), torch.int32)]
    check(f, inputs, mode=mode)


@_modes("triton", "cpp", "auto")
def test_prims_ceil_of_an_integer_tensor_is_the_integer(mode):
    # prims.ceil(int64) went to the kernel as ceil of an int64 (the interpreter refused it, the
    # strict compile failed): integers are already whole
    def f(x0, x1):
        v0 = aten.expand.default(x0, [-1, 7, -1])
        v1 = prims.ceil.default(x1)
        v2 = aten.select_backward.default(v0, [4, 7, 1, 1], 2, 0)
        return (v2, v1)

    inputs = [make_input([0.5, -0.0, inf, 3.0], (4, 1, 1), torch.float32),
              make_input([3, -9223372036854775807, 0, 8], (2, 2), torch.int64, "transposed")]
    check(f, inputs, mode=mode)


@_modes("cpp", "triton", "auto")
def test_a_dynamic_reshape_size_prints_as_c_division_in_cpp(mode):
    # reshape (s0, s1, 1) -> (7, 1, 5) gives a stride s0*s1//7: torch's FloorDiv reached the C++
    # printer as Python's "//", a comment in C++, and the kernel did not build (every candidate
    # failed, the strict compile too). Found here and fixed on main at once by 264cf56 (the
    # CodePrinter prints FloorDiv)
    def f(x0):
        v0 = aten.reshape.default(x0, [7, 1, 5])
        v1 = aten.select_backward.default(v0, [1, 7, 1, 5], 0, 0)
        return (v1,)

    inputs = [make_input([inf, 2.3828125, -65504.0, 1.7724609375, -3.724609375, 6.103515625e-05, -0.0, 1.0, 4.0,
                          0.0, -3.6328125, -5.960464477539063e-08, 1.0, 0.79296875, -0.0, -2.98828125, 1.0458984375,
                          -65504.0, 6.103515625e-05, -3.72265625, 0.92578125, -inf, 3.38671875, 65504.0, 0.0, -0.0,
                          1.3623046875, 0.9375, 2.1171875, -65504.0, -1.0068359375, 2.357421875, -1.0, -inf, 0.0],
                         (5, 7, 1), torch.float16)]
    check(f, inputs, mode=mode, dynamic=True)


@_modes("triton", "auto")
def test_an_atomic_scatter_through_one_index_runs_in_the_interpreter(mode):
    # index_add with a one-element index: the index was loaded once (a scalar) and the
    # interpreter's comparisons of it made an int32 mask, which its atomics refused ("mask has
    # unsupported dtype"): no Triton candidate worked and the strict compile failed
    def f(x0, x1, x2):
        v0 = aten.index_add.default(x0, 1, x1, x2, alpha=2)
        return (v0,)

    inputs = [make_input([1.0, 1.1754943508222875e-38, nan, 0.0], (4, 2), torch.float32, "expanded1"),
              make_input([1], (1,), torch.int64),
              make_input([1.0, -0.0, 0.5, nan], (4, 1), torch.float32, "transposed")]
    check(f, inputs, mode=mode)


@_modes("cpp", "auto")
def test_a_scan_in_a_combo_kernel_is_refused_by_the_cpp_loops(mode):
    # an empty cumsum grouped with an unrelated pointwise op in one combo kernel: the C++
    # template judged only the combo's own nodes, accepted it, and its build raised "_Body has
    # no scans" (no candidate left, the strict compile failed); it now sees the parts' scan
    def f(x0, x1):
        v0 = aten.lerp.Tensor(x0, x0, x0)
        v1 = aten.cumsum.default(x1, -1, dtype=torch.int32)
        return (v1, v0)

    inputs = [make_input([32752.0], (1,), torch.float16, "strided"),
              make_input([], (7, 0, 2), torch.float16, "transposed")]
    check(f, inputs, mode=mode)


@_modes("triton", "cpp", "auto")
def test_an_op_eager_has_no_kernel_for_raises_compiled_too(mode):
    # threshold of a bool tensor: eager raises NotImplementedError ("threshold_cpu" not
    # implemented for 'Bool'), the loop kernel computed a value; an op eager has no kernel for
    # on these dtypes now stays ATen, which raises as eager does
    def f(x0):
        v0 = aten.all.dim(x0, -1, False)
        v1 = aten.threshold.default(v0, 2, -1)
        return (v1,)

    check(f, [make_input([2.0, -0.0, 3.4028234663852886e+38, nan], (2, 2), torch.float32)], mode=mode)


@_modes("triton", "cpp", "auto", "sycl")
def test_cumprod_with_a_dtype_converts_before_it_multiplies(mode):
    # cumprod(bf16, dtype=fp16): eager converts to fp16 first (-3.39e38 is -inf there, and
    # -inf * 0 is NaN); the scan multiplied the bf16 values in fp32 and converted the result,
    # -0.0 at the end of the row (found under sycl, where the scan's ATen form ran it)
    def f(x0):
        v0 = aten.cumprod.default(x0, 1, dtype=torch.float16)
        v1 = aten.cumsum.default(x0, 1, dtype=torch.float16)
        return (v0, v1)

    inputs = [make_input([-1.15625, -3.3895313892515355e+38, -0.8671875, 0.0, -0.73046875, -2.109375,
                          -3.3895313892515355e+38, -2.28125], (2, 4), torch.bfloat16, "strided")]
    check(f, inputs, mode=mode)


@_modes("triton", "auto")
def test_atan2_of_a_0d_tensor_and_a_row_runs_in_the_interpreter(mode):
    # atan2(0-d, row): the 0-d operand was loaded once (a scalar), the interpreter kept its
    # comparisons as int32 and "&" with a float test failed ("ufunc 'bitwise_and' not
    # supported"): no Triton candidate, the strict compile failed. Found through prims.atan2
    def f(x0, x1):
        return (prims.atan2.default(x0, x1), aten.atan2.default(x0, x1))

    for dtype in (torch.float16, torch.float32):
        check(f, [make_input([0.0], (), dtype, "offset"),
                  make_input([-inf, nan, inf, 0.0, 1.52587890625e-05, 0.2178955078125], (1, 6), dtype)], mode=mode)


@_modes("triton", "cpp", "auto")
def test_elu_of_zeros_keeps_their_sign_with_a_negative_alpha(mode):
    # elu(+0, alpha=-1.5) took the exponential side: expm1(0) * alpha * scale is -0.0 where
    # eager's is +0.0
    def f(x0):
        v0 = aten.constant_pad_nd.default(x0, [1, 1, 2, 0], 3)
        v1 = aten.elu.default(v0, -1.5, 0.001, 100.0)
        return (v1,)

    check(f, [make_input([6.103515625e-05, 2.0712335109710693, 0.0, -0.0, -inf], (1, 5), torch.float32,
                         "transposed")], mode=mode)


@_modes("triton", "cpp", "auto")
def test_argmin_of_a_bool_tensor_raises_as_eager(mode):
    # eager raises "argmin(): does not support bool input"; the kernel returned an index
    def f(x0):
        v0 = aten.all.dims(x0, [0], True)
        v1 = aten.argmin.default(v0, None, True)
        return (v1,)

    check(f, [make_input([True, False, False, True, True, True, True, True, False], (3, 3, 3), torch.bool,
                         "expanded1")], mode=mode)


@_modes("triton", "cpp", "auto")
def test_a_gather_from_an_expanded_0d_table_loads_through_a_block_pointer(mode):
    # embedding of a 0-d value expanded to [1, 3]: every lane reads one address, the load's
    # pointer was a scalar under a block mask and the interpreter refused it ("Mask argument
    # cannot be block type if pointer argument is not a block"): no candidate worked
    def f(x0, x1):
        v0 = aten.expand.default(x0, [1, 3])
        v1 = aten.embedding.default(v0, x1)
        return (v1,)

    inputs = [make_input([2.938735877055719e-39], (), torch.bfloat16, "offset"),
              make_input([0, 0, 0, 0], (4,), torch.int64)]
    check(f, inputs, mode=mode)
