// Kernel timeline of a CUDA program as it runs, CUDA graphs and programmatic dependent launches
// included (issue 29): a CUPTI injection library that records every kernel's start and end
// (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: kernels are not serialised, unlike ncu) over the
// whole run, with the program's cudaProfilerStart / cudaProfilerStop as marker rows
// (ttft_bench --profile: one LAZY request, its prefill and one decode step, inside them).
//
//   CUDA_INJECTION64_PATH=$PWD/libkernel_trace.so KERNEL_TRACE_OUT=trace.csv ttft_bench --profile
//   python3 bench/dev/kernel_trace/trace_timeline.py trace.csv
//
// CSV columns: start_ns, end_ns (GPU timestamps), stream, graph_node (0 outside graphs), grid,
// block, name (demangled). Needs libcupti on the library path (the CUDA toolkit's).
#include <cupti.h>
#include <cxxabi.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace {

constexpr size_t kBufferBytes = size_t{8} << 20;

std::mutex mu;
FILE* out = nullptr;
CUpti_SubscriberHandle subscriber;

#define TRACE_CUPTI(call)                                                         \
  do {                                                                            \
    const CUptiResult r = (call);                                                 \
    if (r != CUPTI_SUCCESS) {                                                     \
      const char* msg = nullptr;                                                  \
      cuptiGetResultString(r, &msg);                                              \
      std::fprintf(stderr, "kernel_trace: %s: %s\n", #call, msg ? msg : "error"); \
    }                                                                             \
  } while (0)

std::string Demangled(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string s = status == 0 && d != nullptr ? d : name;
  std::free(d);
  for (char& c : s) {
    if (c == '"') c = '\'';
  }
  return s;
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer != nullptr ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mu);
  CUpti_Activity* record = nullptr;
  while (out != nullptr && cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
    const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
    std::fprintf(out, "%llu,%llu,%u,%llu,%d,%d,\"%s\"\n", static_cast<unsigned long long>(k->start),
                 static_cast<unsigned long long>(k->end), k->streamId,
                 static_cast<unsigned long long>(k->graphNodeId), k->gridX * k->gridY * k->gridZ,
                 k->blockX * k->blockY * k->blockZ, Demangled(k->name).c_str());
  }
  size_t dropped = 0;
  cuptiActivityGetNumDroppedRecords(nullptr, 0, &dropped);
  if (dropped != 0) std::fprintf(stderr, "kernel_trace: %zu records dropped\n", dropped);
  std::free(buffer);
}

// The program's profiler range, as marker rows (name #start / #stop) on CUPTI's clock.
void CUPTIAPI OnApi(void*, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_RUNTIME_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  const bool start = id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000 &&
                     info->callbackSite == CUPTI_API_EXIT;
  const bool stop = id == CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000 &&
                    info->callbackSite == CUPTI_API_ENTER;
  if (!start && !stop) return;
  uint64_t now = 0;
  TRACE_CUPTI(cuptiGetTimestamp(&now));
  std::lock_guard<std::mutex> lock(mu);
  if (out != nullptr) {
    std::fprintf(out, "%llu,%llu,0,0,0,0,\"%s\"\n", static_cast<unsigned long long>(now),
                 static_cast<unsigned long long>(now), start ? "#start" : "#stop");
  }
}

void AtExit() {
  cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  std::lock_guard<std::mutex> lock(mu);
  if (out != nullptr) std::fclose(out);
  out = nullptr;
}

}  // namespace

// Called by the CUDA driver when it loads CUDA_INJECTION64_PATH.
extern "C" int InitializeInjection(void) {
  const char* path = std::getenv("KERNEL_TRACE_OUT");
  out = std::fopen(path != nullptr ? path : "kernel_trace.csv", "w");
  if (out == nullptr) {
    std::perror("kernel_trace: cannot open KERNEL_TRACE_OUT");
    return 0;
  }
  std::fprintf(out, "start_ns,end_ns,stream,graph_node,grid,block,name\n");
  TRACE_CUPTI(cuptiActivityRegisterCallbacks(BufferRequested, BufferCompleted));
  // Every kernel from the start (graphs instantiated before the profiler range included);
  // trace_timeline.py keeps those inside the range.
  TRACE_CUPTI(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
  TRACE_CUPTI(cuptiSubscribe(&subscriber, OnApi, nullptr));
  TRACE_CUPTI(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                  CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStart_v4000));
  TRACE_CUPTI(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                                  CUPTI_RUNTIME_TRACE_CBID_cudaProfilerStop_v4000));
  std::atexit(AtExit);
  return 1;
}
