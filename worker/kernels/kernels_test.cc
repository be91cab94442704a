// Every CUDA kernel of worker/kernels against the CPU reference (attention_cpu.h) on fresh
// random bf16 inputs: document lengths that are not page multiples, page sizes 16 and 64 (and
// 24, a page size the decode's TMA copies do not take), shuffled page order, NaN in every unused
// pool slot, GQA groups 1/3/4/8, head dims 64/128, 1 to 256 requests, contexts up to 32k, forced
// and automatic KV splits, both key layouts. Outputs and workspaces are poisoned (NaN) before each
// run. Tests that need a GPU skip when there is none; the argument checks run everywhere.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/attention/attention_cpu.h"
#include "worker/attention/segment_view.h"
#include "worker/kernels/kernels_test_util.h"
#include "worker/kernels/lazy_attention.h"
#include "worker/kernels/materialize.h"

namespace lazyrag::kernels {
namespace {

// ---------------------------------------------------------------------------------------
// bf16 on the host (round to nearest even; NaN kept).
uint16_t ToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float FromBf16(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::vector<float> ToFloat(const std::vector<uint16_t>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = FromBf16(x[i]);
  return y;
}
constexpr uint16_t kBf16NaN = 0x7fc0;

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}
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

// Device form of a SegmentViewHost.
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
  }
  DeviceArray<int32_t> q_indptr, q_pos, seg_indptr, seg_start, seg_len, page_indptr, page_indices;
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

std::vector<float> InvFreq(int head_dim) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) f[i] = float(std::pow(500000.0, -2.0 * i / head_dim));
  return f;
}

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

AttentionShape MakeShape(const Sizes& s) {
  AttentionShape sh;
  sh.num_kv_heads = s.num_kv_heads;
  sh.num_heads = s.num_kv_heads * s.group;
  sh.head_dim = s.head_dim;
  sh.scale = 1.0f / std::sqrt(float(s.head_dim));
  return sh;
}

// A problem with no requests yet: the shape, page size and RoPE frequencies of `s`.
Problem EmptyProblem(const Sizes& s) {
  Problem p;
  p.shape = MakeShape(s);
  p.view.page_size = s.page_size;
  p.inv_freq = InvFreq(s.head_dim);
  return p;
}

// Appends one request: the given documents at consecutive logical positions, then the
// request's own segment (own_prefix earlier tokens + q_len new ones, whose keys are already
// in the pool as a prefill writes them before attending), queries at its last q_len
// positions.
void AddRequest(Problem& p, KvPool& pool, const std::vector<Doc>& docs,
                const std::vector<int>& doc_ids, int own_prefix, int q_len, std::mt19937& rng) {
  int start = 0;
  for (int id : doc_ids) {
    p.view.AddSegment(start, docs[id].len, docs[id].pages);
    start += docs[id].len;
  }
  const int own_len = own_prefix + q_len;
  std::vector<int32_t> own = pool.Alloc(own_len);
  pool.FillRandom(own, own_len, rng);
  p.view.AddSegment(start, own_len, own);
  std::vector<int32_t> pos(q_len);
  for (int i = 0; i < q_len; ++i) pos[i] = start + own_prefix + i;
  p.view.EndRequest(pos);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (size_t i = 0; i < size_t(q_len) * p.shape.num_heads * p.shape.head_dim; ++i) {
    p.q.push_back(ToBf16(u(rng)));
  }
  p.max_q_len = std::max(p.max_q_len, q_len);
  p.max_kv_len = std::max(p.max_kv_len, start + own_len);
}

std::vector<Doc> MakeDocs(KvPool& pool, int n, int min_len, int max_len, std::mt19937& rng) {
  std::uniform_int_distribution<int> len(min_len, max_len);
  std::vector<Doc> docs(n);
  for (Doc& d : docs) {
    d.len = len(rng);
    d.pages = pool.Alloc(d.len);
    pool.FillRandom(d.pages, d.len, rng);
  }
  return docs;
}

// A RAG batch: a shared library of documents, each request references a random subset in a
// random order (so the same pages sit at different rope deltas in different requests).
Problem MakeRagBatch(const Sizes& s, KvPool& pool, const std::vector<Doc>& docs, int num_requests,
                     int max_docs, int max_own_prefix, int q_len, std::mt19937& rng) {
  Problem p = EmptyProblem(s);
  std::uniform_int_distribution<int> ndocs(0, max_docs), own(0, max_own_prefix);
  for (int b = 0; b < num_requests; ++b) {
    std::vector<int> ids(docs.size());
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    ids.resize(std::min<int>(ndocs(rng), ids.size()));
    AddRequest(p, pool, docs, ids, own(rng), q_len, rng);
  }
  return p;
}

int PagesFor(int tokens, int page_size) { return (tokens + page_size - 1) / page_size; }

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

std::vector<float> RunCpu(const Problem& p, const KvPool& pool, KeyLayout layout) {
  const std::vector<float> q = ToFloat(p.q), k = ToFloat(pool.k), v = ToFloat(pool.v);
  std::vector<float> out(p.q.size(), std::nanf(""));
  PagedAttentionCpu(p.shape, p.view.View(), p.inv_freq.data(), q.data(), k.data(), v.data(),
                    out.data(), layout);
  return out;
}

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
};

