// tilewright's SYCL host shim: a tiny C ABI over the SYCL runtime, loaded with ctypes.
//
// Built by tilewright/runtime/sycl/__init__.py with the system g++ on first use (never by
// hand) against the headers and libsycl of the `intel-sycl-rt` wheel, and cached under
// tilewright's cache folder keyed by this file's hash and the wheel version.
//
// What it does: one queue on the device SYCL's default selector picks (on a host without an
// Intel GPU, ONEAPI_DEVICE_SELECTOR=opencl:cpu makes that the OpenCL CPU device); kernel
// bundles built at run time from SYCL source (the kernel_compiler extension,
// source_language::sycl); kernels looked up by their extern "C" name; nd_range launches whose
// arguments are pointers or 64-bit integers; USM allocations for devices that cannot read
// host memory directly.
//
// Every entry point catches C++ exceptions: a failure returns 0 / nullptr and writes one
// message into the caller's `err` buffer (no exception ever crosses the C boundary).

#include <sycl/sycl.hpp>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

namespace syclex = sycl::ext::oneapi::experimental;

namespace {

struct Context {
  sycl::queue queue;
};

struct Bundle {
  sycl::kernel_bundle<sycl::bundle_state::executable> exe;
  std::string log;
};

void put(char *err, size_t len, const std::string &msg) {
  if (err == nullptr || len == 0) return;
  size_t n = msg.size() < len - 1 ? msg.size() : len - 1;
  std::memcpy(err, msg.data(), n);
  err[n] = '\0';
}

}  // namespace

