// tilewright's shim of the Metal Shading Language for a host C++ syntax check.
//
// No Apple compiler exists off macOS. `g++ -std=c++17 -fsyntax-only -Wno-attributes -include
// metal_shim.h -x c++ -` with this header checks a generated shader's scoping, typing and
// syntax (tilewright/templates/metal/check.py drives it). It declares only what MSL has (no erf,
// no expm1, no double overloads, no 64-bit simd shuffles), so a shader that calls something
// Metal lacks fails here too; it cannot check simdgroup semantics or the compiler's own limits.
//
// Address spaces are part of the type, so a kernel argument that lacks one is an error:
//   device      -> volatile          (read-write memory)
//   constant    -> const volatile    (read-only: a store through it fails, as on Metal)
//   threadgroup -> volatile          (threadgroup memory)
//   thread      -> nothing           (the default for locals, as in MSL)
// and metal_check.py appends `static_assert(tw::kernel_signature<decltype(K)>::ok)` for each
// kernel K: every pointer or reference argument must point to a volatile (address-spaced) type.
// Nothing else the shim declares is volatile, so the qualifier marks "has an address space".
#pragma once
#define TW_METAL_SHIM 1

#include <type_traits>
#include <utility>
#ifdef TW_METAL_EXEC
// tests/metal_exec.h runs shaders on the host: its threads and barriers, included before the
// address-space macros below (they would rewrite `thread` inside <thread>)
#include <barrier>
#include <thread>
using tw_os_thread = std::thread;
using tw_os_barrier = std::barrier<>;
#endif

typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef _Float16 half;