// Element offsets (layer 0) of the rows GpuRun::late_rows names, for every KV head.
std::vector<int64_t> LateRowOffsets(const Problem& p, const KvPool& pool, GpuRun::LateRows which) {
  std::vector<int64_t> offsets;
  const SegmentViewHost& h = p.view;
  for (size_t r = 0; r + 1 < h.seg_indptr.size(); ++r) {
    const int seg =
        which == GpuRun::LateRows::kStepRows ? h.seg_indptr[r + 1] - 1 : h.seg_indptr[r];
    if (seg < h.seg_indptr[r]) continue;
    const std::vector<int32_t> run(h.page_indices.begin() + h.page_indptr[seg],
                                   h.page_indices.begin() + h.page_indptr[seg + 1]);
    std::vector<int> keys;
    if (which == GpuRun::LateRows::kStepRows) {
      for (int i = h.q_indptr[r]; i < h.q_indptr[r + 1]; ++i)
        keys.push_back(h.q_pos[i] - h.seg_start[seg]);
    } else {
      keys.push_back(0);
    }
    for (int j : keys) {
      for (int kvh = 0; kvh < pool.hkv; ++kvh) offsets.push_back(pool.Offset(run, j, kvh));
    }
  }
  return offsets;
}

// Runs one kernel on device copies of the problem; returns the bf16 output as floats.
std::vector<float> RunGpu(const Problem& p, const KvPool& pool, const GpuRun& run) {
  std::vector<int64_t> late;
  std::vector<uint16_t> k_host = pool.k, v_host = pool.v, k_late, v_late;
  if (run.late_rows != GpuRun::LateRows::kNone) {
    late = LateRowOffsets(p, pool, run.late_rows);
    for (int64_t o : late) {
      k_late.insert(k_late.end(), pool.k.begin() + o, pool.k.begin() + o + pool.d);
      v_late.insert(v_late.end(), pool.v.begin() + o, pool.v.begin() + o + pool.d);
      std::fill_n(k_host.begin() + o, pool.d, kBf16NaN);
      std::fill_n(v_host.begin() + o, pool.d, kBf16NaN);
    }
  }
  DeviceArray<uint16_t> q(p.q), k(k_host), v(v_host);
  DeviceArray<int64_t> late_offsets(late);
  DeviceArray<uint16_t> k_late_d(k_late), v_late_d(v_late);
  DeviceArray<float> inv_freq(p.inv_freq);
  DeviceView view(p.view);
  DeviceArray<uint16_t> out(p.q.size(), 0xff);  // NaN poison
  const size_t ws_bytes = run.workspace_bytes != 0
                              ? run.workspace_bytes
                              : LazyAttentionWorkspaceBytes(int(p.view.q_pos.size()),
                                                            p.shape.num_heads, p.shape.head_dim);
  DeviceArray<uint8_t> ws(ws_bytes, 0xff);
  LazyAttentionParams prm;
  prm.shape = p.shape;
  prm.key_layout = run.layout;
  prm.q = q.get();
  prm.k_cache = k.get();
  prm.v_cache = v.get();
  prm.out = out.get();
  prm.inv_freq = inv_freq.get();
  prm.view = view.view;
  prm.max_q_len = p.max_q_len;
  prm.max_kv_len = p.max_kv_len;
  prm.workspace = ws.get();
  prm.workspace_bytes = ws_bytes;
  prm.num_splits = run.num_splits;
  prm.prefill_kernel = run.prefill_kernel;
  prm.num_pages = run.num_pages_known ? pool.pages : 0;
  prm.stable_history = run.stable_history;
  if (!late.empty()) {
    EXPECT_TRUE(testing::LaunchDelayedRowWrite(k.get(), v.get(), late_offsets.get(), k_late_d.get(),
                                               v_late_d.get(), int(late.size()), pool.d,
                                               run.late_delay_ns, nullptr));
  }
  for (int i = 0; i < run.repeats; ++i) {
    const absl::Status st =
        run.decode ? LazyAttentionDecode(prm, nullptr) : LazyAttentionPrefill(prm, nullptr);
    EXPECT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
  return ToFloat(out.Download());
}

// |got - ref| <= atol + rtol |ref| everywhere (bf16 output, bf16 P and rotated q in the
// kernel vs an fp32/double reference), and a small mean error.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& ref,
                 const std::string& what, float atol = 8e-3f, float rtol = 2e-2f) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_excess = -1, sum_err = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(double(got[i]) - ref[i]);
    const double excess = std::isnan(err) ? 1e30 : err - (atol + rtol * std::fabs(ref[i]));
    if (!std::isnan(err)) sum_err += err;
    if (excess > 0) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  const double mean_err = got.empty() ? 0 : sum_err / got.size();
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size()
                     << " out of tolerance; worst at " << worst << " got " << got[worst] << " want "
                     << ref[worst];
  EXPECT_LT(mean_err, 2e-3) << what;
}

std::string LayoutName(KeyLayout l) {
  return l == KeyLayout::kRotatedLocal ? "rotated_local" : "unrotated";
}

uint32_t FreshSeed() {
  std::random_device rd;
  return rd();
}

// ---------------------------------------------------------------------------------------
// Argument checks: no device needed.

LazyAttentionParams ValidParams() {
  LazyAttentionParams p;
  p.shape.num_heads = 32;
  p.shape.num_kv_heads = 8;
  p.shape.head_dim = 128;
  p.shape.scale = 0.088f;
  return p;  // zero requests: a no-op
}

