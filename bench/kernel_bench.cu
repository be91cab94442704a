// Kernel benchmark for worker/kernels on the Llama-3-8B attention shape (32 query heads,
// 8 KV heads, head dim 128, bf16 KV, page size 16), one layer per launch:
//   * the bandwidth ceilings, measured in the same run (MeasureCeilings: eager cudaMemcpy,
//     a vectorized copy kernel, a read-only kernel);
//   * decode, batch 1/16/64/128, 10,240-token context (5 documents of 2,040 tokens + the
//     request's own 40), LAZY vs all-zero deltas vs the key-rotating (MEPIC) variant, beside
//     the warp pipes with cp.async copies (lazy_cp_async: num_pages unknown) and every K/V
//     read after the PDL wait (lazy_wait_all); batch 1 also without overlap between launches
//     (*_isolated), and with --decode-b1 against forced split counts;
//   * 32-token query block, batch 1 and 16, against the same 10,240 cached tokens, with the
//     launcher's kernel (variant lazy: wgmma on sm_90a) and the mma.sync kernel forced
//     (lazy_mma);
//   * large prefill: 2,048-token chunks (the request's own tokens, causal) after the same
//     10,200 document tokens, batch 1 and 4, wgmma vs mma.sync;
//   * batch 1 decode and query block against forced KV split counts (both prefill kernels);
//   * batch-1 diagnostics (diag_*): a plain read and a math-free gather of decode b1's bytes,
//     an empty kernel, the split merge alone, decode with pages in pool order;
//   * MATERIALIZE of 10,240 tokens x 32 layers (copy + re-rotate K, copy V).
// Timing: CUDA events around graph replays of 20 launches after warm-up, median of many
// samples (see TimeMedianMs); inputs rotate
// over enough copies to exceed 4x the L2 so every run reads HBM. Every request owns its
// pages (shuffled page order) so bytes are not shared through L2. Prints a table, writes
// JSON with --out PATH.
//
// Usage: kernel_bench [--out PATH] [--iters N] [--prefill-kernel auto|mma]
//                     [--decode-b1 | --chunks]
// (--prefill-kernel mma: every prefill row that would take the launcher's choice runs the
// mma.sync kernel instead; a fallback for when the wgmma kernel is broken. --decode-b1: only the
// decode rows of batches 1-8 and batch 1's forced split counts; --chunks: only the 2,048-row
// chunk rows, sampled as in a full run; both for quick A/B runs, e.g. many alternations of
// builds in one call for rows whose runs spread, as the chunks' do.)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "bench/bench_cuda.cuh"
#include "worker/attention/segment_view.h"
#include "worker/kernels/attention_internal.cuh"  // diagnostics: the merge kernel alone
#include "worker/kernels/lazy_attention.h"
#include "worker/kernels/materialize.h"

namespace lazyrag::kernels {
namespace {

using bench_cuda::DeviceAlloc;
using bench_cuda::DeviceUpload;
using bench_cuda::FillRandom;
using bench_cuda::kGroup;
using bench_cuda::ReadKernel;
using bench_cuda::TimeMedianMs;

constexpr int kHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;
constexpr int kDocs = 5, kDocLen = 2040, kOwnLen = 40;  // 10,240 tokens of context

// The prefill kernel of rows that do not force one (--prefill-kernel).
PrefillKernel g_default_prefill_kernel = PrefillKernel::kAuto;

const char* VariantName(PrefillKernel kernel) {
  return kernel == PrefillKernel::kMmaSync ? "lazy_mma" : "lazy";
}

struct Result {
  std::string name;
  std::string kind;  // decode | prefill | materialize | memcpy
  int batch = 0;
  int q_len = 0;
  int context = 0;
  std::string variant;
  double ms = 0;
  double bytes = 0;
  double flops = 0;
};

// One batch of requests on the benchmark shape, `copies` independent instances of it (the
// benchmark rotates over them so that L2 never holds the working set).
struct AttentionSetup {
  int batch = 0, q_len = 0, copies = 0, kv_len = 0, num_pages = 0;
  uint16_t *k = nullptr, *v = nullptr, *q = nullptr, *out = nullptr;
  float* inv_freq = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  std::vector<SegmentView> views[2];    // [zero_deltas][copy]
  std::vector<int32_t*> device_arrays;  // freed at exit (process end)

  SegmentView Upload(const SegmentViewHost& h) {
    SegmentView v = h.View();
    auto up = [&](const std::vector<int32_t>& x) {
      int32_t* d = DeviceUpload(x);
      device_arrays.push_back(d);
      return d;
    };
    v.q_indptr = up(h.q_indptr);
    v.q_pos = up(h.q_pos);
    v.seg_indptr = up(h.seg_indptr);
    v.seg_start = up(h.seg_start);
    v.seg_len = up(h.seg_len);
    v.page_indptr = up(h.page_indptr);
    v.page_indices = up(h.page_indices);
    // Plain LAZY: no segment skips or score transforms (View() points them at host memory).
    v.seg_skip = nullptr;
    v.seg_scale = nullptr;
    v.seg_bias = nullptr;
    return v;
  }