#ifdef TW_METAL_EXEC
// host execution: a real 2-byte bfloat, rounding to nearest even as Metal's conversion does
struct bfloat {
    unsigned short bits;
    bfloat() = default;
    bfloat(float x) {
        unsigned u;
        __builtin_memcpy(&u, &x, 4);
        bits = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u)
                                              : (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    bfloat(const bfloat&) = default;
    bfloat(const volatile bfloat& o) : bits(o.bits) {}
    bfloat& operator=(const bfloat&) = default;
    void operator=(const bfloat& o) volatile { bits = o.bits; }
    operator float() const {
        unsigned u = unsigned(bits) << 16;
        float f;
        __builtin_memcpy(&f, &u, 4);
        return f;
    }
    operator float() const volatile { return bfloat(*const_cast<const bfloat*>(this)); }
};
#else
// Metal 3.1's bfloat: converts to and from float; arithmetic goes through float here
struct bfloat {
    float v;
    bfloat() = default;
    bfloat(float x) : v(x) {}
    bfloat(const bfloat&) = default;
    bfloat(const volatile bfloat& o) : v(o.v) {}
    bfloat& operator=(const bfloat&) = default;
    void operator=(const bfloat& o) volatile { v = o.v; }
    operator float() const { return v; }
    operator float() const volatile { return v; }
};
#endif

#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define MAXFLOAT (3.402823466e+38f)

namespace metal {

// -- vector types (no conversion to a scalar: assigning a float4 to a float is an error) -------
template <class T, int N> struct vec;
template <class T> struct vec<T, 2> {
    T x, y;
    vec() = default;
    vec(T s) : x(s), y(s) {}
    vec(T a, T b) : x(a), y(b) {}
    vec(const vec&) = default;
    vec(const volatile vec& o) : x(o.x), y(o.y) {}
    vec& operator=(const vec&) = default;
    void operator=(const vec& o) volatile { x = o.x; y = o.y; }
    T& operator[](int i) { return i ? y : x; }
};
template <class T> struct vec<T, 3> {
    T x, y, z;
    vec() = default;
    vec(T s) : x(s), y(s), z(s) {}
    vec(T a, T b, T c) : x(a), y(b), z(c) {}
    vec(const vec&) = default;
    vec(const volatile vec& o) : x(o.x), y(o.y), z(o.z) {}
    vec& operator=(const vec&) = default;
    void operator=(const vec& o) volatile { x = o.x; y = o.y; z = o.z; }
    T& operator[](int i) { return i == 0 ? x : i == 1 ? y : z; }
};
template <class T> struct vec<T, 4> {
    T x, y, z, w;
    vec() = default;
    vec(T s) : x(s), y(s), z(s), w(s) {}
    vec(T a, T b, T c, T d) : x(a), y(b), z(c), w(d) {}
    vec(vec<T, 2> a, vec<T, 2> b) : x(a.x), y(a.y), z(b.x), w(b.y) {}
    vec(const vec&) = default;
    vec(const volatile vec& o) : x(o.x), y(o.y), z(o.z), w(o.w) {}
    vec& operator=(const vec&) = default;
    void operator=(const vec& o) volatile { x = o.x; y = o.y; z = o.z; w = o.w; }
    T& operator[](int i) { return i == 0 ? x : i == 1 ? y : i == 2 ? z : w; }
};
#define TW_VEC_BINOP(op)                                                                        \
    template <class T, int N> vec<T, N> operator op(vec<T, N> a, vec<T, N> b);                   \
    template <class T, int N> vec<T, N> operator op(vec<T, N> a, T b);                           \
    template <class T, int N> vec<T, N> operator op(T a, vec<T, N> b);                           \
    template <class T, int N> vec<T, N>& operator op##=(vec<T, N>& a, vec<T, N> b);
TW_VEC_BINOP(+)
TW_VEC_BINOP(-)
TW_VEC_BINOP(*)
TW_VEC_BINOP(/)
#undef TW_VEC_BINOP
template <class T, int N> vec<T, N> operator-(vec<T, N> a);

// -- math (float and half; vectors element-wise). No double: Metal has none ----------------
#define TW_UNARY(fn)                                                                            \
    float fn(float);                                                                            \
    half fn(half);                                                                              \
    template <int N> vec<float, N> fn(vec<float, N>);                                           \
    template <int N> vec<half, N> fn(vec<half, N>);
#define TW_BINARY(fn)                                                                           \
    float fn(float, float);                                                                     \
    half fn(half, half);                                                                        \
    template <int N> vec<float, N> fn(vec<float, N>, vec<float, N>);                            \
    template <int N> vec<half, N> fn(vec<half, N>, vec<half, N>);
#define TW_MATH                                                                                 \
    TW_UNARY(acos) TW_UNARY(acosh) TW_UNARY(asin) TW_UNARY(asinh) TW_UNARY(atan)                \
    TW_UNARY(atanh) TW_UNARY(ceil) TW_UNARY(cos) TW_UNARY(cosh) TW_UNARY(cospi) TW_UNARY(exp)   \
    TW_UNARY(exp2) TW_UNARY(exp10) TW_UNARY(fabs) TW_UNARY(floor) TW_UNARY(fract)               \
    TW_UNARY(log) TW_UNARY(log2) TW_UNARY(log10) TW_UNARY(rint) TW_UNARY(round)                 \
    TW_UNARY(rsqrt) TW_UNARY(sin) TW_UNARY(sinh) TW_UNARY(sinpi) TW_UNARY(sqrt) TW_UNARY(tan)   \
    TW_UNARY(tanh) TW_UNARY(tanpi) TW_UNARY(trunc)                                              \
    TW_BINARY(atan2) TW_BINARY(copysign) TW_BINARY(fdim) TW_BINARY(fmax) TW_BINARY(fmin)        \
    TW_BINARY(fmod) TW_BINARY(pow) TW_BINARY(powr) TW_BINARY(nextafter)                         \
    float fma(float, float, float);                                                             \
    half fma(half, half, half);
TW_MATH
namespace precise { TW_MATH }
namespace fast { TW_MATH }
#undef TW_MATH
#undef TW_UNARY
#undef TW_BINARY

bool isnan(float); bool isnan(half);
bool isinf(float); bool isinf(half);
bool isfinite(float); bool isfinite(half);
bool signbit(float); bool signbit(half);
float sign(float); half sign(half);

// common and integer functions: one type per call, as in MSL (no mixed int/long overloads)
template <class T> T abs(T);
template <class T> T min(T, T);
template <class T> T max(T, T);
template <class T> T clamp(T, T, T);
template <class T> T select(T a, T b, bool c);  // c ? b : a
template <class T> T mix(T, T, T);
template <class T> T saturate(T);
template <class T> T popcount(T);
template <class T> T clz(T);
template <class T> T ctz(T);
template <class T> T mulhi(T, T);
template <class D, class S> D as_type(S);

// -- SIMD-group functions: 32-bit and narrower scalars and vectors only (no 64-bit shuffles) -
template <class T> struct simd_type : std::false_type {};
#define TW_SIMD_TYPE(t) template <> struct simd_type<t> : std::true_type {};
TW_SIMD_TYPE(float) TW_SIMD_TYPE(half) TW_SIMD_TYPE(int) TW_SIMD_TYPE(uint) TW_SIMD_TYPE(short)
TW_SIMD_TYPE(ushort) TW_SIMD_TYPE(char) TW_SIMD_TYPE(uchar) TW_SIMD_TYPE(bool)
#undef TW_SIMD_TYPE
template <class T, int N> struct simd_type<vec<T, N>> : simd_type<T> {};
template <class T> using simd_t = std::enable_if_t<simd_type<T>::value, T>;
template <class T> simd_t<T> simd_sum(T);
template <class T> simd_t<T> simd_product(T);
template <class T> simd_t<T> simd_max(T);
template <class T> simd_t<T> simd_min(T);
template <class T> simd_t<T> simd_prefix_exclusive_sum(T);
template <class T> simd_t<T> simd_prefix_inclusive_sum(T);
template <class T> simd_t<T> simd_shuffle(T, ushort lane);
template <class T> simd_t<T> simd_shuffle_xor(T, ushort mask);
template <class T> simd_t<T> simd_shuffle_down(T, ushort delta);
template <class T> simd_t<T> simd_shuffle_up(T, ushort delta);
template <class T> simd_t<T> simd_broadcast(T, ushort lane);
template <class T> simd_t<T> simd_broadcast_first(T);
template <class T> simd_t<T> simd_and(T);
template <class T> simd_t<T> simd_or(T);
template <class T> simd_t<T> simd_xor(T);
bool simd_any(bool);
bool simd_all(bool);

// -- synchronisation ---------------------------------------------------------------------------
enum class mem_flags : int { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };
constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }
void threadgroup_barrier(mem_flags);
void simdgroup_barrier(mem_flags);

// -- simdgroup matrices (8x8 tiles; loads and stores take an address-spaced pointer) ---------
template <class T, int R, int C> struct simdgroup_matrix {
#ifdef TW_METAL_EXEC
    T v[R][C];  // host execution: every lane holds the whole tile (the operations are simdgroup-uniform)
#endif
    simdgroup_matrix() = default;
    explicit simdgroup_matrix(T diagonal);
};
template <class T, int R, int C>
void simdgroup_load(simdgroup_matrix<T, R, C>& d, const volatile T* src, ulong elements_per_row = C,
                    vec<ulong, 2> origin = vec<ulong, 2>(0), bool transpose = false);
template <class T, int R, int C>
void simdgroup_store(simdgroup_matrix<T, R, C> a, volatile T* dst, ulong elements_per_row = C,
                     vec<ulong, 2> origin = vec<ulong, 2>(0), bool transpose = false);
template <class T, class A, class B, int R, int K, int C>
void simdgroup_multiply_accumulate(simdgroup_matrix<T, R, C>& d, const simdgroup_matrix<A, R, K>& a,
                                   const simdgroup_matrix<B, K, C>& b,
                                   const simdgroup_matrix<T, R, C>& c);
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;
typedef simdgroup_matrix<bfloat, 8, 8> simdgroup_bfloat8x8;

}  // namespace metal

