// Test helpers for running one prompt through two engines (a backend against its reference:
// CUDA against CPU, tensor-parallel against plain, graphs against eager) and comparing the
// logits of every step. Header-only; include from gtest files only.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "worker/engine/clock.h"
#include "worker/engine/engine.h"

namespace lazyrag::engine_test {

inline std::vector<int32_t> RandomTokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

// A prefix of 7 tokens, documents of the given lengths and a suffix, all random.
inline TokenPrompt RagPrompt(std::mt19937& rng, int vocab, const std::vector<int>& doc_lens,
                             int suffix) {
  TokenPrompt p;
  p.prefix = RandomTokens(rng, 7, vocab);
  for (int n : doc_lens) p.documents.push_back(RandomTokens(rng, n, vocab));
  p.suffix = RandomTokens(rng, suffix, vocab);
  return p;
}

// Tokens 2..251 drawn from a generator seeded with `seed` (vocabularies of >= 252).
inline std::vector<int32_t> Tokens(int seed, int n) {
  std::mt19937 rng(seed);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = 2 + int(rng() % 250);
  return t;
}

// The logits of every step (prefill, then each greedy decode step), the tokens and the whole
// result (usage, timings).
struct ModeRun {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
  TokenResult result;
};

inline ModeRun RunMode(Engine& e, const TokenPrompt& p, AttentionMode mode, int steps,
                       std::optional<int> recompute_first_tokens = std::nullopt) {
  ModeRun r;
  TokenRunOptions o;
  o.mode = mode;
  o.quality.recompute_first_tokens = recompute_first_tokens;
  o.max_tokens = steps;
  o.ignore_eos = true;
  o.step_logits = &r.logits;
  auto res = e.RunTokens(p, o);
  EXPECT_TRUE(res.ok()) << res.status();
  if (res.ok()) {
    r.tokens = res->token_ids;
    r.result = *res;
  }
  return r;
}

// max |a - ref| / max |ref|.
inline double RelError(const std::vector<float>& a, const std::vector<float>& ref) {
  EXPECT_EQ(a.size(), ref.size());
  double diff = 0, mx = 0;
  for (size_t i = 0; i < std::min(a.size(), ref.size()); ++i) {
    diff = std::max(diff, double(std::fabs(a[i] - ref[i])));
    mx = std::max(mx, double(std::fabs(ref[i])));
  }
  return diff / std::max(mx, 1e-30);
}

// Compares step logits (RelError <= tolerance, printed) while the generated tokens agree. A
// different greedy token is accepted only at a near tie of the reference (top-2 gap within
// 2 x tolerance x max |logit|); later steps are then not compared.
inline void ExpectRunsMatch(const ModeRun& got, const ModeRun& ref, double tolerance,
                            const std::string& what) {
  ASSERT_EQ(got.logits.size(), ref.logits.size()) << what;
  for (size_t s = 0; s < ref.logits.size(); ++s) {
    const double err = RelError(got.logits[s], ref.logits[s]);
    EXPECT_LE(err, tolerance) << what << " step " << s;
    std::printf("[ %s ] step %zu: max|diff|/max|ref| = %.3g\n", what.c_str(), s, err);
    if (s < ref.tokens.size() && s < got.tokens.size() && got.tokens[s] != ref.tokens[s]) {
      std::vector<float> sorted = ref.logits[s];
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      float mx = 0;
      for (float v : ref.logits[s]) mx = std::max(mx, std::fabs(v));
      EXPECT_LE(sorted[0] - sorted[1], 2 * tolerance * mx)
          << what << ": greedy token differs at step " << s << " without a near tie";
      std::printf("[ %s ] tokens diverge at step %zu (near tie); later steps not compared\n",
                  what.c_str(), s);
      return;
    }
  }
}

// A backend that passes every call to `inner`: tests derive from it to count or fail calls.
// Pool sharing (ExportPoolHandle, CopyPagesFromPeer) keeps Backend's UNIMPLEMENTED defaults and
// host transfers its synchronous defaults (through ExportKv / ImportKv, so they reach `inner`).
class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  const ModelConfig& config() const override { return inner_->config(); }
  absl::Status InitPool(int n, int ps) override { return inner_->InitPool(n, ps); }
  int num_pages() const override { return inner_->num_pages(); }
  int page_size() const override { return inner_->page_size(); }
  KvDtype kv_dtype() const override { return inner_->kv_dtype(); }
  bool SupportsQualityViews() const override { return inner_->SupportsQualityViews(); }
  absl::Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    return inner_->Forward(b, logits);
  }
  absl::Status ForwardArgmax(const ForwardBatch& b, std::vector<int32_t>* ids) override {
    return inner_->ForwardArgmax(b, ids);
  }
  absl::Status Materialize(const std::vector<MaterializeCopy>& c) override {
    return inner_->Materialize(c);
  }
  absl::Status ExportKv(const std::vector<int32_t>& pages, int n, std::string* out) override {
    return inner_->ExportKv(pages, n, out);
  }
  absl::Status ImportKv(const std::vector<int32_t>& pages, int n, std::string_view d) override {
    return inner_->ImportKv(pages, n, d);
  }
  Backend* inner() const { return inner_.get(); }

 private:
  std::unique_ptr<Backend> inner_;
};

// A clock that moves only when told (EngineOptions::clock): hedge times and the
// store's down windows pass when a test says so, not after a sleep. Starts at
// the wall clock's now.
class FakeClock final : public Clock {
 public:
  absl::Time Now() const override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::Now();
};

// A backend whose every forward step takes `step` on a FakeClock (what the
// engine's cost model measures), however long it really takes.
class ClockedBackend final : public ForwardingBackend {
 public:
  ClockedBackend(std::unique_ptr<Backend> inner, FakeClock* clock, absl::Duration step)
      : ForwardingBackend(std::move(inner)), clock_(clock), step_(step) {}
  absl::Status Forward(const ForwardBatch& b, std::vector<float>* logits) override {
    clock_->Advance(step_);
    return ForwardingBackend::Forward(b, logits);
  }
  absl::Status ForwardArgmax(const ForwardBatch& b, std::vector<int32_t>* ids) override {
    clock_->Advance(step_);
    return ForwardingBackend::ForwardArgmax(b, ids);
  }

 private:
  FakeClock* const clock_;
  const absl::Duration step_;
};

}  // namespace lazyrag::engine_test