  // own_len: the request's own tokens after the documents (queries are its last q_len);
  // max_splits sizes the split workspace; last_doc_len: the last document's tokens
  // (REQUIRES <= kDocLen: every document gets kDocLen's pages).
  AttentionSetup(int batch_, int q_len_, size_t l2_bytes, std::mt19937& rng, bool shuffle = true,
                 int own_len = kOwnLen, int max_splits = kMaxKvSplits, int last_doc_len = kDocLen)
      : batch(batch_), q_len(q_len_) {
    const int doc_pages = (kDocLen + kPageSize - 1) / kPageSize;
    const int own_pages = (own_len + kPageSize - 1) / kPageSize;
    const int pages_per_request = kDocs * doc_pages + own_pages;
    kv_len = (kDocs - 1) * kDocLen + last_doc_len + own_len;
    const size_t page_bytes = size_t(kPageSize) * kKvHeads * kHeadDim * 2;
    const size_t bytes_per_copy = size_t(batch) * pages_per_request * page_bytes * 2;
    copies = int(std::min<size_t>(16, std::max<size_t>(1, (4 * l2_bytes) / bytes_per_copy + 1)));
    num_pages = copies * batch * pages_per_request;
    const size_t pool_elems = size_t(num_pages) * kPageSize * kKvHeads * kHeadDim;
    k = DeviceAlloc<uint16_t>(pool_elems);
    v = DeviceAlloc<uint16_t>(pool_elems);
    FillRandom(k, pool_elems, 1);
    FillRandom(v, pool_elems, 2);
    const size_t q_elems = size_t(copies) * batch * q_len * kHeads * kHeadDim;
    q = DeviceAlloc<uint16_t>(q_elems);
    FillRandom(q, q_elems, 3);
    out = DeviceAlloc<uint16_t>(size_t(batch) * q_len * kHeads * kHeadDim);
    std::vector<float> f(kHeadDim / 2);
    for (int i = 0; i < kHeadDim / 2; ++i) f[i] = float(std::pow(500000.0, -2.0 * i / kHeadDim));
    inv_freq = DeviceUpload(f);
    workspace_bytes = LazyAttentionWorkspaceBytes(batch * q_len, kHeads, kHeadDim, max_splits);
    workspace = DeviceAlloc<uint8_t>(workspace_bytes);

    std::vector<int32_t> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    if (shuffle) std::shuffle(perm.begin(), perm.end(), rng);
    for (int zero = 0; zero < 2; ++zero) {
      int next = 0;
      for (int c = 0; c < copies; ++c) {
        SegmentViewHost h;
        h.page_size = kPageSize;
        for (int b = 0; b < batch; ++b) {
          int start = 0;
          for (int d = 0; d < kDocs; ++d) {
            std::vector<int32_t> pages(perm.begin() + next, perm.begin() + next + doc_pages);
            next += doc_pages;
            const int len = d + 1 == kDocs ? last_doc_len : kDocLen;
            h.AddSegment(zero ? 0 : start, len, pages);
            start += len;
          }
          std::vector<int32_t> pages(perm.begin() + next, perm.begin() + next + own_pages);
          next += own_pages;
          h.AddSegment(zero ? 0 : start, own_len, pages);
          // Queries: the last q_len tokens of the own segment (positions as in LAZY; with
          // zero deltas every key is still visible, so the work is the same).
          std::vector<int32_t> pos(q_len);
          for (int i = 0; i < q_len; ++i) pos[i] = start + own_len - q_len + i;
          h.EndRequest(pos);
        }
        views[zero].push_back(Upload(h));
      }
    }
  }
  ~AttentionSetup() {
    cudaFree(k);
    cudaFree(v);
    cudaFree(q);
    cudaFree(out);
    cudaFree(inv_freq);
    cudaFree(workspace);
    for (int32_t* p : device_arrays) cudaFree(p);
  }

  LazyAttentionParams Params(int copy, bool zero_deltas, KeyLayout layout) const {
    LazyAttentionParams p;
    p.shape.num_heads = kHeads;
    p.shape.num_kv_heads = kKvHeads;
    p.shape.head_dim = kHeadDim;
    p.shape.scale = 1.0f / std::sqrt(float(kHeadDim));
    p.key_layout = layout;
    p.q = q + size_t(copy) * batch * q_len * kHeads * kHeadDim;
    p.k_cache = k;
    p.v_cache = v;
    p.out = out;
    p.inv_freq = inv_freq;
    p.view = views[zero_deltas ? 1 : 0][copy];
    p.max_q_len = q_len;
    p.max_kv_len = kv_len;
    p.workspace = workspace;
    p.workspace_bytes = workspace_bytes;
    p.prefill_kernel = g_default_prefill_kernel;
    p.num_pages = num_pages;
    // As the engine: nothing before a launch writes the cached keys (the previous launch
    // writes only `out` and the split scratch).
    p.stable_history = true;
    return p;
  }
  // KV bytes one launch reads (K and V of every key of every request, all KV heads).
  double KvBytes() const { return double(batch) * kv_len * kKvHeads * kHeadDim * 2 * 2; }
};

// Median time of one call of fn(stream), in milliseconds, WITHOUT a graph: each sample is one
// call between two events (for calls long enough that launch gaps do not matter: the copy
// ceilings, ~0.5 ms each). Warm-up calls first so that clocks ramp up from idle.
template <typename Fn>
double TimeEagerMs(int warmup, int iters, Fn&& fn) {
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  for (int i = 0; i < warmup; ++i) fn(stream);
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<cudaEvent_t> ev(2 * iters);
  for (auto& e : ev) BENCH_CUDA(cudaEventCreate(&e));
  for (int i = 0; i < iters; ++i) {
    BENCH_CUDA(cudaEventRecord(ev[2 * i], stream));
    fn(stream);
    BENCH_CUDA(cudaEventRecord(ev[2 * i + 1], stream));
  }
  BENCH_CUDA(cudaStreamSynchronize(stream));
  std::vector<double> ms(iters);
  for (int i = 0; i < iters; ++i) {
    float t = 0;
    BENCH_CUDA(cudaEventElapsedTime(&t, ev[2 * i], ev[2 * i + 1]));
    ms[i] = t;
  }
  for (auto& e : ev) BENCH_CUDA(cudaEventDestroy(e));
  BENCH_CUDA(cudaStreamDestroy(stream));
  std::sort(ms.begin(), ms.end());
  return ms[iters / 2];
}

// Copy ceiling kernel: 16-byte loads and stores, 4 independent loads in flight per thread
// before the first store, grid-stride.
__global__ void __launch_bounds__(256)
    CopyKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, size_t n) {
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = src[i], b = src[i + stride], c = src[i + 2 * stride], d = src[i + 3 * stride];
    dst[i] = a;
    dst[i + stride] = b;
    dst[i + 2 * stride] = c;
    dst[i + 3 * stride] = d;
  }
  for (; i < n; i += stride) dst[i] = src[i];
}