TEST(LazyAttentionArgs, RejectsBadShapes) {
  EXPECT_TRUE(ValidateLazyAttentionParams(ValidParams(), false).ok());
  EXPECT_TRUE(LazyAttentionPrefill(ValidParams(), nullptr).ok());  // empty batch, no launch
  auto code = [](LazyAttentionParams p, bool decode) {
    return (decode ? LazyAttentionDecode(p, nullptr) : LazyAttentionPrefill(p, nullptr)).code();
  };
  LazyAttentionParams p = ValidParams();
  p.shape.head_dim = 96;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.shape.num_kv_heads = 5;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.shape.num_heads = 64;
  p.shape.num_kv_heads = 2;  // group 32
  EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.view.page_size = 0;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.view.num_requests = 2;
  p.view.num_q = 3;  // decode needs one row per request
  EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.view.num_requests = 1;
  p.view.num_q = 1;  // null pointers
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.num_splits = -1;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  p = ValidParams();
  p.max_q_len = 0;
  EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument);
  // The kernels fold the scale into the softmax exponent after taking the row maximum of the
  // raw scores, which needs scale > 0.
  for (float scale : {0.f, -0.088f, std::nanf("")}) {
    p = ValidParams();
    p.shape.scale = scale;
    EXPECT_EQ(code(p, false), absl::StatusCode::kInvalidArgument) << scale;
    EXPECT_EQ(code(p, true), absl::StatusCode::kInvalidArgument) << scale;
  }
}

TEST(MaterializeArgs, RejectsBadShapes) {
  MaterializeParams m;
  m.head_dim = 80;
  m.num_kv_heads = 8;
  EXPECT_EQ(Materialize(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
  m.head_dim = 128;
  m.num_kv_heads = 0;
  EXPECT_EQ(Materialize(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
  m.num_kv_heads = 8;
  EXPECT_TRUE(Materialize(m, nullptr).ok());  // no copies: a no-op
  m.num_copies = 1;
  m.max_len = 10;  // null pointers
  EXPECT_EQ(Materialize(m, nullptr).code(), absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------
// Sweeps: head dim x group x page size x key layout.

using SweepParam = std::tuple<int, int, int, KeyLayout>;

class AttentionSweep : public ::testing::TestWithParam<SweepParam> {
 protected:
  Sizes GetSizes() const {
    Sizes s;
    s.head_dim = std::get<0>(GetParam());
    s.group = std::get<1>(GetParam());
    s.page_size = std::get<2>(GetParam());
    s.num_kv_heads = 2;
    return s;
  }
  KeyLayout Layout() const { return std::get<3>(GetParam()); }
};

TEST_P(AttentionSweep, DecodeMatchesCpu) {
  GPU_TEST_SETUP(rng);
  const Sizes s = GetSizes();
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(8 * 700, s.page_size) + 64 * 8,
              rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 700, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 5, 4, 40, 1, rng);
  const std::vector<float> ref = RunCpu(p, pool, Layout());
  for (int splits : {0, 1, 3, 16}) {
    ExpectClose(RunGpu(p, pool, {true, Layout(), splits}), ref,
                absl::StrCat("decode splits=", splits));
  }
}

TEST_P(AttentionSweep, PrefillQueryBlockMatchesCpu) {
  GPU_TEST_SETUP(rng);
  const Sizes s = GetSizes();
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(8 * 600, s.page_size) + 64 * 8,
              rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 600, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 3, 4, 50, 32, rng);
  const std::vector<float> ref = RunCpu(p, pool, Layout());
  for (int splits : {0, 1, 4}) {
    ExpectClose(RunGpu(p, pool, {false, Layout(), splits}), ref,
                absl::StrCat("prefill splits=", splits));
  }
  // Decode is prefill with one row: the last query row of each request as a decode batch.
  // (Covered by DecodeMatchesCpu on its own inputs.)
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, AttentionSweep,
    ::testing::Combine(::testing::Values(64, 128), ::testing::Values(1, 3, 4, 8),
                       ::testing::Values(16, 64),
                       ::testing::Values(KeyLayout::kRotatedLocal, KeyLayout::kUnrotated)),
    [](const ::testing::TestParamInfo<SweepParam>& info) {
      return absl::StrCat("d", std::get<0>(info.param), "_g", std::get<1>(info.param), "_ps",
                          std::get<2>(info.param), "_", LayoutName(std::get<3>(info.param)));
    });

// ---------------------------------------------------------------------------------------
// Large shapes.

TEST(LazyAttention, Decode256Requests) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.num_kv_heads = 8;
  s.group = 4;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(20 * 400, 16) + 256 * 4, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 20, 1, 400, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 256, 3, 40, 1, rng);
  const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
  ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, 0}), ref, "decode 256");
  ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, 2}), ref, "decode 256 split 2");
}

TEST(LazyAttention, Long32kContext) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.num_kv_heads = 1;
  s.group = 8;
  s.page_size = 64;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(16 * 2048, 64) + 64, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 16, 1900, 2040, rng);  // ~31.5k tokens
  Problem dec = EmptyProblem(s);
  std::vector<int> all(16);
  std::iota(all.begin(), all.end(), 0);
  Problem pre = dec;
  AddRequest(dec, pool, docs, all, 20, 1, rng);
  std::reverse(all.begin(), all.end());
  AddRequest(dec, pool, docs, all, 0, 1, rng);
  AddRequest(pre, pool, docs, all, 10, 32, rng);
  for (KeyLayout layout : {KeyLayout::kRotatedLocal, KeyLayout::kUnrotated}) {
    ExpectClose(RunGpu(dec, pool, {true, layout, 0}), RunCpu(dec, pool, layout),
                "decode 32k " + LayoutName(layout));
    ExpectClose(RunGpu(pre, pool, {false, layout, 0}), RunCpu(pre, pool, layout),
                "prefill 32k " + LayoutName(layout));
  }
}

