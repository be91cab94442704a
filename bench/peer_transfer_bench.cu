// Document transfer between two GPUs of one host (issue 9, the peer tier): one 2048-token
// document of the Llama-3.1-8B shape (32 layers x K,V x 2048 tokens x 8 KV heads x 128, bf16 =
// 268 MB), paged (page size 16) and scattered over a pool 4x its size on GPU0, moved into
// scattered free pages of a pool on GPU1 by
//   (a) the page-gather kernel (worker/backend/cuda/peer_copy.h): pull (GPU1 reads GPU0's
//       pool over NVLink) and push (GPU0 writes into GPU1's pool);
//   (b) cudaMemcpyPeerAsync of every run of pages (copy engines; ~1 page per run when pages
//       are scattered: 8,192 copies of 32 KiB);
//   (c) NCCL send/recv (gather into a contiguous buffer on GPU0, send/recv, scatter on GPU1),
//       when built with NCCL;
//   (d) the kvstore path's device parts: gather, D2H into pinned host memory, H2D, scatter
//       (and the same with pageable memory, which is what ExportKv/ImportKv into a
//       std::string do); the real kvstore path adds gRPC and RocksDB on top (bench/README.md:
//       kvstore get ~0.5 GB/s).
// Also the link ceiling: one contiguous cudaMemcpyPeerAsync of the same bytes.
// Every method starts from a poisoned destination pool and its result is verified word by
// word on the device. Wall time per document (host clock around launch + synchronize),
// median of --reps after warm-up. With one GPU the same copies run within GPU0, and say so.
//
// Usage: peer_transfer_bench [--out PATH] [--reps N] [--tokens N] [--layers N] [--kv_heads N]
//                            [--head_dim N] [--page_size N] [--pool_factor N]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_check.h"
#include "worker/backend/cuda/peer_copy.h"

#ifdef LAZYRAG_HAVE_NCCL
#include <nccl.h>
#endif

namespace lazyrag::peer_copy {
namespace {

__host__ __device__ inline uint32_t Hash(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}

// Source pool word w holds Hash(w).
__global__ void FillPattern(uint32_t *pool, int64_t words) {
  for (int64_t w = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; w < words;
       w += int64_t(gridDim.x) * blockDim.x) {
    pool[w] = Hash(uint64_t(w));
  }
}

// Counts words of the destination's document pages that differ from the source pattern.
// Both pools share one layout; strides in 32-bit words.
struct VerifyParams {
  const uint32_t *dst;
  int64_t page_words, kv_words, layer_words;
  const int32_t *src_pages, *dst_pages;
  unsigned long long *mismatches;
};

__global__ void Verify(VerifyParams p) {
  const int i = blockIdx.x, layer = blockIdx.y >> 1, kv = blockIdx.y & 1;
  const int64_t base = layer * p.layer_words + kv * p.kv_words;
  const int64_t s0 = base + p.src_pages[i] * p.page_words;
  const int64_t d0 = base + p.dst_pages[i] * p.page_words;
  unsigned long long bad = 0;
  for (int64_t w = threadIdx.x; w < p.page_words; w += blockDim.x) {
    bad += p.dst[d0 + w] != Hash(uint64_t(s0 + w));
  }
  if (bad) atomicAdd(p.mismatches, bad);
}

struct Row {
  std::string method;
  std::string note;
  std::vector<double> ms;
  double bytes = 0;
  int64_t copies = 0;
  int verified = -1;  // 1 ok, 0 mismatch, -1 not applicable (partial path)
  double Median() const {
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[v.size() / 2];
  }
  double Min() const { return ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end()); }
  double P90() const {
    std::vector<double> v = ms;
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[std::min(v.size() - 1, v.size() * 9 / 10)];
  }
};

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Args {
  std::string out;
  int reps = 30;
  int tokens = 2048;
  int layers = 32;
  int kv_heads = 8;
  int head_dim = 128;
  int page_size = 16;
  int pool_factor = 4;
};

int Main(const Args &a) {
  int ndev = 0;
  BENCH_CUDA(cudaGetDeviceCount(&ndev));
  if (ndev < 1) {
    std::fprintf(stderr, "peer_transfer_bench: no CUDA device\n");
    return 1;
  }
  const bool two = ndev >= 2;
  const int S = 0, D = two ? 1 : 0;
  std::string mode = two ? "GPU0 -> GPU1" : "one GPU: GPU0 -> GPU0 (same-device copies)";
  bool p2p = false;
  if (two) {
    int can01 = 0, can10 = 0;
    BENCH_CUDA(cudaDeviceCanAccessPeer(&can01, S, D));
    BENCH_CUDA(cudaDeviceCanAccessPeer(&can10, D, S));
    p2p = can01 && can10;
    if (p2p) {
      BENCH_OK(EnablePeerAccess(S, D));
      BENCH_OK(EnablePeerAccess(D, S));
    }
  }
  cudaDeviceProp props[2];
  BENCH_CUDA(cudaGetDeviceProperties(&props[0], S));
  BENCH_CUDA(cudaGetDeviceProperties(&props[1], D));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);

