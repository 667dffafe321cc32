/* tilewright's launcher for generated C++ kernels: one CPython call, no per-argument ctypes
 * conversion. Every kernel has the ABI `int64_t kernel(const int64_t *args)` (pointers, strides,
 * sizes and knobs as 64-bit integers); `call(fn, a0, a1, ...)` packs the arguments on the stack,
 * releases the GIL while the kernel runs and returns its status (0: fine, else an error code the
 * Python launcher turns into an exception). Built once per Python and compiler
 * (tilewright/runtime/cpp/__init__.py). */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define TW_MAX_ARGS 1024

typedef int64_t (*tw_kernel_fn)(const int64_t *);

static PyObject *tw_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
  (void)self;
  if (nargs < 1) {
    PyErr_SetString(PyExc_TypeError, "call(fn, *int64 args): missing the kernel address");
    return NULL;
  }
  if (nargs - 1 > TW_MAX_ARGS) {
    PyErr_Format(PyExc_ValueError, "a kernel takes at most %d arguments, got %zd", TW_MAX_ARGS, nargs - 1);
    return NULL;
  }
  tw_kernel_fn fn = (tw_kernel_fn)PyLong_AsVoidPtr(args[0]);
  if (fn == NULL) {
    if (!PyErr_Occurred())
      PyErr_SetString(PyExc_ValueError, "null kernel address");
    return NULL;
  }
  int64_t packed[TW_MAX_ARGS];
  for (Py_ssize_t i = 1; i < nargs; ++i) {
    long long v = PyLong_AsLongLong(args[i]);
    if (v == -1 && PyErr_Occurred())
      return NULL;
    packed[i - 1] = (int64_t)v;
  }
  int64_t rc;
  Py_BEGIN_ALLOW_THREADS
  rc = fn(packed);
  Py_END_ALLOW_THREADS
  return PyLong_FromLongLong((long long)rc);
}

static PyMethodDef tw_methods[] = {
    {"call", (PyCFunction)(void (*)(void))tw_call, METH_FASTCALL, "call(fn, *args) -> status"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef tw_module = {PyModuleDef_HEAD_INIT, "tw_cpp_launch", NULL, -1, tw_methods};

PyMODINIT_FUNC PyInit_tw_cpp_launch(void) { return PyModule_Create(&tw_module); }
