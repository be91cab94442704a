#include "worker/backend/cuda/cuda_tensor_parallel.h"

#ifdef LAZYRAG_HAVE_NCCL
#include <nccl.h>
#endif

#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/backend/tp_shard.h"

#ifdef LAZYRAG_HAVE_NCCL
#define LAZYRAG_RETURN_IF_NCCL_ERROR(expr)                                     \
  do {                                                                         \
    const ncclResult_t lazyrag_nccl_result = (expr);                           \
    if (lazyrag_nccl_result != ncclSuccess) {                                  \
      return absl::InternalError(                                              \
          absl::StrCat(#expr, ": ", ncclGetErrorString(lazyrag_nccl_result))); \
    }                                                                          \
  } while (0)
#endif

namespace lazyrag {
namespace cuda_backend {

void DestroyNcclComm(void* nccl_comm) {
#ifdef LAZYRAG_HAVE_NCCL
  if (nccl_comm != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(nccl_comm));
#else
  (void)nccl_comm;
#endif
}

absl::Status NcclAllReduce::SumBf16(uint16_t* data, int64_t count, cudaStream_t stream) {
  if (ranks_ <= 1 || count == 0) return absl::OkStatus();
#ifdef LAZYRAG_HAVE_NCCL
  LAZYRAG_RETURN_IF_NCCL_ERROR(ncclAllReduce(data, data, size_t(count), ncclBfloat16, ncclSum,
                                             static_cast<ncclComm_t>(comm_), stream));
  return absl::OkStatus();
#else
  (void)data;
  (void)stream;
  return absl::UnimplementedError("cuda backend: built without NCCL (no tensor parallelism)");
#endif
}

void NcclAllReduce::Destroy(int device, cudaStream_t stream) {
  if (comm_ == nullptr) return;
  if (stream != nullptr && cudaSetDevice(device) == cudaSuccess) cudaStreamSynchronize(stream);
  DestroyNcclComm(comm_);
  comm_ = nullptr;
}

}  // namespace cuda_backend

bool CudaBackendHasNccl() {
#ifdef LAZYRAG_HAVE_NCCL
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaTensorParallelBackend(
    const LoadedModel& model, int tensor_parallel, const CudaBackendOptions& options) {
  RETURN_IF_ERROR(model.config.Validate());
  RETURN_IF_ERROR(CheckShardable(model.config, {tensor_parallel, 0}));
  const int n = tensor_parallel;
  std::vector<std::unique_ptr<Backend>> ranks(n);
  if (n == 1) {
    CudaBackendOptions o = options;
    o.shard = {};
    o.nccl_comm = nullptr;
    ASSIGN_OR_RETURN(ranks[0], CreateCudaBackend(model, o));
    return CreateTensorParallelBackend(model.config, std::move(ranks));
  }
#ifndef LAZYRAG_HAVE_NCCL
  return absl::UnimplementedError(absl::StrCat("cuda backend: tensor parallelism over ", n,
                                               " GPUs needs NCCL, not found at build time"));
#else
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
  if (options.device < 0 || options.device + n > count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cuda backend: tensor parallelism over ", n, " GPUs from device ", options.device,
        " needs devices up to ", options.device + n - 1, "; ", count, " present"));
  }
  // NVLink multicast (NVLS) off unless the user set it: setenv does not overwrite.
  setenv("NCCL_NVLS_ENABLE", "0", 0);
  std::vector<int> devices(n);
  for (int r = 0; r < n; ++r) devices[r] = options.device + r;
  std::vector<ncclComm_t> comms(n, nullptr);
  LAZYRAG_RETURN_IF_NCCL_ERROR(ncclCommInitAll(comms.data(), n, devices.data()));
  // One thread per rank: weight generation / upload on every device at once.
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      CudaBackendOptions o = options;
      o.device = devices[r];
      o.shard = {n, r};
      o.nccl_comm = comms[r];  // owned by the rank from here, also on failure
      auto b = CreateCudaBackend(model, o);
      if (b.ok()) {
        ranks[r] = std::move(*b);
      } else {
        status[r] = b.status();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    if (!status[r].ok()) {
      return absl::Status(status[r].code(),
                          absl::StrCat("tensor parallel rank ", r, ": ", status[r].message()));
    }
  }
  return CreateTensorParallelBackend(model.config, std::move(ranks));
#endif
}

}  // namespace lazyrag