extern "C" {

// Create a queue on the selected device. Returns a handle or nullptr (message in err).
void *tw_sycl_create(char *err, size_t errlen) {
  try {
    // in-order: launches run one after another, as the wrapper calls them
    auto *ctx = new Context{sycl::queue{sycl::default_selector_v, sycl::property::queue::in_order{}}};
    if (!ctx->queue.get_device().ext_oneapi_can_compile(syclex::source_language::sycl)) {
      put(err, errlen, "the selected SYCL device cannot compile SYCL source at run time");
      delete ctx;
      return nullptr;
    }
    return ctx;
  } catch (const std::exception &e) {
    put(err, errlen, e.what());
    return nullptr;
  }
}

void tw_sycl_destroy(void *ctx) { delete static_cast<Context *>(ctx); }

// Describe the device: "<name>|<backend>|<max work-group size>|<system_usm 0/1>|<host_usm 0/1>|<local mem bytes>".
int tw_sycl_device_info(void *handle, char *out, size_t outlen) {
  auto *ctx = static_cast<Context *>(handle);
  try {
    auto dev = ctx->queue.get_device();
    std::string backend;
    switch (dev.get_backend()) {
      case sycl::backend::opencl: backend = "opencl"; break;
      case sycl::backend::ext_oneapi_level_zero: backend = "level_zero"; break;
      default: backend = "other";
    }
    std::string info = dev.get_info<sycl::info::device::name>() + "|" + backend + "|" +
                       std::to_string(dev.get_info<sycl::info::device::max_work_group_size>()) + "|" +
                       std::to_string(dev.has(sycl::aspect::usm_system_allocations) ? 1 : 0) + "|" +
                       std::to_string(dev.has(sycl::aspect::usm_host_allocations) ? 1 : 0) + "|" +
                       std::to_string(dev.get_info<sycl::info::device::local_mem_size>());
    put(out, outlen, info);
    return 1;
  } catch (const std::exception &e) {
    put(out, outlen, e.what());
    return 0;
  }
}

// Build an executable bundle from SYCL source. Returns a handle or nullptr (the message and
// the compiler's log in err).
void *tw_sycl_build(void *handle, const char *source, const char *options, char *err, size_t errlen) {
  auto *ctx = static_cast<Context *>(handle);
  std::string log;
  try {
    auto src = syclex::create_kernel_bundle_from_source(
        ctx->queue.get_context(), syclex::source_language::sycl, std::string(source));
    std::vector<std::string> opts;
    // options are separated by newlines (one option may contain spaces)
    std::string all(options ? options : "");
    size_t start = 0;
    while (start < all.size()) {
      size_t end = all.find('\n', start);
      if (end == std::string::npos) end = all.size();
      if (end > start) opts.push_back(all.substr(start, end - start));
      start = end + 1;
    }
    auto exe = syclex::build(src, syclex::properties{syclex::build_options{opts}, syclex::save_log{&log}});
    return new Bundle{exe, log};
  } catch (const std::exception &e) {
    put(err, errlen, std::string(e.what()) + (log.empty() ? "" : "\n" + log));
    return nullptr;
  }
}

void tw_sycl_free_bundle(void *bundle) { delete static_cast<Bundle *>(bundle); }

// A kernel of a bundle by its (extern "C") name. Returns a handle or nullptr.
void *tw_sycl_get_kernel(void *bundle, const char *name, char *err, size_t errlen) {
  try {
    return new sycl::kernel(static_cast<Bundle *>(bundle)->exe.ext_oneapi_get_kernel(std::string(name)));
  } catch (const std::exception &e) {
    put(err, errlen, e.what());
    return nullptr;
  }
}

void tw_sycl_free_kernel(void *kernel) { delete static_cast<sycl::kernel *>(kernel); }

// Launch `kernel` over a 1-D nd_range of `global` work-items in groups of `local`, and wait.
// Argument i is a pointer when kinds[i] == 'p' (its value in ptrs[i]) or a 64-bit integer
// when kinds[i] == 'i' (in ints[i]). Returns 1, or 0 with the message in err.
int tw_sycl_launch(void *handle, void *kernel, int nargs, const char *kinds, void *const *ptrs,
                   const int64_t *ints, size_t global, size_t local, char *err, size_t errlen) {
  auto *ctx = static_cast<Context *>(handle);
  auto *k = static_cast<sycl::kernel *>(kernel);
  try {
    ctx->queue
        .submit([&](sycl::handler &h) {
          for (int i = 0; i < nargs; ++i) {
            if (kinds[i] == 'p') {
              h.set_arg(i, ptrs[i]);
            } else {
              h.set_arg(i, ints[i]);
            }
          }
          h.parallel_for(sycl::nd_range<1>{sycl::range<1>{global}, sycl::range<1>{local}}, *k);
        })
        .wait_and_throw();
    return 1;
  } catch (const std::exception &e) {
    put(err, errlen, e.what());
    return 0;
  }
}

// USM shared memory (for devices that cannot read host memory: a discrete GPU). nullptr on failure.
void *tw_sycl_malloc_shared(void *handle, size_t bytes) {
  auto *ctx = static_cast<Context *>(handle);
  try {
    return sycl::malloc_shared(bytes, ctx->queue);
  } catch (const std::exception &) {
    return nullptr;
  }
}

void tw_sycl_free(void *handle, void *ptr) {
  auto *ctx = static_cast<Context *>(handle);
  try {
    sycl::free(ptr, ctx->queue);
  } catch (const std::exception &) {
  }
}

}  // extern "C"

extern "C" {

// The device code of a built bundle, as the backend holds it (for the OpenCL CPU device: the
// program binary clGetProgramInfo(CL_PROGRAM_BINARIES) returns), for `tilewright aot`: the
// device images' backend content in image order, each preceded by its size as 8 bytes
// (little-endian). Writes at most `cap` bytes into `out` and returns the full size (call
// with cap 0 to size the buffer), or -1 on failure (message in err).
long long tw_sycl_bundle_binary(void *bundle, unsigned char *out, size_t cap, char *err, size_t errlen) {
  auto *b = static_cast<Bundle *>(bundle);
  try {
    std::vector<unsigned char> all;
    for (const auto &image : b->exe) {
      std::vector<std::byte> bytes = image.ext_oneapi_get_backend_content();
      uint64_t n = bytes.size();
      for (int i = 0; i < 8; ++i) all.push_back(static_cast<unsigned char>((n >> (8 * i)) & 0xff));
      for (std::byte c : bytes) all.push_back(static_cast<unsigned char>(c));
    }
    if (out != nullptr) std::memcpy(out, all.data(), all.size() < cap ? all.size() : cap);
    return static_cast<long long>(all.size());
  } catch (const std::exception &e) {
    put(err, errlen, e.what());
    return -1;
  }
}

}  // extern "C"
