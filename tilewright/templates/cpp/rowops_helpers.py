"""C++ helper functions of the scans and scatters (:mod:`.rowops`), by name, as
:data:`tilewright.templates.cpp.emit.HELPERS` holds them (a kernel's source declares those it
calls)."""

from __future__ import annotations


def _shift_masks(lanes: int) -> str:
    """``__builtin_shuffle`` masks moving a vector ``k`` lanes up (k = 1, 2, 4, ...), zeros
    (lane ``lanes`` of the second operand) coming in."""
    out = []
    k = 1
    while k < lanes:
        out.append("{" + ", ".join(str(j - k if j >= k else lanes) for j in range(lanes)) + "}")
        k *= 2
    return ", ".join(out)


def _prefix_sum(t: str, i: str, lanes: int) -> str:
    steps = lanes.bit_length() - 1
    return f'''
static inline void tw_prefix_sum({t} *__restrict__ a, int64_t n) {{
  typedef {t} V __attribute__((vector_size({lanes} * sizeof({t}))));
  typedef {i} M __attribute__((vector_size({lanes} * sizeof({t}))));
  static const M shift[{steps}] = {{{_shift_masks(lanes)}}};
  const M last = {{{", ".join([str(lanes - 1)] * lanes)}}};
  const V zero = {{}};
  V carry = {{}};
  int64_t i = 0;
  for (; i + {lanes} <= n; i += {lanes}) {{
    V v;
    __builtin_memcpy(&v, a + i, sizeof(V));
    for (int k = 0; k < {steps}; ++k) v += __builtin_shuffle(v, zero, shift[k]);
    v += carry;
    __builtin_memcpy(a + i, &v, sizeof(V));
    carry = __builtin_shuffle(v, last);
  }}
  {t} c = carry[0];
  for (; i < n; ++i) {{ c = {t}(c + a[i]); a[i] = c; }}
}}'''


HELPERS = {
    "tw_in_dim": '''
// a scatter's index checked against its dim: outside it the kernel reports IndexError (as
// torch raises) and the element is not written
static inline bool tw_in_dim(int64_t i, int64_t size, int64_t *err) {
  if (i < 0 || i >= size) { __atomic_store_n(err, int64_t(2), __ATOMIC_RELAXED); return false; }
  return true;
}
''',
    # a row buffer's inclusive prefix sum in place, one 64-byte vector a step: the step's own
    # prefix by log2(lanes) shifted adds (a tree within the step), then the carry of the steps
    # before added, the one dependency from step to step (a sum a step, where an element at a
    # time waits one add's latency per element: the cumsum kernel of 1024x1024 fp32 measured
    # 0.29 ms against eager's 1.02 ms, one thread); the tail in order. Sums only: a product or max reassociated could overflow where eager's order
    # does not, those scans stay in order
    "tw_prefix_sum": "\n".join(_prefix_sum(t, i, 64 // size) for t, i, size in (
        ("float", "int32_t", 4), ("double", "int64_t", 8), ("int64_t", "int64_t", 8),
        ("int32_t", "int32_t", 4))) + "\n",
}