TEST(LazyAttention, PrefillBatch16QueryBlocks) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.num_kv_heads = 2;
  s.group = 4;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(10 * 1000, 16) + 16 * 8, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 10, 500, 1000, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 16, 3, 30, 32, rng);
  ExpectClose(RunGpu(p, pool, {false, KeyLayout::kRotatedLocal, 0}),
              RunCpu(p, pool, KeyLayout::kRotatedLocal), "prefill batch 16");
}

// The benchmark's shape at batch 1 (Llama-3-8B attention: 8 KV heads, groups of
// 4, 5 documents of ~2k tokens, odd lengths), automatic splits: a 32-token
// query block (128 packed rows per block, split over the KV) and decode (split,
// merged by the last split block), both head dims, page sizes 16 and 64; plus
// group 8 and a 64-token block (two query blocks).
TEST(LazyAttention, Batch1LongContextAutoSplits) {
  GPU_TEST_SETUP(rng);
  for (int d : {64, 128}) {
    for (int ps : {16, 64}) {
      for (int group : {4, 8}) {
        SCOPED_TRACE(absl::StrCat("d=", d, " ps=", ps, " group=", group));
        Sizes s;
        s.head_dim = d;
        s.group = group;
        s.page_size = ps;
        s.num_kv_heads = 8;
        KvPool pool(ps, s.num_kv_heads, d, PagesFor(5 * 2047, ps) + 5 + 2 * PagesFor(200, ps), rng);
        const std::vector<Doc> docs = MakeDocs(pool, 5, 1990, 2047, rng);
        Problem pre = EmptyProblem(s);
        Problem dec = pre;
        AddRequest(pre, pool, docs, {3, 0, 4, 1, 2}, 9, group == 4 ? 32 : 64, rng);
        AddRequest(dec, pool, docs, {1, 4, 2, 0, 3}, 41, 1, rng);
        for (KeyLayout layout : {KeyLayout::kRotatedLocal, KeyLayout::kUnrotated}) {
          if (layout == KeyLayout::kUnrotated && (ps != 16 || group != 4)) continue;
          ExpectClose(RunGpu(pre, pool, {false, layout, 0}), RunCpu(pre, pool, layout),
                      "prefill " + LayoutName(layout));
          ExpectClose(RunGpu(dec, pool, {true, layout, 0}), RunCpu(dec, pool, layout),
                      "decode " + LayoutName(layout));
        }
      }
    }
  }
}

// The decode warp pipes (head dim 128, LAZY layout: each warp loads its own 16 keys of every
// tile, no block barrier in the loop) with TMA copies (the launcher's choice where page_size is
// a power of two >= 16 and num_pages is known) and with cp.async copies (num_pages unknown, or
// page size 24) against the CPU and, at one shape, bit for bit against each other (the same
// arithmetic in the same order; the TMA slices past a segment's end hold the pool's NaN and must
// be masked and zeroed): batch 1 over 5 long documents and a batch of 5 requests, groups 4 and
// 8, automatic and forced splits.
TEST(LazyAttention, DecodeTmaPipesMatchCpAsyncPipes) {
  GPU_TEST_SETUP(rng);
  ForPageSizesAndGroups(
      rng, {16, 64, 24}, 1500, 40 * 8,
      [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
        Problem b1 = EmptyProblem(s);
        AddRequest(b1, pool, docs, {5, 2, 7, 0, 3}, 41, 1, rng);
        const Problem b5 = MakeRagBatch(s, pool, docs, 5, 4, 40, 1, rng);
        const std::pair<const char*, const Problem*> problems[] = {{"b1", &b1}, {"b5", &b5}};
        for (const auto& [name, prob] : problems) {
          const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
          for (int splits : {0, 1, 3, 16}) {
            const std::string what = absl::StrCat(name, " splits=", splits);
            GpuRun run{true, KeyLayout::kRotatedLocal, splits};
            const std::vector<float> tma = RunGpu(*prob, pool, run);
            run.num_pages_known = false;
            const std::vector<float> cp_async = RunGpu(*prob, pool, run);
            ExpectClose(tma, ref, "warp pipes, num_pages known " + what);
            ExpectClose(cp_async, ref, "cp.async warp pipes " + what);
            EXPECT_EQ(tma, cp_async) << "TMA vs cp.async warp pipes " << what;
          }
        }
      });
}

// The batch-1 split merge's blocks must fit beside two decode blocks on a multiprocessor, so
// that they are resident and waiting before the decode grid ends (each chained launch measured
// slower on the H200 when they were not; see bench/README.md): a guard against the decode
// kernel growing its registers or shared memory past the room it leaves.
TEST(LazyAttention, DecodeLeavesRoomForTheSplitMerge) {
  SKIP_WITHOUT_GPU();
  bool fits = false;
  std::string report;
  const absl::Status st = DecodeSplitMergeResidency(&fits, &report);
  ASSERT_TRUE(st.ok()) << st;
  EXPECT_TRUE(fits) << report;
  std::printf("%s\n", report.c_str());
}