// Decode batch 1's gather without the math (a floor for that kernel's memory side): block
// (KV head, split) of kThreads threads reads its share of one request's pages (page size 16,
// head dim 128: per page and head 16 rows of 256 B for K and for V, 2 KiB apart), kPages pages
// per round with all their 16-byte loads in flight (kThreads / 16 rows per pass, so 4 loads
// per page per thread at 128 threads, 2 at 256), page ids staged in shared memory.
// kHeadMajor: the same bytes as if each page stored its heads one after another ([page][head]
// [16 rows][D], 4 KiB contiguous per page and head) instead of the pool's [page][row][head][D].
template <int kPages, bool kHeadMajor, int kThreads = 128>
__global__ void __launch_bounds__(kThreads)
    GatherKernel(const uint4* __restrict__ k, const uint4* __restrict__ v,
                 const int32_t* __restrict__ pages, int num_pages, int kv_heads, uint32_t* sink) {
  constexpr int kRows = kThreads / 16, kPasses = 16 / kRows;  // rows per pass, passes per page
  __shared__ int32_t ids[256];
  const int kvh = blockIdx.x, split = blockIdx.y, splits = gridDim.y;
  const int p0 = int(int64_t(num_pages) * split / splits);
  const int n = min(256, int(int64_t(num_pages) * (split + 1) / splits) - p0);
  for (int i = threadIdx.x; i < n; i += blockDim.x) ids[i] = pages[p0 + i];
  __syncthreads();
  const int row = threadIdx.x / 16, chunk = threadIdx.x % 16;  // kRows rows x 16 chunks
  const int64_t pass_stride = kHeadMajor ? kRows * 16 : int64_t(kRows) * kv_heads * 16;
  uint32_t x = 0;
  for (int p = 0; p < n; p += kPages) {
    uint4 a[kPages][2 * kPasses];
#pragma unroll
    for (int j = 0; j < kPages; ++j) {
      const int64_t pg = p + j < n ? ids[p + j] : 0;
      const int64_t r0 = kHeadMajor ? ((pg * kv_heads + kvh) * 16 + row) * 16 + chunk
                                    : ((pg * 16 + row) * kv_heads + kvh) * 16 + chunk;
#pragma unroll
      for (int q = 0; q < kPasses; ++q) {
        const bool ok = p + j < n;
        a[j][2 * q] = ok ? __ldcg(k + r0 + q * pass_stride) : make_uint4(0u, 0u, 0u, 0u);
        a[j][2 * q + 1] = ok ? __ldcg(v + r0 + q * pass_stride) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
#pragma unroll
    for (int j = 0; j < kPages; ++j) {
#pragma unroll
      for (int c = 0; c < 2 * kPasses; ++c) x ^= a[j][c].x ^ a[j][c].y ^ a[j][c].z ^ a[j][c].w;
    }
  }
  if (x == 0x9e3779b9u) sink[0] = x;
}

__global__ void EmptyKernel() {}
__global__ void ClusterProbeKernel() {}

// How many thread-block clusters of `size` blocks (256 threads, `smem` bytes of dynamic shared
// memory each, so one block per SM) the device holds at once: a decode that gives each
// (request, KV head) one cluster and reduces its splits in distributed shared memory (no merge
// kernel) needs one cluster per KV head (8 for the benchmark shape) resident together.
void PrintClusterCapacity() {
  const int smem = 200 << 10;
  if (cudaFuncSetAttribute(ClusterProbeKernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
          cudaSuccess ||
      cudaFuncSetAttribute(ClusterProbeKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
          cudaSuccess) {
    std::printf("cluster capacity: attributes not accepted (%s)\n",
                cudaGetErrorString(cudaGetLastError()));
    return;
  }
  for (int size : {4, 8, 16}) {
    cudaLaunchConfig_t config = {};
    config.gridDim = dim3(size * 16);
    config.blockDim = dim3(256);
    config.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = size;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    config.attrs = attr;
    config.numAttrs = 1;
    int clusters = 0;
    const cudaError_t err = cudaOccupancyMaxActiveClusters(&clusters, ClusterProbeKernel, &config);
    if (err != cudaSuccess) {
      std::printf("cluster capacity: %2d blocks: query failed (%s)\n", size,
                  cudaGetErrorString(err));
      continue;
    }
    std::printf("cluster capacity: %2d blocks x 256 threads x %d KiB smem: %d clusters at once\n",
                size, smem >> 10, clusters);
  }
  (void)cudaGetLastError();
}

// Device bandwidth ceilings, measured in the same run. Warm-up first (the GPU idles at low
// clocks), 1 GiB buffers (18x the L2), median of `iters` single calls.
//  * memcpy_d2d: cudaMemcpyAsync device-to-device outside a graph (read + write bytes). Inside
//    a CUDA graph the same copy became a memcpy node that ran at 2.77 TB/s on 2026-11-29
//    (against ~4.3 outside): that was the bogus ceiling of the first run; it is still timed,
//    as memcpy_d2d_graph, to show the difference.
//  * copy_kernel: the vectorized copy kernel above (read + write bytes).
//  * read_kernel: read-only bandwidth, the natural roof for decode.
struct Ceilings {
  double memcpy_ms = 0, memcpy_graph_ms = 0, copy_ms = 0, read_ms = 0;
  size_t bytes = size_t(1) << 30;
  double Tbs(double ms, double moved) const { return moved / (ms * 1e-3) / 1e12; }
  double CopyTbs() const {
    return std::max(Tbs(memcpy_ms, 2.0 * bytes), Tbs(copy_ms, 2.0 * bytes));
  }
};

Ceilings MeasureCeilings(int iters, int sms) {
  Ceilings c;
  void *a = nullptr, *b = nullptr;
  uint32_t* sink = nullptr;
  BENCH_CUDA(cudaMalloc(&a, 2 * c.bytes));
  BENCH_CUDA(cudaMalloc(&b, c.bytes));
  BENCH_CUDA(cudaMalloc(&sink, 4));
  FillRandom(static_cast<uint16_t*>(a), c.bytes, 7);  // 2 GiB of random bf16
  BENCH_CUDA(cudaDeviceSynchronize());
  const size_t n16 = c.bytes / 16;
  const int grid = sms * 8;
  auto copy = [&](cudaStream_t st) {
    CopyKernel<<<grid, 256, 0, st>>>(static_cast<const uint4*>(a), static_cast<uint4*>(b), n16);
    BENCH_CUDA(cudaGetLastError());
  };
  auto read = [&](cudaStream_t st) {
    ReadKernel<<<grid, 256, 0, st>>>(static_cast<const uint4*>(a), 2 * n16, sink);
    BENCH_CUDA(cudaGetLastError());
  };
  auto memcpy_fn = [&](cudaStream_t st) {
    BENCH_CUDA(cudaMemcpyAsync(b, a, c.bytes, cudaMemcpyDeviceToDevice, st));
  };
  TimeEagerMs(20, 5, copy);  // clocks up
  c.memcpy_ms = TimeEagerMs(10, iters, memcpy_fn);
  c.copy_ms = TimeEagerMs(10, iters, copy);
  c.read_ms = TimeEagerMs(10, iters, read);
  c.memcpy_graph_ms =
      TimeMedianMs(3, std::max(5, iters / 5), [&](int, cudaStream_t st) { memcpy_fn(st); });
  cudaFree(a);
  cudaFree(b);
  cudaFree(sink);
  return c;
}

std::string Json(const std::vector<Result>& rs, const cudaDeviceProp& prop, double copy_tbs,
                 double read_tbs) {
  std::string s = "{\n  \"device\": \"" + std::string(prop.name) + "\",\n";
  s += "  \"sms\": " + std::to_string(prop.multiProcessorCount) + ",\n";
  s += "  \"l2_bytes\": " + std::to_string(prop.l2CacheSize) + ",\n";
  char buf[512];
  std::snprintf(buf, sizeof(buf), "  \"copy_ceiling_tbs\": %.4f,\n  \"read_ceiling_tbs\": %.4f,\n",
                copy_tbs, read_tbs);
  s += buf;
  s += "  \"shape\": {\"num_heads\": 32, \"num_kv_heads\": 8, \"head_dim\": 128, "
       "\"page_size\": 16, \"dtype\": \"bf16\"},\n  \"results\": [\n";
  for (size_t i = 0; i < rs.size(); ++i) {
    const Result& r = rs[i];
    const double tbs = r.bytes / (r.ms * 1e-3) / 1e12;
    const double tflops = r.flops / (r.ms * 1e-3) / 1e12;
    std::snprintf(buf, sizeof(buf),
                  "    {\"name\": \"%s\", \"kind\": \"%s\", \"variant\": \"%s\", \"batch\": %d, "
                  "\"q_len\": %d, \"context\": %d, \"ms\": %.6f, \"bytes\": %.0f, "
                  "\"tbs\": %.4f, \"flops\": %.0f, \"tflops\": %.3f}%s\n",
                  r.name.c_str(), r.kind.c_str(), r.variant.c_str(), r.batch, r.q_len, r.context,
                  r.ms, r.bytes, tbs, r.flops, tflops, i + 1 < rs.size() ? "," : "");
    s += buf;
  }
  s += "  ]\n}\n";
  return s;
}

// Prints the results table and writes the JSON (when out_path is set); the exit status.
int Report(const std::vector<Result>& results, const cudaDeviceProp& prop, double copy_tbs,
           double read_tbs, const std::string& out_path) {
  std::printf(
      "\nceilings: copy %.3f TB/s (best of eager cudaMemcpy and the copy kernel), "
      "read %.3f TB/s; %%copy below is against the copy ceiling\n",
      copy_tbs, read_tbs);
  std::printf("\n%-22s %-12s %10s %10s %9s %9s %8s\n", "case", "variant", "ms", "MB", "TB/s",
              "TFLOP/s", "%copy");
  for (const Result& r : results) {
    const double tbs = r.bytes / (r.ms * 1e-3) / 1e12;
    const double tflops = r.flops / (r.ms * 1e-3) / 1e12;
    std::printf("%-22s %-12s %10.4f %10.1f %9.3f %9.2f %7.1f%%\n", r.name.c_str(),
                r.variant.c_str(), r.ms, r.bytes / 1e6, tbs, tflops, 100.0 * tbs / copy_tbs);
  }
  if (!out_path.empty()) {
    FILE* f = std::fopen(out_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", out_path.c_str());
      return 1;
    }
    const std::string js = Json(results, prop, copy_tbs, read_tbs);
    std::fwrite(js.data(), 1, js.size(), f);
    std::fclose(f);
    std::printf("wrote %s\n", out_path.c_str());
  }
  return 0;
}

int Main(int argc, char** argv) {
  std::string out_path;
  int iters = 50;
  bool decode_b1 = false;    // only the decode rows of batches 1-8 (quick A/B runs)
  bool chunks_only = false;  // only the 2,048-row chunk rows (quick A/B runs)
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      out_path = argv[++i];
    } else if (!std::strcmp(argv[i], "--decode-b1")) {
      decode_b1 = true;
    } else if (!std::strcmp(argv[i], "--chunks")) {
      chunks_only = true;
    } else if (!std::strcmp(argv[i], "--iters") && i + 1 < argc) {
      iters = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--prefill-kernel") && i + 1 < argc &&
               (!std::strcmp(argv[i + 1], "auto") || !std::strcmp(argv[i + 1], "mma"))) {
      g_default_prefill_kernel =
          !std::strcmp(argv[++i], "mma") ? PrefillKernel::kMmaSync : PrefillKernel::kAuto;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--out PATH] [--iters N] [--prefill-kernel auto|mma] "
                   "[--decode-b1 | --chunks]\n",
                   argv[0]);
      return 2;
    }
  }
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::fprintf(stderr, "kernel_bench: no CUDA device\n");
    return 1;
  }
  cudaDeviceProp prop;
  BENCH_CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MiB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::mt19937 rng(1234);
  std::vector<Result> results;
  PrintClusterCapacity();
  {
    bool fits = false;
    std::string report;
    BENCH_OK(DecodeSplitMergeResidency(&fits, &report));
    std::printf("split merge beside the b1 decode: %s (%s)\n", fits ? "resident" : "NOT resident",
                report.c_str());
  }

  const Ceilings ceil = MeasureCeilings(iters, prop.multiProcessorCount);
  const double copy_tbs = ceil.CopyTbs();
  const double read_tbs = ceil.Tbs(ceil.read_ms, 2.0 * ceil.bytes);
  results.push_back(
      {"memcpy_d2d_1GiB", "memcpy", 0, 0, 0, "eager", ceil.memcpy_ms, 2.0 * ceil.bytes, 0});
  results.push_back(
      {"copy_kernel_1GiB", "memcpy", 0, 0, 0, "uint4_x4", ceil.copy_ms, 2.0 * ceil.bytes, 0});
  results.push_back(
      {"read_kernel_2GiB", "memcpy", 0, 0, 0, "uint4_x4", ceil.read_ms, 2.0 * ceil.bytes, 0});
  results.push_back({"memcpy_d2d_1GiB", "memcpy", 0, 0, 0, "graph_node", ceil.memcpy_graph_ms,
                     2.0 * ceil.bytes, 0});

  const struct {
    const char* name;
    bool zero;
    KeyLayout layout;
  } variants[] = {{"lazy", false, KeyLayout::kRotatedLocal},
                  {"zero_deltas", true, KeyLayout::kRotatedLocal},
                  {"rotate_keys", false, KeyLayout::kUnrotated}};

  // Large prefill: a 2,048-token chunk of the request's own tokens (causal among themselves)
  // after 10,200 document tokens, b1 and b4, the launcher's kernel and mma.sync. FLOPs count
  // the visible (query, key) pairs only.
  const auto time_chunks = [&] {
    for (int batch : {1, 4}) {
      constexpr int kChunk = 2048;
      AttentionSetup s(batch, kChunk, prop.l2CacheSize, rng, true, /*own_len=*/kChunk,
                       /*max_splits=*/4);
      double pairs = 0;
      for (int i = 0; i < kChunk; ++i) pairs += kDocs * kDocLen + i + 1;
      const double flops = 4.0 * batch * kHeads * kHeadDim * pairs;
      for (PrefillKernel kernel : {g_default_prefill_kernel, PrefillKernel::kMmaSync}) {
        const double ms = TimeMedianMs(2, std::max(5, iters / 5), [&](int i, cudaStream_t st) {
          LazyAttentionParams p = s.Params(i % s.copies, false, KeyLayout::kRotatedLocal);
          p.prefill_kernel = kernel;
          BENCH_OK(LazyAttentionPrefill(p, st));
        });
        results.push_back({"prefill_q2048_b" + std::to_string(batch), "prefill", batch, kChunk,
                           s.kv_len, VariantName(kernel), ms, s.KvBytes(), flops});
      }
    }
  };
  if (chunks_only) {
    time_chunks();
    return Report(results, prop, copy_tbs, read_tbs, out_path);
  }

  // Decode.
  // --decode-b1: the small batches only (1-8, where the launcher splits the KV).
  for (int batch : decode_b1 ? std::vector<int>{1, 2, 4, 8} : std::vector<int>{1, 16, 64, 128}) {
    AttentionSetup s(batch, 1, prop.l2CacheSize, rng);
    for (const auto& var : variants) {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        BENCH_OK(LazyAttentionDecode(s.Params(i % s.copies, var.zero, var.layout), st));
      });
      const double flops = 4.0 * batch * kHeads * kHeadDim * double(s.kv_len);
      results.push_back({"decode_b" + std::to_string(batch), "decode", batch, 1, s.kv_len, var.name,
                         ms, s.KvBytes(), flops});
    }
    // The default with one parameter changed, as row `name`.
    const auto time_variant = [&](const std::string& name, auto&& change) {
      const double v_ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        LazyAttentionParams p = s.Params(i % s.copies, false, KeyLayout::kRotatedLocal);
        change(p);
        BENCH_OK(LazyAttentionDecode(p, st));
      });
      results.push_back({"decode_b" + std::to_string(batch), "decode", batch, 1, s.kv_len, name,
                         v_ms, s.KvBytes(), 4.0 * batch * kHeads * kHeadDim * double(s.kv_len)});
    };
    // Beside the default (per-warp pipelines with TMA copies): the warp pipes with cp.async
    // copies (the launcher's choice without num_pages, which the TMA maps need), and the
    // default with every K/V read after PdlWait (stable_history off).
    time_variant("lazy_cp_async", [](LazyAttentionParams& p) { p.num_pages = 0; });
    time_variant("lazy_wait_all", [](LazyAttentionParams& p) { p.stable_history = false; });
    // Batch 1 without the overlap between consecutive launches: an empty kernel launched
    // without the programmatic attribute before every call, so a launch starts only after the
    // previous one has finished (its time, ~0.8 us as diag_empty, is included).
    if (batch == 1) {
      for (bool stable : {true, false}) {
        const double iso_ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
          EmptyKernel<<<1, 32, 0, st>>>();
          LazyAttentionParams p = s.Params(i % s.copies, false, KeyLayout::kRotatedLocal);
          p.stable_history = stable;
          BENCH_OK(LazyAttentionDecode(p, st));
        });
        results.push_back({"decode_b1", "decode", 1, 1, s.kv_len,
                           stable ? "lazy_isolated" : "lazy_wait_all_isolated", iso_ms, s.KvBytes(),
                           4.0 * kHeads * kHeadDim * double(s.kv_len)});
      }
    }
    // --decode-b1: the split count forced around the launcher's choice (which fills the GPU
    // with two blocks per multiprocessor): fewer splits leave room for the next launch's
    // blocks beside the running ones, more give each block less to read.
    if (batch == 1 && decode_b1) {
      for (int splits : {8, 16, 24, 28, 40, 48}) {
        time_variant("lazy_splits" + std::to_string(splits),
                     [splits](LazyAttentionParams& p) { p.num_splits = splits; });
      }
    }
  }
  if (decode_b1) return Report(results, prop, copy_tbs, read_tbs, out_path);
  // 32-token query blocks: the launcher's choice for every variant (lazy and zero_deltas run
  // the wgmma kernel on sm_90a), then the mma.sync kernel forced (lazy_mma).
  {
    LazyAttentionParams probe;
    probe.shape.num_heads = kHeads;
    probe.shape.num_kv_heads = kKvHeads;
    probe.shape.head_dim = kHeadDim;
    probe.prefill_kernel = g_default_prefill_kernel;
    probe.view.page_size = kPageSize;
    probe.num_pages = 1;
    probe.k_cache = probe.v_cache = reinterpret_cast<const uint16_t*>(uintptr_t(256));
    std::printf("prefill kernel for variant lazy: %s\n",
                LazyAttentionPrefillUsesWs(probe)
                    ? "wgmma, warp-specialized (TMA; ping-pong when split)"
                : LazyAttentionPrefillUsesWgmma(probe) ? "wgmma"
                                                       : "mma.sync");
  }
  for (int batch : {1, 16}) {
    AttentionSetup s(batch, 32, prop.l2CacheSize, rng);
    const double flops = 4.0 * batch * 32 * kHeads * kHeadDim * double(s.kv_len);
    for (const auto& var : variants) {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        BENCH_OK(LazyAttentionPrefill(s.Params(i % s.copies, var.zero, var.layout), st));
      });
      results.push_back({"prefill_q32_b" + std::to_string(batch), "prefill", batch, 32, s.kv_len,
                         var.name, ms, s.KvBytes(), flops});
    }
    {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        LazyAttentionParams p = s.Params(i % s.copies, false, KeyLayout::kRotatedLocal);
        p.prefill_kernel = PrefillKernel::kMmaSync;
        BENCH_OK(LazyAttentionPrefill(p, st));
      });
      results.push_back({"prefill_q32_b" + std::to_string(batch), "prefill", batch, 32, s.kv_len,
                         VariantName(PrefillKernel::kMmaSync), ms, s.KvBytes(), flops});
    }
    // The engine's promise (LazyAttentionParams::stable_history): the warp-specialized kernel
    // copies its first tile before the wait.
    {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        LazyAttentionParams p = s.Params(i % s.copies, false, KeyLayout::kRotatedLocal);
        p.stable_history = true;
        BENCH_OK(LazyAttentionPrefill(p, st));
      });
      results.push_back({"prefill_q32_b" + std::to_string(batch), "prefill", batch, 32, s.kv_len,
                         "lazy_stable", ms, s.KvBytes(), flops});
    }
    // The query's own 32 keys (each request's last tile) computed at a wgmma width of 32
    // (LazyAttentionParams::narrow_tail_tiles).
    {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        LazyAttentionParams p = s.Params(i % s.copies, false, KeyLayout::kRotatedLocal);
        p.narrow_tail_tiles = true;
        BENCH_OK(LazyAttentionPrefill(p, st));
      });
      results.push_back({"prefill_q32_b" + std::to_string(batch), "prefill", batch, 32, s.kv_len,
                         "lazy_narrow_tail", ms, s.KvBytes(), flops});
    }
    // The launcher's kernel without the overlap between consecutive launches (an empty kernel
    // without the programmatic attribute before every call; its ~0.8 us included).
    {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        EmptyKernel<<<1, 32, 0, st>>>();
        BENCH_OK(LazyAttentionPrefill(s.Params(i % s.copies, false, KeyLayout::kRotatedLocal), st));
      });
      results.push_back({"prefill_q32_b" + std::to_string(batch), "prefill", batch, 32, s.kv_len,
                         "lazy_isolated", ms, s.KvBytes(), flops});
    }
    // The last document 128 keys shorter: 80 key tiles of 128 instead of 81, which 16 splits
    // share evenly (81 leave one split a sixth tile): what the uneven split costs.
    if (batch == 1) {
      AttentionSetup e(batch, 32, prop.l2CacheSize, rng, true, kOwnLen, kMaxKvSplits,
                       kDocLen - 128);
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        BENCH_OK(LazyAttentionPrefill(e.Params(i % e.copies, false, KeyLayout::kRotatedLocal), st));
      });
      results.push_back({"prefill_q32_b1", "prefill", batch, 32, e.kv_len, "lazy_80_tiles", ms,
                         e.KvBytes(), 4.0 * 32 * kHeads * kHeadDim * double(e.kv_len)});
    }
  }
  time_chunks();
  // Batch 1 against forced KV split counts (LAZY only): how the fixed costs move with the
  // number of blocks. "auto" rows above use the launcher's choice.
  {
    AttentionSetup d(1, 1, prop.l2CacheSize, rng);
    for (int splits : {8, 16, 24, 32, 48, 64, 96, 128}) {
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        LazyAttentionParams p = d.Params(i % d.copies, false, KeyLayout::kRotatedLocal);
        p.num_splits = splits;
        BENCH_OK(LazyAttentionDecode(p, st));
      });
      results.push_back({"decode_b1_splits", "decode", 1, 1, d.kv_len,
                         "lazy_s" + std::to_string(splits), ms, d.KvBytes(),
                         4.0 * kHeads * kHeadDim * double(d.kv_len)});
    }
    AttentionSetup q(1, 32, prop.l2CacheSize, rng);
    for (PrefillKernel kernel : {g_default_prefill_kernel, PrefillKernel::kMmaSync}) {
      for (int splits : {4, 8, 12, 16, 24, 32}) {
        const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
          LazyAttentionParams p = q.Params(i % q.copies, false, KeyLayout::kRotatedLocal);
          p.num_splits = splits;
          p.prefill_kernel = kernel;
          BENCH_OK(LazyAttentionPrefill(p, st));
        });
        results.push_back(
            {"prefill_q32_b1_splits", "prefill", 1, 32, q.kv_len,
             (kernel == PrefillKernel::kMmaSync ? "mma_s" : "lazy_s") + std::to_string(splits), ms,
             q.KvBytes(), 4.0 * 32 * kHeads * kHeadDim * double(q.kv_len)});
      }
    }
  }
  // Diagnostics for the batch-1 fixed costs, timed like the kernels (graphs of 20 calls):
  //  * read_42MB: the read kernel over 41.9 MB (decode b1's bytes, contiguous, rotating over
  //    6 buffers = 4x the L2), one launch per call: launch + ramp + tail of a trivial kernel;
  //  * read_42MB+empty: the same plus an empty kernel per call (the cost of a second node);
  //  * empty: one empty kernel per call;
  //  * gather_b1_sN_pP[_t256][_head_major]: decode b1's page gather without the math
  //    (GatherKernel), in the pool's layout and in a head-major page layout, 128 or 256
  //    threads per block;
  //  * merge_b1_sN: the split-merge kernel alone for decode b1 (32 heads, N splits).
  {
    const size_t bytes = 41943040, n16 = bytes / 16;
    constexpr int kBufs = 6;
    uint4* bufs = DeviceAlloc<uint4>(n16 * kBufs);
    FillRandom(reinterpret_cast<uint16_t*>(bufs), bytes / 2 * kBufs, 9);
    uint32_t* sink = DeviceAlloc<uint32_t>(1);
    for (int grid_per_sm : {2, 8}) {
      const int grid = prop.multiProcessorCount * grid_per_sm;
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        ReadKernel<<<grid, 256, 0, st>>>(bufs + (i % kBufs) * n16, n16, sink);
        BENCH_CUDA(cudaGetLastError());
      });
      results.push_back({"diag_read_42MB", "diag", 1, 0, 0,
                         "grid" + std::to_string(grid_per_sm) + "xSM", ms, double(bytes), 0});
    }
    {
      const int grid = prop.multiProcessorCount * 8;
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        ReadKernel<<<grid, 256, 0, st>>>(bufs + (i % kBufs) * n16, n16, sink);
        EmptyKernel<<<1, 32, 0, st>>>();
        BENCH_CUDA(cudaGetLastError());
      });
      results.push_back(
          {"diag_read_42MB+empty", "diag", 1, 0, 0, "grid8xSM", ms, double(bytes), 0});
    }
    const double empty_ms = TimeMedianMs(5, iters, [&](int, cudaStream_t st) {
      EmptyKernel<<<1, 32, 0, st>>>();
      BENCH_CUDA(cudaGetLastError());
    });
    results.push_back({"diag_empty", "diag", 0, 0, 0, "1x32", empty_ms, 0, 0});
    cudaFree(bufs);
    cudaFree(sink);

    {
      // Decode b1 with every request's pages in pool order (a document loaded into
      // consecutive free pages) instead of shuffled: the cost of scattered pages.
      AttentionSetup seq(1, 1, prop.l2CacheSize, rng, /*shuffle=*/false);
      const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
        BENCH_OK(
            LazyAttentionDecode(seq.Params(i % seq.copies, false, KeyLayout::kRotatedLocal), st));
      });
      results.push_back({"diag_decode_b1", "diag", 1, 1, seq.kv_len, "sequential_pages", ms,
                         seq.KvBytes(), 4.0 * kHeads * kHeadDim * double(seq.kv_len)});
    }
    AttentionSetup d(1, 1, prop.l2CacheSize, rng);
    {
      // gather_b1_sN_pP: GatherKernel over decode b1's pages (shuffled, as the decode rows),
      // N splits per KV head, P pages in flight per round.
      const int request_pages = d.num_pages / d.copies;
      uint32_t* gsink = DeviceAlloc<uint32_t>(1);
      struct GatherCase {
        int splits, pages, threads;
        bool head_major;
      };
      // 128 threads: 2 or 4 blocks per SM (33 or 66 splits); 256 threads, 132 splits: up to 8
      // blocks per SM as the contiguous read's grid8xSM (registers allowing: 2 pages per round
      // keep the loaded data at 16 registers).
      const GatherCase cases[] = {{33, 4, 128, false},  {33, 4, 128, true},  {33, 8, 128, false},
                                  {33, 8, 128, true},   {66, 4, 128, false}, {66, 4, 128, true},
                                  {66, 8, 128, false},  {66, 8, 128, true},  {132, 2, 256, false},
                                  {132, 4, 256, false}, {66, 8, 256, false}};
      for (const GatherCase& c : cases) {
        auto* kernel = c.threads == 256 ? (c.pages == 2   ? GatherKernel<2, false, 256>
                                           : c.pages == 4 ? GatherKernel<4, false, 256>
                                                          : GatherKernel<8, false, 256>)
                       : c.pages == 4
                           ? (c.head_major ? GatherKernel<4, true> : GatherKernel<4, false>)
                           : (c.head_major ? GatherKernel<8, true> : GatherKernel<8, false>);
        const double ms = TimeMedianMs(5, iters, [&](int i, cudaStream_t st) {
          const int32_t* ids = d.views[0][i % d.copies].page_indices;
          kernel<<<dim3(kKvHeads, c.splits), c.threads, 0, st>>>(
              reinterpret_cast<const uint4*>(d.k), reinterpret_cast<const uint4*>(d.v), ids,
              request_pages, kKvHeads, gsink);
          BENCH_CUDA(cudaGetLastError());
        });
        results.push_back({"diag_gather_b1", "diag", 1, 0, d.kv_len,
                           "s" + std::to_string(c.splits) + "_p" + std::to_string(c.pages) +
                               (c.threads == 256 ? "_t256" : "") +
                               (c.head_major ? "_head_major" : ""),
                           ms, d.KvBytes(), 0});
      }
      cudaFree(gsink);
    }
    for (int splits : {16, 33, 64}) {
      LazyAttentionParams p = d.Params(0, false, KeyLayout::kRotatedLocal);
      p.num_splits = splits;
      detail::AttentionKernelParams kp;
      BENCH_OK(detail::MakeKernelParams(p, kKvHeads, 2, 128, &kp));
      const double ms = TimeMedianMs(5, iters, [&](int, cudaStream_t st) {
        BENCH_OK(detail::LaunchMergeSplits(kp, 1, kHeadDim, st));
      });
      results.push_back({"diag_merge_b1", "diag", 1, 1, d.kv_len,
                         "s" + std::to_string(kp.num_splits), ms,
                         double(kp.num_splits) * kHeads * (kHeadDim + 1) * 4.0, 0});
    }
  }
  // MATERIALIZE: 5 documents of 2,048 tokens into a request's pages, 32 layers.
  {
    constexpr int kLayers = 32, kLen = 2048, kCopies = 5;
    const int pages_per_doc = kLen / kPageSize;
    const int pages = 2 * kCopies * pages_per_doc;  // sources, then destinations
    const int64_t layer_elems = int64_t(pages) * kPageSize * kKvHeads * kHeadDim;
    uint16_t* k = DeviceAlloc<uint16_t>(size_t(layer_elems) * kLayers);
    uint16_t* v = DeviceAlloc<uint16_t>(size_t(layer_elems) * kLayers);
    FillRandom(k, size_t(layer_elems) * kLayers, 4);
    FillRandom(v, size_t(layer_elems) * kLayers, 5);
    std::vector<int32_t> perm(pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int32_t> src_indptr{0}, src, len, off, delta;
    for (int c = 0; c < kCopies; ++c) {
      src.insert(src.end(), perm.begin() + c * pages_per_doc,
                 perm.begin() + (c + 1) * pages_per_doc);
      src_indptr.push_back(int32_t(src.size()));
      len.push_back(kLen);
      off.push_back(c * kLen);
      delta.push_back(c * kLen);
    }
    // Every copy addresses the request's whole destination run at its own token offset.
    const std::vector<int32_t> dst(perm.begin() + kCopies * pages_per_doc, perm.end());
    std::vector<int32_t> dst_all;
    std::vector<int32_t> dst_ptr{0};
    for (int c = 0; c < kCopies; ++c) {
      dst_all.insert(dst_all.end(), dst.begin(), dst.end());
      dst_ptr.push_back(int32_t(dst_all.size()));
    }
    std::vector<float> f(kHeadDim / 2);
    for (int i = 0; i < kHeadDim / 2; ++i) f[i] = float(std::pow(500000.0, -2.0 * i / kHeadDim));
    MaterializeParams m;
    m.k_cache = k;
    m.v_cache = v;
    m.layer_stride = layer_elems;
    m.num_layers = kLayers;
    m.page_size = kPageSize;
    m.num_kv_heads = kKvHeads;
    m.head_dim = kHeadDim;
    m.inv_freq = DeviceUpload(f);
    m.num_copies = kCopies;
    m.src_page_indptr = DeviceUpload(src_indptr);
    m.src_pages = DeviceUpload(src);
    m.dst_page_indptr = DeviceUpload(dst_ptr);
    m.dst_pages = DeviceUpload(dst_all);
    m.len = DeviceUpload(len);
    m.dst_offset = DeviceUpload(off);
    m.delta = DeviceUpload(delta);
    m.max_len = kLen;
    const double ms = TimeMedianMs(2, std::max(5, iters / 5),
                                   [&](int, cudaStream_t st) { BENCH_OK(Materialize(m, st)); });
    const double bytes = 2.0 * 2.0 * double(kCopies) * kLen * kLayers * kKvHeads * kHeadDim * 2;
    results.push_back(
        {"materialize_10240x32", "materialize", 1, 0, kCopies * kLen, "copy_rotate", ms, bytes, 0});
    cudaFree(k);
    cudaFree(v);
  }

  return Report(results, prop, copy_tbs, read_tbs, out_path);
}

}  // namespace
}  // namespace lazyrag::kernels

int main(int argc, char** argv) { return lazyrag::kernels::Main(argc, argv); }
