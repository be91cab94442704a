// Host-side helpers shared by the kernels_test sources (kernels_test.cc,
// lazy_attention_decode_test.cc, lazy_attention_prefill_test.cc, materialize_test.cc): bf16 on
// the host, device arrays, a paged KV pool with shuffled pages and NaN in every unused slot,
// RAG batches of documents at rope deltas, the CPU and GPU runs of one attention problem and the
// tolerance check. Test-only; include from gtest files only. The test files put their tests in
// this namespace (inside an anonymous one) so that they name the helpers unqualified.
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/attention/attention_cpu.h"
#include "worker/attention/segment_view.h"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::testing {

// ---------------------------------------------------------------------------------------
// bf16 on the host (round to nearest even; NaN kept).
uint16_t ToBf16(float f);
float FromBf16(uint16_t h);
std::vector<float> ToFloat(const std::vector<uint16_t>& x);
constexpr uint16_t kBf16NaN = 0x7fc0;

// True when a CUDA device is present.
bool HaveGpu();
// A fresh random seed (std::random_device) for a test's generator.
uint32_t FreshSeed();

#define SKIP_WITHOUT_GPU()                            \
  do {                                                \
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device"; \
  } while (0)

// Every GPU test starts with it: skip without a device, then a fresh random seed (printed
// with any failure) for the test's generator `rng`.
#define GPU_TEST_SETUP(rng)                  \
  SKIP_WITHOUT_GPU();                        \
  const uint32_t seed = FreshSeed();         \
  SCOPED_TRACE(absl::StrCat("seed ", seed)); \
  std::mt19937 rng(seed)

#define ASSERT_CUDA(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())

// Device copy of a host vector; freed on destruction.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(const std::vector<T>& host) { Upload(host); }
  explicit DeviceArray(size_t n, int fill_byte = 0xff) { Alloc(n, fill_byte); }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void Alloc(size_t n, int fill_byte) {
    cudaFree(ptr_);
    ptr_ = nullptr;
    n_ = n;
    if (n == 0) return;
    if (cudaMalloc(reinterpret_cast<void**>(&ptr_), n * sizeof(T)) != cudaSuccess) ptr_ = nullptr;
    if (ptr_ != nullptr) cudaMemset(ptr_, fill_byte, n * sizeof(T));
  }
  void Upload(const std::vector<T>& host) {
    Alloc(host.size(), 0);
    if (ptr_ != nullptr) {
      cudaMemcpy(ptr_, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    }
  }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    if (n_ > 0) cudaMemcpy(host.data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
  }
  T* get() const { return ptr_; }
  size_t size() const { return n_; }

 private:
  T* ptr_ = nullptr;
  size_t n_ = 0;
};

// Device form of a SegmentViewHost; the quality arrays (seg_skip, seg_scale, seg_bias) only
// where the host view has them for every segment, else null as the backends pass them.
struct DeviceView {
  explicit DeviceView(const SegmentViewHost& h)
      : q_indptr(h.q_indptr),
        q_pos(h.q_pos),
        seg_indptr(h.seg_indptr),
        seg_start(h.seg_start),
        seg_len(h.seg_len),
        page_indptr(h.page_indptr),
        page_indices(h.page_indices) {
    view = h.View();
    view.q_indptr = q_indptr.get();
    view.q_pos = q_pos.get();
    view.seg_indptr = seg_indptr.get();
    view.seg_start = seg_start.get();
    view.seg_len = seg_len.get();
    view.page_indptr = page_indptr.get();
    view.page_indices = page_indices.get();
    view.seg_skip = nullptr;
    view.seg_scale = nullptr;
    view.seg_bias = nullptr;
    if (h.any_quality()) {
      seg_skip.Upload(h.seg_skip);
      seg_scale.Upload(h.seg_scale);
      seg_bias.Upload(h.seg_bias);
      view.seg_skip = seg_skip.get();
      view.seg_scale = seg_scale.get();
      view.seg_bias = seg_bias.get();
    }
  }
  DeviceArray<int32_t> q_indptr, q_pos, seg_indptr, seg_start, seg_len, page_indptr, page_indices;
  DeviceArray<int32_t> seg_skip;
  DeviceArray<float> seg_scale, seg_bias;
  SegmentView view;
};

// ---------------------------------------------------------------------------------------
// A paged KV pool on the host: pages handed out in shuffled order, unused slots NaN.
struct KvPool {
  KvPool(int page_size, int num_kv_heads, int head_dim, int num_pages, std::mt19937& rng,
         int layers = 1)
      : ps(page_size),
        hkv(num_kv_heads),
        d(head_dim),
        pages(num_pages),
        layers(layers),
        k(size_t(layers) * num_pages * page_size * num_kv_heads * head_dim, kBf16NaN),
        v(k.size(), kBf16NaN) {
    free_list.resize(num_pages);
    std::iota(free_list.begin(), free_list.end(), 0);
    std::shuffle(free_list.begin(), free_list.end(), rng);
  }
  int64_t LayerElems() const { return int64_t(pages) * ps * hkv * d; }
  std::vector<int32_t> Alloc(int tokens) {
    const int n = (tokens + ps - 1) / ps;
    if (n > int(free_list.size())) {
      ADD_FAILURE() << "pool too small";
      return {};
    }
    std::vector<int32_t> out(free_list.end() - n, free_list.end());
    free_list.resize(free_list.size() - n);
    return out;
  }
  int64_t Offset(const std::vector<int32_t>& run, int j, int h, int layer = 0) const {
    return layer * LayerElems() + ((int64_t(run[j / ps]) * ps + j % ps) * hkv + h) * d;
  }
  void FillRandom(const std::vector<int32_t>& run, int len, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    for (int l = 0; l < layers; ++l) {
      for (int j = 0; j < len; ++j) {
        for (int h = 0; h < hkv; ++h) {
          const int64_t o = Offset(run, j, h, l);
          for (int e = 0; e < d; ++e) {
            k[o + e] = ToBf16(u(rng));
            v[o + e] = ToBf16(u(rng));
          }
        }
      }
    }
  }
  int ps, hkv, d, pages, layers;
  std::vector<uint16_t> k, v;
  std::vector<int32_t> free_list;
};

// RoPE inverse frequencies (base 500000) for `head_dim`: [head_dim / 2].
std::vector<float> InvFreq(int head_dim);

struct Doc {
  std::vector<int32_t> pages;
  int len = 0;
};

// One batch: shape, pool, view, queries.
struct Problem {
  AttentionShape shape;
  SegmentViewHost view;
  std::vector<uint16_t> q;  // [num_q, H, D]
  std::vector<float> inv_freq;
  int max_q_len = 1;
  int max_kv_len = 0;
};

struct Sizes {
  int head_dim = 128;
  int group = 4;
  int num_kv_heads = 2;
  int page_size = 16;
};

AttentionShape MakeShape(const Sizes& s);

// A problem with no requests yet: the shape, page size and RoPE frequencies of `s`.
Problem EmptyProblem(const Sizes& s);

// Appends one request: the given documents at consecutive logical positions, then the
// request's own segment (own_prefix earlier tokens + q_len new ones, whose keys are already
// in the pool as a prefill writes them before attending), queries at its last q_len
// positions.
void AddRequest(Problem& p, KvPool& pool, const std::vector<Doc>& docs,
                const std::vector<int>& doc_ids, int own_prefix, int q_len, std::mt19937& rng);

// `n` documents of min_len .. max_len random tokens, each in fresh pages of `pool`.
std::vector<Doc> MakeDocs(KvPool& pool, int n, int min_len, int max_len, std::mt19937& rng);

// A RAG batch: a shared library of documents, each request references a random subset in a
// random order (so the same pages sit at different rope deltas in different requests).
Problem MakeRagBatch(const Sizes& s, KvPool& pool, const std::vector<Doc>& docs, int num_requests,
                     int max_docs, int max_own_prefix, int q_len, std::mt19937& rng);

int PagesFor(int tokens, int page_size);

// Gives every other document segment of the problem (not the requests' own segments) a random
// score transform: keys skipped (0 .. 80, at most the segment's length, sometimes all of it),
// scale 0.5 .. 1.5 and bias -1 .. 1 (SegmentView's quality fields).
void AddRandomQuality(Problem& p, std::mt19937& rng);

// Head dim 128, 2 KV heads, the given page sizes x GQA groups 4 and 8: `body(s, pool, docs)`
// with a pool holding eight documents of 1 .. max_doc tokens and `extra_pages` pages more.
template <typename Body>
void ForPageSizesAndGroups(std::mt19937& rng, const std::vector<int>& page_sizes, int max_doc,
                           int extra_pages, Body&& body) {
  for (int ps : page_sizes) {
    for (int group : {4, 8}) {
      SCOPED_TRACE(absl::StrCat("ps=", ps, " group=", group));
      const Sizes s{/*head_dim=*/128, group, /*num_kv_heads=*/2, ps};
      KvPool pool(ps, s.num_kv_heads, s.head_dim, PagesFor(8 * max_doc, ps) + extra_pages, rng);
      const std::vector<Doc> docs = MakeDocs(pool, 8, 1, max_doc, rng);
      body(s, pool, docs);
    }
  }
}

// ---------------------------------------------------------------------------------------
// Runs and comparisons.

// The CPU reference (PagedAttentionCpu) on the problem's bf16 inputs; returns the output as
// floats.
std::vector<float> RunCpu(const Problem& p, const KvPool& pool, KeyLayout layout);

struct GpuRun {
  bool decode = false;
  KeyLayout layout = KeyLayout::kRotatedLocal;
  int num_splits = 0;
  // 0: LazyAttentionWorkspaceBytes for the problem's rows; otherwise this many bytes.
  size_t workspace_bytes = 0;
  // Calls on the same (not re-poisoned) workspace and output; the last output is returned.
  int repeats = 1;
  PrefillKernel prefill_kernel = PrefillKernel::kAuto;
  // false: LazyAttentionParams::num_pages 0 (unknown), which keeps the TMA kernels out: the
  // launchers then run the cp.async wgmma prefill and the cp.async decode warp pipes.
  bool num_pages_known = true;
  bool stable_history = false;
  // Rows left NaN in the uploaded pool and written by a kernel launched just before the
  // attention kernel, which lets the attention kernel start at once and writes only after
  // late_delay_ns (kernels_test_util.h): kStepRows, the keys at the queries' own positions
  // (what the model's QKV scatter writes in a step: stable_history allows this);
  // kFirstKeys, every request's first key (breaks stable_history's promise: a probe).
  enum class LateRows { kNone, kStepRows, kFirstKeys } late_rows = LateRows::kNone;
  int64_t late_delay_ns = 20000;
  // LazyAttentionParams::l2_prefetch over a device buffer of this many bytes (0: none).
  int64_t l2_prefetch_bytes = 0;
  bool l2_prefetch_at_start = false;  // LazyAttentionParams::l2_prefetch_at_start
  bool kv_evict_first = false;        // LazyAttentionParams::kv_evict_first
  bool narrow_tail_tiles = false;     // LazyAttentionParams::narrow_tail_tiles
};

// Element offsets (layer 0) of the rows GpuRun::late_rows names, for every KV head.
std::vector<int64_t> LateRowOffsets(const Problem& p, const KvPool& pool, GpuRun::LateRows which);

// Runs one kernel on device copies of the problem; returns the bf16 output as floats.
std::vector<float> RunGpu(const Problem& p, const KvPool& pool, const GpuRun& run);

// LazyAttentionParams' L2 hints leave `run`'s output bit-identical to the hint-free run's:
// kv_evict_first off and on, l2_prefetch asked after the last copy and at the start, over none,
// 1 MiB and 32 MiB + 48 bytes (more than 64 KiB a block, not a multiple of the blocks).
void ExpectL2HintsKeepTheOutput(const Problem& p, const KvPool& pool, GpuRun run,
                                const std::string& what);

// The probe behind the StableHistoryProbeEarlyReads tests: with stable_history's promise broken
// (every request's first key written late, GpuRun::LateRows::kFirstKeys), a request of
// query_len rows after four 1,000-1,500-token documents, 8 splits: expects NaN in the output with
// stable_history (the early copies read the late rows) and none without: a check on a GPU that
// the early copies happen. Timing-dependent (if the late writer finishes before the early copies
// it sees nothing), so it skips the calling test unless KERNELS_TEST_PROBE_EARLY_READS=1.
void ExpectEarlyCopiesSeeLateRows(bool decode, int query_len, std::mt19937& rng);

// |got - ref| <= atol + rtol |ref| everywhere (bf16 output, bf16 P and rotated q in the
// kernel vs an fp32/double reference), and a small mean error.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& ref,
                 const std::string& what, float atol = 8e-3f, float rtol = 2e-2f);

std::string LayoutName(KeyLayout l);

}  // namespace lazyrag::kernels::testing