// stable_history: the decode kernel copies its first K/V tiles before waiting for the kernel
// launched just before it, except those holding the query's own key. Here that kernel writes
// the queries' own K/V rows (NaN until then) GpuRun::late_delay_ns after letting the decode
// start, as the model's QKV scatter does: the output must still match the CPU on the written
// rows, for the launcher's split and forced ones (the split holding the query's row waits, the
// others start early), with the TMA and with the cp.async warp pipes.
TEST(LazyAttention, DecodeStableHistoryWaitsForTheStepsRows) {
  GPU_TEST_SETUP(rng);
  for (int ps : {16, 64}) {
    SCOPED_TRACE(absl::StrCat("ps=", ps));
    const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, ps};
    KvPool pool(ps, s.num_kv_heads, s.head_dim, PagesFor(6 * 1500, ps) + 40 * 6, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 6, 1, 1500, rng);
    Problem b1 = EmptyProblem(s);
    AddRequest(b1, pool, docs, {4, 1, 5, 0}, 37, 1, rng);
    const Problem b6 = MakeRagBatch(s, pool, docs, 6, 4, 40, 1, rng);
    const std::pair<const char*, const Problem*> problems[] = {{"b1", &b1}, {"b6", &b6}};
    for (const auto& [name, prob] : problems) {
      const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
      for (int splits : {0, 1, 7, 40}) {
        // These pages run the TMA pipes with num_pages known, the cp.async ones without.
        for (bool num_pages_known : {true, false}) {
          GpuRun run{true, KeyLayout::kRotatedLocal, splits};
          run.stable_history = true;
          run.late_rows = GpuRun::LateRows::kStepRows;
          run.num_pages_known = num_pages_known;
          ExpectClose(RunGpu(*prob, pool, run), ref,
                      absl::StrCat(name, " splits=", splits, " cp.async=", !num_pages_known));
        }
      }
    }
  }
}

// The probe that the test above can fail: with the promise broken (every request's FIRST key
// written late), the early copies read the NaN rows. Timing-dependent, so only on request
// (KERNELS_TEST_PROBE_EARLY_READS=1), to check on a GPU that the early copies happen.
TEST(LazyAttention, DecodeStableHistoryProbeEarlyReads) {
  GPU_TEST_SETUP(rng);
  if (std::getenv("KERNELS_TEST_PROBE_EARLY_READS") == nullptr) {
    GTEST_SKIP() << "set KERNELS_TEST_PROBE_EARLY_READS=1 to run";
  }
  const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, 16};
  KvPool pool(16, s.num_kv_heads, s.head_dim, PagesFor(4 * 1500, 16) + 40, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 4, 1000, 1500, rng);
  Problem b1 = EmptyProblem(s);
  AddRequest(b1, pool, docs, {2, 0, 3, 1}, 37, 1, rng);
  for (bool stable : {true, false}) {
    GpuRun run{true, KeyLayout::kRotatedLocal, 8};
    run.stable_history = stable;
    run.late_rows = GpuRun::LateRows::kFirstKeys;
    const std::vector<float> out = RunGpu(b1, pool, run);
    const size_t nans =
        std::count_if(out.begin(), out.end(), [](float x) { return std::isnan(x); });
    if (stable) {
      EXPECT_GT(nans, 0u) << "early copies did not see the late rows";
    } else {
      EXPECT_EQ(nans, 0u) << "without stable_history every read waits";
    }
  }
}

// Decode split merge against the workspace size: room for all forced splits,
// for 2, for 3 (the launcher clamps the split count to what fits), on a
// workspace that is poisoned once and then reused as the previous call left it.
TEST(LazyAttention, DecodeSplitMergeWorkspace) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.group = 4;
  s.num_kv_heads = 4;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, PagesFor(6 * 900, 16) + 40 * 4, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 6, 300, 900, rng);
  const Problem p = MakeRagBatch(s, pool, docs, 37, 4, 40, 1, rng);
  const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
  const size_t per_split = LazyAttentionWorkspaceBytes(37, s.num_kv_heads * s.group, s.head_dim, 1);
  for (int repeats : {1, 3}) {
    for (int splits : {2, 7, 64}) {
      const std::string what = absl::StrCat("splits=", splits, " repeats=", repeats);
      ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, splits, 0, repeats}), ref,
                  "all splits " + what);
      ExpectClose(
          RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, splits, 2 * per_split + 100, repeats}),
          ref, "2 splits " + what);
      ExpectClose(RunGpu(p, pool, {true, KeyLayout::kRotatedLocal, splits, 3 * per_split, repeats}),
                  ref, "3 splits " + what);
    }
  }
}

