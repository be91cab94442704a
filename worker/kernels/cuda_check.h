// The one family of status-returning checks for CUDA runtime and cuBLAS calls, used by the
// kernels and the CUDA backend (never abort).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

// Returns an INTERNAL status (RESOURCE_EXHAUSTED for out-of-memory) from the enclosing function
// when a CUDA runtime call fails.
#define LAZYRAG_RETURN_IF_CUDA_ERROR(expr)                         \
  do {                                                             \
    const cudaError_t _lazyrag_cuda_err = (expr);                  \
    if (_lazyrag_cuda_err != cudaSuccess) {                        \
      return ::lazyrag::CudaErrorStatus(_lazyrag_cuda_err, #expr); \
    }                                                              \
  } while (0)

// Checks the launch just made (configuration errors surface here, faults later on the stream).
#define LAZYRAG_RETURN_IF_LAUNCH_ERROR() LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetLastError())

#define LAZYRAG_RETURN_IF_CUBLAS_ERROR(expr)                                     \
  do {                                                                           \
    const cublasStatus_t _lazyrag_cublas_st = (expr);                            \
    if (_lazyrag_cublas_st != CUBLAS_STATUS_SUCCESS) {                           \
      return ::absl::InternalError(                                              \
          ::absl::StrCat(#expr, ": ", cublasGetStatusName(_lazyrag_cublas_st))); \
    }                                                                            \
  } while (0)

namespace lazyrag {

inline absl::Status CudaErrorStatus(cudaError_t err, const char* what) {
  std::string msg = absl::StrCat(what, ": ", cudaGetErrorName(err), " ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

}  // namespace lazyrag
