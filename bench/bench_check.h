// Exit-on-failure checks for the CUDA benchmark programs (kernel_bench, peer_transfer_bench):
// a benchmark that hits an error prints where and stops rather than timing garbage.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"

#define BENCH_CUDA(expr)                                                                         \
  do {                                                                                           \
    cudaError_t _e = (expr);                                                                     \
    if (_e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(_e)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

#define BENCH_OK(expr)                                                               \
  do {                                                                               \
    absl::Status _s = (expr);                                                        \
    if (!_s.ok()) {                                                                  \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, _s.ToString().c_str()); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