// Requests with many segments (more than the 32 whose metadata a block caches in shared
// memory, and more than one 32-lane planning round), some of them empty or a single key,
// against forced split counts: splits that start past the cache, splits with no tiles, tile
// ranges that straddle many segment boundaries.
TEST(LazyAttention, ManySegments) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.group = 4;
  s.page_size = 16;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 70 * 6 + 6 * 4 + 16, rng);
  std::vector<Doc> docs = MakeDocs(pool, 70, 1, 90, rng);
  docs[3].len = 0;  // empty segments (no pages needed)
  docs[40].len = 0;
  std::vector<int> order(docs.size());
  std::iota(order.begin(), order.end(), 0);
  std::vector<int> rev(order.rbegin(), order.rend());
  std::vector<int> few(order.begin(), order.begin() + 5);
  for (int q_len : {1, 32}) {
    Problem p = EmptyProblem(s);
    AddRequest(p, pool, docs, order, 30, q_len, rng);  // 71 segments
    AddRequest(p, pool, docs, few, 3, q_len, rng);
    AddRequest(p, pool, docs, rev, 0, q_len, rng);
    const std::vector<float> ref = RunCpu(p, pool, KeyLayout::kRotatedLocal);
    for (int splits : {0, 1, 5, 37, 128}) {
      ExpectClose(RunGpu(p, pool, {q_len == 1, KeyLayout::kRotatedLocal, splits}), ref,
                  absl::StrCat(q_len == 1 ? "decode" : "prefill", " splits=", splits));
    }
  }
}

// Chunked causal prefill of a request's own tokens (the second chunk of 100 after 200
// earlier tokens) batched with a query block over documents: uneven rows per request.
TEST(LazyAttention, ChunkedCausalPrefill) {
  GPU_TEST_SETUP(rng);
  for (int group : {3, 4}) {
    Sizes s;
    s.group = group;
    s.page_size = 16;
    KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 200, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 3, 100, 500, rng);
    Problem p = EmptyProblem(s);
    AddRequest(p, pool, docs, {}, 200, 100, rng);
    AddRequest(p, pool, docs, {2, 0, 1}, 7, 37, rng);
    for (KeyLayout layout : {KeyLayout::kRotatedLocal, KeyLayout::kUnrotated}) {
      ExpectClose(RunGpu(p, pool, {false, layout, 0}), RunCpu(p, pool, layout),
                  absl::StrCat("chunked g=", group, " ", LayoutName(layout)));
    }
  }
}

// FULL-mode document encoding: one segment from position 0, every token a query row.
TEST(LazyAttention, FullCausalDocumentEncoding) {
  GPU_TEST_SETUP(rng);
  for (int d : {64, 128}) {
    Sizes s;
    s.head_dim = d;
    s.group = 3;
    s.page_size = 64;
    KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 20, rng);
    Problem p = EmptyProblem(s);
    AddRequest(p, pool, {}, {}, 0, 777, rng);
    ExpectClose(RunGpu(p, pool, {false, KeyLayout::kRotatedLocal, 0}),
                RunCpu(p, pool, KeyLayout::kRotatedLocal), absl::StrCat("full d=", d));
  }
}

// ---------------------------------------------------------------------------------------
// The wgmma prefill kernels (head dim 128, LAZY) as the launcher chooses them, and the mma.sync
// kernel forced (PrefillKernel::kMmaSync) on the same inputs, each against the CPU reference
// and against each other. With num_pages known the launcher runs the warp-specialized kernel
// (TMA producer; its consumer warpgroups ping-pong when the KV is split), without it the
// all-warps cp.async kernel (64-key tiles when the KV is split, 128-key tiles otherwise); with
// one split both do the same arithmetic on the same 128-key tiles: bit for bit. Inputs: a
// batch-1 query block over odd-length documents, a batch of 16 query blocks, and chunked causal
// prefill of the requests' own tokens (several query blocks per request, uneven rows), page
// sizes 16 and 64, groups 4 and 8, automatic and forced splits.
TEST(LazyAttention, PrefillWgmmaMatchesCpuAndMmaSync) {
  GPU_TEST_SETUP(rng);
  // KERNELS_TEST_WS_ONLY=1: only the warp-specialized kernel against the CPU, both schedules
  // (a short run for compute-sanitizer's racecheck).
  const char* ws_env = std::getenv("KERNELS_TEST_WS_ONLY");
  const bool ws_only = ws_env != nullptr && std::string(ws_env) == "1";
  int major = 0, minor = 0;
  ASSERT_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  ASSERT_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0));
  ForPageSizesAndGroups(
      rng, {16, 64}, 1200, 40 * 16,
      [&](const Sizes& s, KvPool& pool, const std::vector<Doc>& docs) {
        Problem b1 = EmptyProblem(s);
        Problem causal = b1;
        AddRequest(b1, pool, docs, {5, 2, 7, 0, 3}, 9, 32, rng);
        AddRequest(causal, pool, docs, {}, 200, 100, rng);
        AddRequest(causal, pool, docs, {1, 6}, 7, 37, rng);
        const Problem b16 = MakeRagBatch(s, pool, docs, 16, 3, 40, 32, rng);
        LazyAttentionParams probe;
        probe.shape = b1.shape;
        const bool wgmma = LazyAttentionPrefillUsesWgmma(probe);
        probe.num_pages = pool.pages;
        probe.view.page_size = s.page_size;
        probe.k_cache = probe.v_cache = reinterpret_cast<const uint16_t*>(uintptr_t(256));
        EXPECT_EQ(LazyAttentionPrefillUsesWs(probe), wgmma) << "ps " << s.page_size;
        probe.num_pages = 0;
        EXPECT_FALSE(LazyAttentionPrefillUsesWs(probe)) << "num_pages 0";
        if (major == 9 && minor == 0) {
          EXPECT_TRUE(wgmma) << "compute capability 9.0 device but no wgmma kernel";
        }
        if (!wgmma) std::printf("note: wgmma prefill kernels unavailable; mma.sync throughout\n");
        const std::pair<const char*, const Problem*> problems[] = {
            {"b1", &b1}, {"b16", &b16}, {"causal", &causal}};
        for (const auto& [name, prob] : problems) {
          const std::vector<float> ref = RunCpu(*prob, pool, KeyLayout::kRotatedLocal);
          for (int splits : {0, 1, 3}) {
            const std::string what = absl::StrCat(name, " splits=", splits);
            GpuRun run{false, KeyLayout::kRotatedLocal, splits};
            const std::vector<float> ws = RunGpu(*prob, pool, run);
            ExpectClose(ws, ref, "warp-specialized " + what);
            if (ws_only) continue;  // the warp-specialized kernel alone (racecheck, ~4x faster)
            run.num_pages_known = false;
            const std::vector<float> cp_async = RunGpu(*prob, pool, run);
            ExpectClose(cp_async, ref, "cp.async wgmma " + what);
            if (wgmma && splits == 1) {
              EXPECT_EQ(ws, cp_async) << "warp-specialized vs cp.async 128-key tiles " << what;
            }
            run.num_pages_known = true;
            run.prefill_kernel = PrefillKernel::kMmaSync;
            const std::vector<float> old = RunGpu(*prob, pool, run);
            ExpectClose(old, ref, "mma.sync " + what);
            ExpectClose(ws, old, "warp-specialized vs mma.sync " + what, 2e-3f, 1e-2f);
            ExpectClose(cp_async, old, "cp.async wgmma vs mma.sync " + what, 2e-3f, 1e-2f);
          }
        }
      });
}