  PoolLayout layout;
  layout.num_layers = a.layers;
  layout.page_size = a.page_size;
  layout.kv_dim = a.kv_heads * a.head_dim;
  layout.elem_bytes = 2;
  const int doc_pages = (a.tokens + a.page_size - 1) / a.page_size;
  layout.num_pages = doc_pages * a.pool_factor;
  const double bytes = 2.0 * a.layers * doc_pages * layout.PageBytes();

  // Scattered pages: a random permutation's prefix in each pool.
  std::mt19937 rng(42);
  std::vector<int32_t> sp(layout.num_pages), dp(layout.num_pages);
  std::iota(sp.begin(), sp.end(), 0);
  std::iota(dp.begin(), dp.end(), 0);
  std::shuffle(sp.begin(), sp.end(), rng);
  std::shuffle(dp.begin(), dp.end(), rng);
  sp.resize(doc_pages);
  dp.resize(doc_pages);
  BENCH_OK(CheckPageCopy(layout, layout, sp, dp));

  // Pools, page lists on both devices, streams, contiguous staging buffers.
  void *src_pool = nullptr, *dst_pool = nullptr, *src_buf = nullptr, *dst_buf = nullptr;
  int32_t *pages_s = nullptr, *pages_d = nullptr;  // [src pages | dst pages] on S and on D
  cudaStream_t ss, ds;
  unsigned long long *mismatch = nullptr;
  BENCH_CUDA(cudaSetDevice(S));
  BENCH_CUDA(cudaMalloc(&src_pool, layout.PoolBytes()));
  BENCH_CUDA(cudaMalloc(&src_buf, size_t(bytes)));
  BENCH_CUDA(cudaMalloc(&pages_s, 2 * doc_pages * sizeof(int32_t)));
  BENCH_CUDA(cudaStreamCreateWithFlags(&ss, cudaStreamNonBlocking));
  FillPattern<<<1024, 256>>>(static_cast<uint32_t *>(src_pool), layout.PoolBytes() / 4);
  BENCH_CUDA(cudaGetLastError());
  BENCH_CUDA(cudaMemcpy(pages_s, sp.data(), doc_pages * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(pages_s + doc_pages, dp.data(), doc_pages * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaDeviceSynchronize());
  BENCH_CUDA(cudaSetDevice(D));
  BENCH_CUDA(cudaMalloc(&dst_pool, layout.PoolBytes()));
  BENCH_CUDA(cudaMalloc(&dst_buf, size_t(bytes)));
  BENCH_CUDA(cudaMalloc(&pages_d, 2 * doc_pages * sizeof(int32_t)));
  BENCH_CUDA(cudaMalloc(&mismatch, sizeof(unsigned long long)));
  BENCH_CUDA(cudaStreamCreateWithFlags(&ds, cudaStreamNonBlocking));
  BENCH_CUDA(cudaMemcpy(pages_d, sp.data(), doc_pages * 4, cudaMemcpyHostToDevice));
  BENCH_CUDA(cudaMemcpy(pages_d + doc_pages, dp.data(), doc_pages * 4, cudaMemcpyHostToDevice));
  void *pinned = nullptr;
  BENCH_CUDA(cudaMallocHost(&pinned, size_t(bytes)));
  std::vector<char> pageable(size_t(bytes), 1);  // touched: no first-use page faults in timing

#ifdef LAZYRAG_HAVE_NCCL
  ncclComm_t comms[2] = {nullptr, nullptr};
  bool nccl = false;
  std::string nccl_note;
  if (two) {
    int devs[2] = {S, D};
    ncclResult_t r = ncclCommInitAll(comms, 2, devs);
    nccl = r == ncclSuccess;
    if (!nccl) nccl_note = std::string("ncclCommInitAll failed: ") + ncclGetErrorString(r);
  } else {
    nccl_note = "needs two GPUs";
  }
#else
  const bool nccl = false;
  const std::string nccl_note = "built without NCCL (nccl.h / libnccl not found at configure)";
#endif

  auto poison = [&] {
    BENCH_CUDA(cudaSetDevice(D));
    BENCH_CUDA(cudaMemset(dst_pool, 0xFF, layout.PoolBytes()));
    BENCH_CUDA(cudaDeviceSynchronize());
  };
  auto verify = [&]() -> int {
    BENCH_CUDA(cudaSetDevice(D));
    BENCH_CUDA(cudaMemset(mismatch, 0, sizeof(*mismatch)));
    VerifyParams v{static_cast<const uint32_t *>(dst_pool),
                   layout.PageBytes() / 4,
                   layout.KvBytes() / 4,
                   layout.LayerStrideBytes() / 4,
                   pages_d,
                   pages_d + doc_pages,
                   mismatch};
    Verify<<<dim3(doc_pages, 2 * a.layers), 256>>>(v);
    BENCH_CUDA(cudaGetLastError());
    unsigned long long bad = 0;
    BENCH_CUDA(cudaMemcpy(&bad, mismatch, sizeof(bad), cudaMemcpyDeviceToHost));
    if (bad) std::fprintf(stderr, "  verify: %llu mismatching words\n", bad);
    return bad == 0;
  };
  auto sync_both = [&] {
    BENCH_CUDA(cudaStreamSynchronize(ss));
    BENCH_CUDA(cudaStreamSynchronize(ds));
  };
  std::vector<Row> rows;
  // Runs `op` (which enqueues on ss/ds) warm-up + reps times, timing each to completion.
  auto measure = [&](Row row, bool full_copy, const std::function<void()> &op) {
    if (full_copy) poison();
    for (int i = 0; i < 3; ++i) {
      op();
      sync_both();
    }
    for (int i = 0; i < a.reps; ++i) {
      const double t0 = NowMs();
      op();
      sync_both();
      row.ms.push_back(NowMs() - t0);
    }
    row.bytes = bytes;
    if (full_copy) row.verified = verify();
    rows.push_back(row);
    const Row &r = rows.back();
    std::printf("%-34s %9.3f ms  %8.1f GB/s  %s\n", r.method.c_str(), r.Median(),
                r.bytes / r.Median() / 1e6,
                r.verified == 1   ? "verified"
                : r.verified == 0 ? "MISMATCH"
                                  : "(partial path)");
    std::fflush(stdout);
  };
  auto gather = [&](int device, cudaStream_t st) {
    BENCH_CUDA(cudaSetDevice(device));
    PageGatherParams p;
    p.src_pool = src_pool;
    p.dst_pool = dst_pool;
    p.src = layout;
    p.dst = layout;
    const int32_t *pages = device == S ? pages_s : pages_d;
    p.src_pages = pages;
    p.dst_pages = pages + doc_pages;
    p.num_pages = doc_pages;
    BENCH_OK(LaunchPageGather(p, st));
  };

  std::printf(
      "peer_transfer_bench: %s; %s%s\n", mode.c_str(), props[0].name,
      two ? (p2p ? ", peer access on" : ", NO peer access (copies staged by the driver)") : "");
  std::printf(
      "document: %d tokens, %d layers x K,V x %d kv heads x %d dims bf16 = %.1f MB in %d "
      "pages of %d tokens (%.0f KiB blocks), scattered over pools of %d pages\n\n",
      a.tokens, a.layers, a.kv_heads, a.head_dim, bytes / 1e6, doc_pages, a.page_size,
      layout.PageBytes() / 1024.0, layout.num_pages);

  // (a) Page gather kernel.
  if (!two || p2p) {
    measure({"gather kernel, pull (on dst GPU)",
             "page-gather kernel on the destination GPU "
             "reading the source pool over NVLink",
             {},
             0,
             doc_pages * 2 * a.layers,
             -1},
            true, [&] { gather(D, ds); });
    if (two) {
      measure({"gather kernel, push (on src GPU)",
               "page-gather kernel on the source GPU writing into the destination pool",
               {},
               0,
               doc_pages * 2 * a.layers,
               -1},
              true, [&] { gather(S, ss); });
    }
  }
  // (b) Copy engines, one copy per page run.
  {
    int64_t copies = 0;
    measure({"cudaMemcpyPeerAsync per page run", "", {}, 0, 0, -1}, true, [&] {
      BENCH_CUDA(cudaSetDevice(D));
      auto c = CopyPageRuns(src_pool, S, layout, sp, dst_pool, D, layout, dp, ds);
      BENCH_OK(c.status());
      copies = *c;
    });
    rows.back().copies = copies;
    rows.back().note = std::to_string(copies) + " copies of runs of scattered pages";
  }
  // Link ceiling: the same bytes contiguous, one copy.
  measure({"contiguous memcpy (link ceiling)",
           "one cudaMemcpyPeerAsync of the document's bytes, "
           "contiguous buffer to contiguous buffer",
           {},
           0,
           1,
           -1},
          false, [&] {
            BENCH_CUDA(cudaSetDevice(D));
            BENCH_CUDA(cudaMemcpyPeerAsync(dst_buf, D, src_buf, S, size_t(bytes), ds));
          });
  // (c) NCCL.
#ifdef LAZYRAG_HAVE_NCCL
  if (nccl) {
    auto sendrecv = [&] {
      ncclGroupStart();
      ncclSend(src_buf, size_t(bytes), ncclChar, 1, comms[0], ss);
      ncclRecv(dst_buf, size_t(bytes), ncclChar, 0, comms[1], ds);
      ncclResult_t r = ncclGroupEnd();
      if (r != ncclSuccess) {
        std::fprintf(stderr, "nccl: %s\n", ncclGetErrorString(r));
        std::exit(1);
      }
    };
    measure({"NCCL send/recv, contiguous only",
             "ncclSend/ncclRecv of the contiguous bytes",
             {},
             0,
             1,
             -1},
            false, sendrecv);
    measure(
        {"NCCL: gather + send/recv + scatter",
         "pages -> contiguous on GPU0, NCCL, contiguous "
         "-> pages on GPU1",
         {},
         0,
         3,
         -1},
        true, [&] {
          BENCH_CUDA(cudaSetDevice(S));
          BENCH_OK(LaunchPagesToBuffer(src_pool, layout, pages_s, doc_pages, src_buf, true, ss));
          sendrecv();
          BENCH_CUDA(cudaSetDevice(D));
          BENCH_OK(LaunchPagesToBuffer(dst_pool, layout, pages_d + doc_pages, doc_pages, dst_buf,
                                       false, ds));
        });
  }
#endif
  // (d) Host-staged (the kvstore path's device parts).
  auto staged = [&](void *host) {
    return [&, host] {
      BENCH_CUDA(cudaSetDevice(S));
      BENCH_OK(LaunchPagesToBuffer(src_pool, layout, pages_s, doc_pages, src_buf, true, ss));
      BENCH_CUDA(cudaMemcpyAsync(host, src_buf, size_t(bytes), cudaMemcpyDeviceToHost, ss));
      BENCH_CUDA(cudaStreamSynchronize(ss));
      BENCH_CUDA(cudaSetDevice(D));
      BENCH_CUDA(cudaMemcpyAsync(dst_buf, host, size_t(bytes), cudaMemcpyHostToDevice, ds));
      BENCH_OK(LaunchPagesToBuffer(dst_pool, layout, pages_d + doc_pages, doc_pages, dst_buf, false,
                                   ds));
    };
  };
  measure({"host staged, pinned (D2H+H2D)", "gather, D2H to pinned, H2D, scatter", {}, 0, 4, -1},
          true, staged(pinned));
  measure({"host staged, pageable (D2H+H2D)",
           "as ExportKv/ImportKv into a std::string: gather, D2H, H2D, scatter",
           {},
           0,
           4,
           -1},
          true, staged(pageable.data()));
  measure({"  D2H only, pinned", "", {}, 0, 1, -1}, false, [&] {
    BENCH_CUDA(cudaSetDevice(S));
    BENCH_CUDA(cudaMemcpyAsync(pinned, src_buf, size_t(bytes), cudaMemcpyDeviceToHost, ss));
  });
  measure({"  H2D only, pinned", "", {}, 0, 1, -1}, false, [&] {
    BENCH_CUDA(cudaSetDevice(D));
    BENCH_CUDA(cudaMemcpyAsync(dst_buf, pinned, size_t(bytes), cudaMemcpyHostToDevice, ds));
  });

  const double kvstore_gbps =
      0.5;  // bench/README.md, kvstore get over loopback (not measured here)
  std::printf(
      "%-34s %9.1f ms  %8.1f GB/s  (reference from bench/README.md, not measured here: "
      "gRPC + RocksDB)\n",
      "kvstore get (reference)", bytes / (kvstore_gbps * 1e6), kvstore_gbps);
#ifdef LAZYRAG_HAVE_NCCL
  if (!nccl) std::printf("NCCL rows skipped: %s\n", nccl_note.c_str());
#else
  std::printf("NCCL rows skipped: %s\n", nccl_note.c_str());
#endif
  if (!two) std::printf("Fewer than two GPUs: every copy above stayed on GPU0.\n");

  if (!a.out.empty()) {
    FILE *f = std::fopen(a.out.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", a.out.c_str());
      return 1;
    }
    std::fprintf(f, "{\n  \"bench\": \"peer_transfer\",\n  \"mode\": \"%s\",\n", mode.c_str());
    std::fprintf(f, "  \"devices\": [\"%s\", \"%s\"],\n  \"device_count\": %d,\n", props[0].name,
                 props[1].name, ndev);
    std::fprintf(f, "  \"peer_access\": %s,\n  \"cuda_driver\": %d,\n  \"cuda_runtime\": %d,\n",
                 p2p ? "true" : "false", driver, runtime);
    std::fprintf(f,
                 "  \"document\": {\"tokens\": %d, \"layers\": %d, \"kv_heads\": %d, "
                 "\"head_dim\": %d, \"dtype\": \"bf16\", \"page_size\": %d, \"pages\": %d, "
                 "\"pool_pages\": %d, \"page_block_bytes\": %lld, \"bytes\": %.0f},\n",
                 a.tokens, a.layers, a.kv_heads, a.head_dim, a.page_size, doc_pages,
                 layout.num_pages, (long long)layout.PageBytes(), bytes);
    std::fprintf(f,
                 "  \"reps\": %d,\n  \"timing\": \"host wall clock around enqueue + "
                 "synchronize, median of reps after 3 warm-ups\",\n",
                 a.reps);
    std::fprintf(f, "  \"nccl\": %s,\n  \"nccl_note\": \"%s\",\n", nccl ? "true" : "false",
                 nccl_note.c_str());
    std::fprintf(f, "  \"kvstore_get_reference_gbps\": %.2f,\n  \"results\": [\n", kvstore_gbps);
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row &r = rows[i];
      std::fprintf(
          f,
          "    {\"method\": \"%s\", \"note\": \"%s\", \"ms_median\": %.4f, \"ms_min\": "
          "%.4f, \"ms_p90\": %.4f, \"gbps\": %.2f, \"copies\": %lld, \"verified\": %s}%s\n",
          r.method.c_str(), r.note.c_str(), r.Median(), r.Min(), r.P90(),
          r.bytes / r.Median() / 1e6, (long long)r.copies,
          r.verified == 1   ? "true"
          : r.verified == 0 ? "false"
                            : "null",
          i + 1 < rows.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
    std::printf("wrote %s\n", a.out.c_str());
  }
  for (const Row &r : rows) {
    if (r.verified == 0) return 2;
  }
  return 0;
}

}  // namespace
}  // namespace lazyrag::peer_copy

int main(int argc, char **argv) {
  lazyrag::peer_copy::Args a;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](int *v) {
      if (i + 1 >= argc) return false;
      *v = std::atoi(argv[++i]);
      return *v > 0;
    };
    bool ok = true;
    if (!std::strcmp(argv[i], "--out") && i + 1 < argc) {
      a.out = argv[++i];
    } else if (!std::strcmp(argv[i], "--reps")) {
      ok = next(&a.reps);
    } else if (!std::strcmp(argv[i], "--tokens")) {
      ok = next(&a.tokens);
    } else if (!std::strcmp(argv[i], "--layers")) {
      ok = next(&a.layers);
    } else if (!std::strcmp(argv[i], "--kv_heads")) {
      ok = next(&a.kv_heads);
    } else if (!std::strcmp(argv[i], "--head_dim")) {
      ok = next(&a.head_dim);
    } else if (!std::strcmp(argv[i], "--page_size")) {
      ok = next(&a.page_size);
    } else if (!std::strcmp(argv[i], "--pool_factor")) {
      ok = next(&a.pool_factor);
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: %s [--out PATH] [--reps N] [--tokens N] [--layers N] [--kv_heads N] "
                   "[--head_dim N] [--page_size N] [--pool_factor N]\n",
                   argv[0]);
      return 2;
    }
  }
  return lazyrag::peer_copy::Main(a);
}
