// Definitions of the helpers kernels_test_support.h declares.
#include "worker/kernels/kernels_test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "worker/kernels/kernels_test_util.h"

namespace lazyrag::kernels::testing {

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

bool HaveGpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

uint32_t FreshSeed() {
  std::random_device rd;
  return rd();
}

std::vector<float> InvFreq(int head_dim) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) f[i] = float(std::pow(500000.0, -2.0 * i / head_dim));
  return f;
}

AttentionShape MakeShape(const Sizes& s) {
  AttentionShape sh;
  sh.num_kv_heads = s.num_kv_heads;
  sh.num_heads = s.num_kv_heads * s.group;
  sh.head_dim = s.head_dim;
  sh.scale = 1.0f / std::sqrt(float(s.head_dim));
  return sh;
}

Problem EmptyProblem(const Sizes& s) {
  Problem p;
  p.shape = MakeShape(s);
  p.view.page_size = s.page_size;
  p.inv_freq = InvFreq(s.head_dim);
  return p;
}

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

void AddRandomQuality(Problem& p, std::mt19937& rng) {
  SegmentViewHost& v = p.view;
  const int S = v.num_segments();
  v.seg_skip.assign(S, 0);
  v.seg_scale.assign(S, 1.0f);
  v.seg_bias.assign(S, 0.0f);
  std::uniform_int_distribution<int> skip(0, 80), all(0, 7);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f), bias(-1.0f, 1.0f);
  for (int b = 0; b < v.num_requests(); ++b) {
    // The request's last segment is its own (the query rows' keys).
    for (int s = v.seg_indptr[b]; s + 1 < v.seg_indptr[b + 1]; ++s) {
      if ((s - v.seg_indptr[b]) % 2 == 1) continue;
      v.seg_skip[s] = all(rng) == 0 ? v.seg_len[s] : std::min(skip(rng), v.seg_len[s]);
      v.seg_scale[s] = scale(rng);
      v.seg_bias[s] = bias(rng);
    }
  }
}

std::vector<float> RunCpu(const Problem& p, const KvPool& pool, KeyLayout layout) {
  const std::vector<float> q = ToFloat(p.q), k = ToFloat(pool.k), v = ToFloat(pool.v);
  std::vector<float> out(p.q.size(), std::nanf(""));
  PagedAttentionCpu(p.shape, p.view.View(), p.inv_freq.data(), q.data(), k.data(), v.data(),
                    out.data(), layout);
  return out;
}

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
  prm.kv_evict_first = run.kv_evict_first;
  prm.narrow_tail_tiles = run.narrow_tail_tiles;
  DeviceArray<uint8_t> prefetched(size_t(run.l2_prefetch_bytes), 0);
  if (run.l2_prefetch_bytes > 0) {
    prm.l2_prefetch = prefetched.get();
    prm.l2_prefetch_bytes = run.l2_prefetch_bytes;
    prm.l2_prefetch_at_start = run.l2_prefetch_at_start;
  }
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

void ExpectL2HintsKeepTheOutput(const Problem& p, const KvPool& pool, GpuRun run,
                                const std::string& what) {
  const std::vector<float> plain = RunGpu(p, pool, run);
  for (bool evict_first : {false, true}) {
    for (bool at_start : {false, true}) {
      for (int64_t bytes : {int64_t(0), int64_t(1) << 20, int64_t(33554432) + 48}) {
        run.kv_evict_first = evict_first;
        run.l2_prefetch_at_start = at_start;
        run.l2_prefetch_bytes = bytes;
        EXPECT_TRUE(RunGpu(p, pool, run) == plain)
            << what << " bytes=" << bytes << " evict_first=" << evict_first
            << " at_start=" << at_start;
      }
    }
  }
}

void ExpectClose(const std::vector<float>& got, const std::vector<float>& ref,
                 const std::string& what, float atol, float rtol) {
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

void ExpectEarlyCopiesSeeLateRows(bool decode, int query_len, std::mt19937& rng) {
  if (std::getenv("KERNELS_TEST_PROBE_EARLY_READS") == nullptr) {
    GTEST_SKIP() << "set KERNELS_TEST_PROBE_EARLY_READS=1 to run";
  }
  const Sizes s{/*head_dim=*/128, /*group=*/4, /*num_kv_heads=*/2, 16};
  KvPool pool(16, s.num_kv_heads, s.head_dim, PagesFor(4 * 1500, 16) + 40, rng);
  const std::vector<Doc> docs = MakeDocs(pool, 4, 1000, 1500, rng);
  Problem b1 = EmptyProblem(s);
  AddRequest(b1, pool, docs, {2, 0, 3, 1}, 37, query_len, rng);
  // A plain run first: a kernel's first launch in the process loads its module and sets its
  // shared-memory size, host work that can outlast the writer's delay (the writer then finishes
  // before the attention kernel is even launched, and the probe sees nothing).
  RunGpu(b1, pool, GpuRun{decode, KeyLayout::kRotatedLocal, 8});
  for (bool stable : {true, false}) {
    GpuRun run{decode, KeyLayout::kRotatedLocal, 8};
    run.stable_history = stable;
    run.late_rows = GpuRun::LateRows::kFirstKeys;
    run.late_delay_ns = 500000;  // also past the launcher's host work (tensor maps)
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

}  // namespace lazyrag::kernels::testing