// ---------------------------------------------------------------------------------------
// LAZY with all deltas zero (every segment at logical 0) equals attention over the same
// keys concatenated into one contiguous segment, when the query sees every key.
TEST(LazyAttention, ZeroDeltasMatchContiguous) {
  GPU_TEST_SETUP(rng);
  Sizes s;
  s.page_size = 16;
  KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 400, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 4, 100, 700, rng);
  Problem lazy = EmptyProblem(s), contiguous = EmptyProblem(s);
  int total = 0;
  for (const Doc& d : docs) {
    lazy.view.AddSegment(0, d.len, d.pages);
    total += d.len;
  }
  std::vector<int32_t> run = pool.Alloc(total);
  int t = 0;
  for (const Doc& d : docs) {
    for (int j = 0; j < d.len; ++j, ++t) {
      for (int h = 0; h < s.num_kv_heads; ++h) {
        std::copy_n(pool.k.begin() + pool.Offset(d.pages, j, h), s.head_dim,
                    pool.k.begin() + pool.Offset(run, t, h));
        std::copy_n(pool.v.begin() + pool.Offset(d.pages, j, h), s.head_dim,
                    pool.v.begin() + pool.Offset(run, t, h));
      }
    }
  }
  contiguous.view.AddSegment(0, total, run);
  std::vector<int32_t> pos(8);
  for (int i = 0; i < 8; ++i) pos[i] = total + 5 * i;  // sees every key in both views
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (Problem* p : {&lazy, &contiguous}) {
    p->view.EndRequest(pos);
    p->max_q_len = 8;
    p->max_kv_len = total;
  }
  for (size_t i = 0; i < 8u * lazy.shape.num_heads * s.head_dim; ++i)
    lazy.q.push_back(ToBf16(u(rng)));
  contiguous.q = lazy.q;
  const std::vector<float> a = RunGpu(lazy, pool, {false, KeyLayout::kRotatedLocal, 0});
  const std::vector<float> b = RunGpu(contiguous, pool, {false, KeyLayout::kRotatedLocal, 0});
  ExpectClose(a, b, "zero deltas vs contiguous", 2e-3f, 1e-2f);
  ExpectClose(a, RunCpu(lazy, pool, KeyLayout::kRotatedLocal), "zero deltas vs cpu");
}

// ---------------------------------------------------------------------------------------
// MATERIALIZE.

struct DeviceCopies {
  std::vector<int32_t> src_indptr{0}, src_pages, dst_indptr{0}, dst_pages, len, dst_offset, delta;
  void Add(const MaterializeCopy& c) {
    src_pages.insert(src_pages.end(), c.src_pages.begin(), c.src_pages.end());
    src_indptr.push_back(int32_t(src_pages.size()));
    dst_pages.insert(dst_pages.end(), c.dst_pages.begin(), c.dst_pages.end());
    dst_indptr.push_back(int32_t(dst_pages.size()));
    len.push_back(c.len);
    dst_offset.push_back(c.dst_offset);
    delta.push_back(c.delta);
  }
};

// Runs the materialize kernel over all layers of the pool, in place on pool.k / pool.v.
void RunMaterializeGpu(KvPool& pool, const std::vector<float>& inv_freq,
                       const std::vector<MaterializeCopy>& copies) {
  DeviceCopies c;
  int max_len = 0;
  for (const MaterializeCopy& m : copies) {
    c.Add(m);
    max_len = std::max(max_len, m.len);
  }
  DeviceArray<uint16_t> k(pool.k), v(pool.v);
  DeviceArray<float> f(inv_freq);
  DeviceArray<int32_t> si(c.src_indptr), sp(c.src_pages), di(c.dst_indptr), dp(c.dst_pages),
      len(c.len), off(c.dst_offset), delta(c.delta);
  MaterializeParams m;
  m.k_cache = k.get();
  m.v_cache = v.get();
  m.layer_stride = pool.LayerElems();
  m.num_layers = pool.layers;
  m.page_size = pool.ps;
  m.num_kv_heads = pool.hkv;
  m.head_dim = pool.d;
  m.inv_freq = f.get();
  m.num_copies = int(copies.size());
  m.src_page_indptr = si.get();
  m.src_pages = sp.get();
  m.dst_page_indptr = di.get();
  m.dst_pages = dp.get();
  m.len = len.get();
  m.dst_offset = off.get();
  m.delta = delta.get();
  m.max_len = max_len;
  const absl::Status st = Materialize(m, nullptr);
  EXPECT_TRUE(st.ok()) << st;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  pool.k = k.Download();
  pool.v = v.Download();
}

