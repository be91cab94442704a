#include "common/native_blas.h"

#include <dlfcn.h>
#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lazyrag {
namespace {

// Looked up at run time so that programs without OpenBLAS (kvstore, router) link this file
// without it.
const char* OpenBlasCoreName() {
  using CoreNameFn = char* (*)();
  auto fn = reinterpret_cast<CoreNameFn>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fn == nullptr ? nullptr : fn();
}

// OpenBLAS's x86-64 kernel sets older than Haswell: what it falls back to on a CPU it does not
// recognise.
bool IsGenericCore(const char* core) {
  for (const char* name : {"Prescott", "Katmai", "Coppermine", "Northwood", "Banias", "Core2",
                           "Penryn", "Dunnington", "Nehalem", "Atom", "Sandybridge", "unknown"}) {
    if (strcasecmp(core, name) == 0) return true;
  }
  return false;
}

const char* NativeCore() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512cd")) {
    return "SkylakeX";
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

std::string BlasCoreName() {
  const char* core = OpenBlasCoreName();
  return core == nullptr ? std::string() : std::string(core);
}

void PreferNativeBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = OpenBlasCoreName();
  if (core == nullptr || !IsGenericCore(core)) return;
  const char* native = NativeCore();
  if (native == nullptr) return;
  if (setenv("OPENBLAS_CORETYPE", native, 1) != 0) return;
  execv("/proc/self/exe", argv);
  std::fprintf(stderr, "lazyrag: re-exec failed (%s); keeping OpenBLAS's %s kernels\n",
               std::strerror(errno), core);
}

}  // namespace lazyrag