#define TW_VEC_TYPEDEFS(t)                                                                      \
    typedef metal::vec<t, 2> t##2;                                                              \
    typedef metal::vec<t, 3> t##3;                                                              \
    typedef metal::vec<t, 4> t##4;
TW_VEC_TYPEDEFS(float)
TW_VEC_TYPEDEFS(half)
TW_VEC_TYPEDEFS(int)
TW_VEC_TYPEDEFS(uint)
TW_VEC_TYPEDEFS(short)
TW_VEC_TYPEDEFS(ushort)
TW_VEC_TYPEDEFS(char)
TW_VEC_TYPEDEFS(uchar)
TW_VEC_TYPEDEFS(bool)
TW_VEC_TYPEDEFS(long)
TW_VEC_TYPEDEFS(ulong)
#undef TW_VEC_TYPEDEFS

// -- the kernel-signature check metal_check.py appends for every `kernel` ---------------------
namespace tw {
template <class T> struct spaced : std::true_type {};  // a value argument (uint tid, ...)
template <class T> struct spaced<T*> : std::is_volatile<T> {};
template <class T> struct spaced<T&> : std::is_volatile<T> {};
template <int I, class T> constexpr bool argument() {
    static_assert(spaced<T>::value,
                  "a kernel pointer or reference argument has no address space: declare it "
                  "`device T*`, `constant T&`/`constant T*` or `threadgroup T*` (the argument "
                  "index I and type T are in the instantiation above)");
    return true;
}
template <class F> struct kernel_signature {
    static_assert(sizeof(F) == 0, "a Metal kernel must return void");
};
template <class... A> struct kernel_signature<void(A...)> {
    template <int... I> static constexpr bool all(std::integer_sequence<int, I...>) {
        return (argument<I, A>() && ... && true);
    }
    static constexpr bool ok = all(std::make_integer_sequence<int, sizeof...(A)>());
};
}  // namespace tw

// the address-space keywords, defined last so the standard headers above never see them
#define device volatile
#define constant const volatile
#define threadgroup volatile
#define thread
#define kernel