TEST(Materialize, MatchesCpu) {
  GPU_TEST_SETUP(rng);
  for (int d : {64, 128}) {
    for (int ps : {16, 64}) {
      KvPool pool(ps, 4, d, PagesFor(10000, ps) + 16, rng, /*layers=*/2);
      const std::vector<Doc> docs = MakeDocs(pool, 3, 50, 1500, rng);
      int total = 0;
      for (const Doc& doc : docs) total += doc.len;
      const int offset = 13;  // request prefix before the documents
      std::vector<int32_t> run = pool.Alloc(offset + total);
      std::vector<MaterializeCopy> copies;
      int start = offset;
      for (const Doc& doc : docs) {
        copies.push_back({doc.pages, doc.len, run, start, start});
        start += doc.len;
      }
      copies[1].delta = 0;  // a plain copy too
      std::vector<float> k = ToFloat(pool.k), v = ToFloat(pool.v);
      const std::vector<float> inv_freq = InvFreq(d);
      for (int l = 0; l < pool.layers; ++l) {
        MaterializeCpu(copies, ps, pool.hkv, d, inv_freq.data(), k.data() + l * pool.LayerElems(),
                       v.data() + l * pool.LayerElems());
      }
      RunMaterializeGpu(pool, inv_freq, copies);
      // Unused slots stay NaN in both; values must agree to bf16 rounding.
      std::vector<float> gk = ToFloat(pool.k), gv = ToFloat(pool.v);
      size_t bad = 0;
      for (size_t i = 0; i < k.size(); ++i) {
        auto same = [](float a, float b, float tol) {
          return (std::isnan(a) && std::isnan(b)) || std::fabs(a - b) <= tol;
        };
        if (!same(gk[i], k[i], 1e-3f + 8e-3f * std::fabs(k[i]))) ++bad;
        if (!same(gv[i], v[i], 0.f)) ++bad;
      }
      EXPECT_EQ(bad, 0u) << "d=" << d << " ps=" << ps;
    }
  }
}

// MATERIALIZE then plain attention (one segment from 0, no deltas) == LAZY attention.
TEST(Materialize, ThenAttentionMatchesLazy) {
  GPU_TEST_SETUP(rng);
  for (bool decode : {false, true}) {
    Sizes s;
    s.page_size = 16;
    s.group = 4;
    KvPool pool(s.page_size, s.num_kv_heads, s.head_dim, 1500, rng);
    const std::vector<Doc> docs = MakeDocs(pool, 5, 100, 900, rng);
    const Problem lazy = MakeRagBatch(s, pool, docs, 3, 5, 20, decode ? 1 : 32, rng);
    // Materialized view: each request's segments copied into one fresh run, rotated by
    // their deltas; one segment from 0 of the same total length, same query positions.
    Problem mat = lazy;
    mat.view = SegmentViewHost();
    mat.view.page_size = s.page_size;
    std::vector<MaterializeCopy> copies;
    for (int b = 0; b < lazy.view.num_requests(); ++b) {
      int total = 0;
      for (int sg = lazy.view.seg_indptr[b]; sg < lazy.view.seg_indptr[b + 1]; ++sg) {
        total += lazy.view.seg_len[sg];
      }
      std::vector<int32_t> run = pool.Alloc(total);
      for (int sg = lazy.view.seg_indptr[b]; sg < lazy.view.seg_indptr[b + 1]; ++sg) {
        std::vector<int32_t> src(lazy.view.page_indices.begin() + lazy.view.page_indptr[sg],
                                 lazy.view.page_indices.begin() + lazy.view.page_indptr[sg + 1]);
        copies.push_back(
            {src, lazy.view.seg_len[sg], run, lazy.view.seg_start[sg], lazy.view.seg_start[sg]});
      }
      mat.view.AddSegment(0, total, run);
      mat.view.EndRequest(
          std::vector<int32_t>(lazy.view.q_pos.begin() + lazy.view.q_indptr[b],
                               lazy.view.q_pos.begin() + lazy.view.q_indptr[b + 1]));
    }
    const std::vector<float> lazy_out = RunGpu(lazy, pool, {decode, KeyLayout::kRotatedLocal, 0});
    RunMaterializeGpu(pool, lazy.inv_freq, copies);
    const std::vector<float> mat_out = RunGpu(mat, pool, {decode, KeyLayout::kRotatedLocal, 0});
    ExpectClose(mat_out, lazy_out, decode ? "materialize vs lazy decode" : "materialize vs lazy");
    ExpectClose(lazy_out, RunCpu(lazy, pool, KeyLayout::kRotatedLocal), "lazy vs cpu");
  }
}

}  // namespace
}  // namespace lazyrag::kernels
