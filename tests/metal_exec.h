// Host execution of generated Metal shaders, for the tests' numerics (tests/metal_host.py).
//
// Force-included after tilewright/runtime/metal_shim.h (compiled with -DTW_METAL_EXEC): it
// defines what the shim only declares. Every thread of a threadgroup is an OS thread;
// threadgroup_barrier is a std::barrier over them; the SIMD-group functions exchange values
// through shared slots between two barriers of the 32 lanes of one simdgroup, so shuffles,
// simd_sum and the rest have their Metal meaning (in lock step, every lane active). Threadgroups
// run one after another, so the kernel's `threadgroup` arrays (made `static` by the harness)
// are the group's shared memory. Math is the C library's (correctly rounded or nearly so, like
// metal::precise). A test harness, not a Metal runtime.
#pragma once

namespace twx {
inline thread_local unsigned lane_id = 0, sg_id = 0;
inline tw_os_barrier* group_barrier = nullptr;
inline tw_os_barrier* simd_barriers[32] = {};

template <class T> T* slots() {  // one slot per thread of the group, shared by all of them
    static T s[1024];
    return s;
}
template <class T, class F> T simd_all_lanes(T v, F fold) {
    T* s = slots<T>() + sg_id * 32;
    s[lane_id] = v;
    simd_barriers[sg_id]->arrive_and_wait();
    T acc = s[0];
    for (int l = 1; l < 32; ++l) acc = fold(acc, s[l]);
    simd_barriers[sg_id]->arrive_and_wait();
    return acc;
}
template <class T> T simd_from_lane(T v, unsigned src) {
    T* s = slots<T>() + sg_id * 32;
    s[lane_id] = v;
    simd_barriers[sg_id]->arrive_and_wait();
    T out = s[src % 32];
    simd_barriers[sg_id]->arrive_and_wait();
    return out;
}
}  // namespace twx

namespace metal {
#define TW_F1(fn, impl) float fn(float x) { return impl(x); }
#define TW_MATH1                                                                                \
    TW_F1(exp, __builtin_expf) TW_F1(exp2, __builtin_exp2f) TW_F1(log, __builtin_logf)          \
    TW_F1(log2, __builtin_log2f) TW_F1(log10, __builtin_log10f) TW_F1(sqrt, __builtin_sqrtf)    \
    TW_F1(sin, __builtin_sinf) TW_F1(cos, __builtin_cosf) TW_F1(tan, __builtin_tanf)            \
    TW_F1(asin, __builtin_asinf) TW_F1(acos, __builtin_acosf) TW_F1(atan, __builtin_atanf)      \
    TW_F1(sinh, __builtin_sinhf) TW_F1(cosh, __builtin_coshf) TW_F1(tanh, __builtin_tanhf)      \
    float rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }                                  \
    float atan2(float a, float b) { return __builtin_atan2f(a, b); }                            \
    float pow(float a, float b) { return __builtin_powf(a, b); }
namespace precise { TW_MATH1 }
TW_MATH1
#undef TW_MATH1
#undef TW_F1
float fabs(float x) { return __builtin_fabsf(x); }
float floor(float x) { return __builtin_floorf(x); }
float ceil(float x) { return __builtin_ceilf(x); }
float trunc(float x) { return __builtin_truncf(x); }
float rint(float x) { return __builtin_rintf(x); }
float fmod(float a, float b) { return __builtin_fmodf(a, b); }
float copysign(float a, float b) { return __builtin_copysignf(a, b); }
bool isnan(float x) { return __builtin_isnan(x); }
bool isinf(float x) { return __builtin_isinf(x); }
bool signbit(float x) { return __builtin_signbit(x); }
template <class D, class S> D as_type(S s) {  // a bit cast, as Metal's as_type
    static_assert(sizeof(D) == sizeof(S), "as_type between types of one size");
    D d;
    __builtin_memcpy(&d, &s, sizeof d);
    return d;
}
template <class T> T abs(T x) { return x < 0 ? -x : x; }
template <class T> T min(T a, T b) { return b < a ? b : a; }
template <class T> T max(T a, T b) { return a < b ? b : a; }

template <class T> simd_t<T> simd_sum(T v) { return twx::simd_all_lanes(v, [](T a, T b) { return T(a + b); }); }
template <class T> simd_t<T> simd_product(T v) { return twx::simd_all_lanes(v, [](T a, T b) { return T(a * b); }); }
template <class T> simd_t<T> simd_max(T v) { return twx::simd_all_lanes(v, [](T a, T b) { return a < b ? b : a; }); }
template <class T> simd_t<T> simd_min(T v) { return twx::simd_all_lanes(v, [](T a, T b) { return b < a ? b : a; }); }
template <class T> simd_t<T> simd_shuffle_xor(T v, ushort mask) { return twx::simd_from_lane(v, twx::lane_id ^ mask); }
template <class T> simd_t<T> simd_shuffle(T v, ushort lane) { return twx::simd_from_lane(v, lane); }
template <class T> simd_t<T> simd_broadcast(T v, ushort lane) { return twx::simd_from_lane(v, lane); }
bool simd_any(bool v) { return twx::simd_all_lanes(v, [](bool a, bool b) { return a || b; }); }
bool simd_all(bool v) { return twx::simd_all_lanes(v, [](bool a, bool b) { return a && b; }); }
void threadgroup_barrier(mem_flags) { twx::group_barrier->arrive_and_wait(); }

template <class T, int R, int C> simdgroup_matrix<T, R, C>::simdgroup_matrix(T diagonal) {
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) v[r][c] = r == c ? diagonal : T(0);
}
template <class T, int R, int C>
void simdgroup_load(simdgroup_matrix<T, R, C>& d, const volatile T* src, ulong elements_per_row,
                    vec<ulong, 2> origin, bool transpose) {
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c)
            d.v[r][c] = transpose ? src[(origin.y + c) * elements_per_row + origin.x + r]
                                  : src[(origin.y + r) * elements_per_row + origin.x + c];
}
template <class T, int R, int C>
void simdgroup_store(simdgroup_matrix<T, R, C> a, volatile T* dst, ulong elements_per_row,
                     vec<ulong, 2> origin, bool transpose) {
    if (twx::lane_id != 0) return;  // one lane writes the tile every lane holds
    for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) {
            if (transpose) dst[(origin.y + c) * elements_per_row + origin.x + r] = a.v[r][c];
            else dst[(origin.y + r) * elements_per_row + origin.x + c] = a.v[r][c];
        }
}
template <class T, class A, class B, int R, int K, int C>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, R, C>& d, const simdgroup_matrix<A, R, K>& a,
                                   const simdgroup_matrix<B, K, C>& b, const simdgroup_matrix<T, R, C>& c) {
    simdgroup_matrix<T, R, C> out;
    for (int r = 0; r < R; ++r)
        for (int j = 0; j < C; ++j) {
            T s = c.v[r][j];
            for (int k = 0; k < K; ++k) s += T(a.v[r][k]) * T(b.v[k][j]);
            out.v[r][j] = s;
        }
    d = out;
}
}  // namespace metal
