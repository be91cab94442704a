#include "worker/backend/tensor_parallel.h"

#include <algorithm>
#include <functional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace lazyrag {

// ---------------------------------------------------------------------------------------------
// HostAllReduce

absl::Status HostAllReduce::Barrier(const std::function<void()>& on_last) {
  absl::MutexLock lock(&mu_);
  if (aborted_) return absl::AbortedError("all-reduce: another rank failed");
  const int64_t gen = generation_;
  if (++arrived_ == size_) {
    if (on_last) on_last();
    arrived_ = 0;
    ++generation_;
    return absl::OkStatus();
  }
  auto released = [&]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return generation_ != gen || aborted_; };
  mu_.Await(absl::Condition(&released));
  if (generation_ == gen) return absl::AbortedError("all-reduce: another rank failed");
  return absl::OkStatus();
}

absl::Status HostAllReduce::AllReduceSum(int rank, float* data, int64_t n) {
  if (size_ == 1) return absl::OkStatus();
  if (rank < 0 || rank >= size_) return absl::InvalidArgumentError("all-reduce: bad rank");
  buffers_[rank] = data;
  RETURN_IF_ERROR(Barrier([&] {
    n_ = n;
    sum_.resize(size_t(n));
  }));
  if (n_ != n) return absl::InternalError("all-reduce: ranks disagree on the length");
  const int64_t begin = n * rank / size_, end = n * (rank + 1) / size_;
  for (int64_t i = begin; i < end; ++i) {
    float s = buffers_[0][i];
    for (int r = 1; r < size_; ++r) s += buffers_[r][i];
    sum_[i] = s;
  }
  RETURN_IF_ERROR(Barrier(nullptr));
  // sum_ is rewritten only after every rank has arrived at the next call's first barrier.
  std::copy(sum_.begin(), sum_.end(), data);
  return absl::OkStatus();
}

void HostAllReduce::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
}

void HostAllReduce::Reset() {
  absl::MutexLock lock(&mu_);
  aborted_ = false;
  arrived_ = 0;
}

namespace {

// One persistent thread that runs one task at a time.
class RankThread {
 public:
  RankThread() : thread_([this] { Loop(); }) {}
  ~RankThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  // REQUIRES: no task pending (Wait() returned since the last Post).
  void Post(std::function<absl::Status()> task) {
    absl::MutexLock lock(&mu_);
    task_ = std::move(task);
    done_ = false;
  }
  absl::Status Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    return status_;
  }

 private:
  void Loop() {
    while (true) {
      std::function<absl::Status()> task;
      {
        absl::MutexLock lock(&mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || task_; };
        mu_.Await(absl::Condition(&ready));
        if (stop_ && !task_) return;
        task = std::move(task_);
        task_ = nullptr;
      }
      absl::Status st = task();
      absl::MutexLock lock(&mu_);
      status_ = std::move(st);
      done_ = true;
    }
  }

  absl::Mutex mu_;
  std::function<absl::Status()> task_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = true;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;  // last: starts after the fields above exist
};

class TensorParallelBackend final : public Backend {
 public:
  TensorParallelBackend(const ModelConfig& global, std::vector<std::unique_ptr<Backend>> ranks,
                        std::shared_ptr<RankCollective> collective)
      : config_(global), collective_(std::move(collective)), ranks_(std::move(ranks)) {
    for (size_t r = 1; r < ranks_.size(); ++r) threads_.push_back(std::make_unique<RankThread>());
    name_ = absl::StrCat(ranks_[0]->name(), "-tp", ranks_.size());
  }
  ~TensorParallelBackend() override {
    threads_.clear();  // joins before the ranks go
  }

  std::string name() const override { return name_; }
  const ModelConfig& config() const override { return config_; }
  int num_pages() const override { return ranks_[0]->num_pages(); }
  int page_size() const override { return ranks_[0]->page_size(); }
  KvDtype kv_dtype() const override { return ranks_[0]->kv_dtype(); }

  absl::Status InitPool(int num_pages, int page_size) override {
    return FanOut([&](int, Backend& b) { return b.InitPool(num_pages, page_size); });
  }

  bool SupportsQualityViews() const override {
    for (const auto& r : ranks_) {
      if (!r->SupportsQualityViews()) return false;
    }
    return true;
  }

  absl::Status Forward(const ForwardBatch& batch, std::vector<float>* logits) override {
    return ForwardAll(batch, [&](Backend& b) { return b.Forward(batch, logits); });
  }

  absl::Status ForwardArgmax(const ForwardBatch& batch, std::vector<int32_t>* ids) override {
    return ForwardAll(batch, [&](Backend& b) { return b.ForwardArgmax(batch, ids); });
  }

  absl::Status Materialize(const std::vector<MaterializeCopy>& copies) override {
    return FanOut([&](int, Backend& b) { return b.Materialize(copies); });
  }

  absl::Status ExportKv(const std::vector<int32_t>& pages, int num_tokens,
                        std::string* out) override {
    std::vector<std::string> parts(ranks_.size());
    RETURN_IF_ERROR(
        FanOut([&](int r, Backend& b) { return b.ExportKv(pages, num_tokens, &parts[r]); }));
    return MergeKvTransport(parts, config_.num_layers, num_tokens, config_.num_kv_heads,
                            config_.head_dim, ElemBytes(), out);
  }

  absl::Status ImportKv(const std::vector<int32_t>& pages, int num_tokens,
                        std::string_view data) override {
    if (num_tokens < 0) return absl::InvalidArgumentError("kv import: negative token count");
    ASSIGN_OR_RETURN(std::vector<std::string> parts,
                     SplitKvTransport(data, int(ranks_.size()), config_.num_layers, num_tokens,
                                      config_.num_kv_heads, config_.head_dim, ElemBytes()));
    return FanOut([&](int r, Backend& b) { return b.ImportKv(pages, num_tokens, parts[r]); });
  }

 private:
  int ElemBytes() const { return kv_dtype() == KvDtype::kFloat32 ? 4 : 2; }

  // A forward step on every rank: rank 0 runs `rank0` (the caller's outputs); ranks 1..N-1 run
  // the same layers (their collectives need them) but return no logits.
  absl::Status ForwardAll(const ForwardBatch& batch,
                          const std::function<absl::Status(Backend&)>& rank0) {
    ForwardBatch no_logits;
    if (ranks_.size() > 1) {
      no_logits = batch;
      no_logits.logit_rows.clear();
    }
    std::vector<std::vector<float>> discard(ranks_.size());
    return FanOut(
        [&](int r, Backend& b) { return r == 0 ? rank0(b) : b.Forward(no_logits, &discard[r]); });
  }

  // Runs fn(r, rank r) on every rank (rank 0 on this thread) and joins; the lowest failing
  // rank's status wins.
  absl::Status FanOut(const std::function<absl::Status(int, Backend&)>& fn) {
    absl::MutexLock lock(&mu_);
    if (collective_) collective_->Reset();
    auto run = [&](int r) {
      absl::Status st = fn(r, *ranks_[r]);
      if (!st.ok() && collective_) collective_->Abort();
      return st;
    };
    for (size_t r = 1; r < ranks_.size(); ++r) {
      threads_[r - 1]->Post([&run, r] { return run(int(r)); });
    }
    absl::Status first = run(0);
    for (size_t r = 1; r < ranks_.size(); ++r) {
      absl::Status st = threads_[r - 1]->Wait();
      if (first.ok() && !st.ok()) {
        first =
            absl::Status(st.code(), absl::StrCat("tensor parallel rank ", r, ": ", st.message()));
      }
    }
    return first;
  }

  const ModelConfig config_;
  std::shared_ptr<RankCollective> collective_;  // outlives the ranks
  std::vector<std::unique_ptr<Backend>> ranks_;
  std::vector<std::unique_ptr<RankThread>> threads_;  // rank r >= 1 at r - 1
  std::string name_;
  absl::Mutex mu_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateTensorParallelBackend(
    const ModelConfig& global, std::vector<std::unique_ptr<Backend>> ranks,
    std::shared_ptr<RankCollective> collective) {
  if (ranks.empty()) return absl::InvalidArgumentError("tensor parallel: no ranks");
  const int n = int(ranks.size());
  for (int r = 0; r < n; ++r) {
    if (ranks[r] == nullptr) return absl::InvalidArgumentError("tensor parallel: null rank");
    ASSIGN_OR_RETURN(ModelConfig want, ShardConfig(global, {n, r}));
    const ModelConfig& got = ranks[r]->config();
    if (got.num_heads != want.num_heads || got.num_kv_heads != want.num_kv_heads ||
        got.intermediate_size != want.intermediate_size || got.hidden_size != want.hidden_size ||
        got.num_layers != want.num_layers || got.head_dim != want.head_dim ||
        got.vocab_size != want.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor parallel: rank ", r, " does not hold shard ", r, " of ", n));
    }
  }
  return std::unique_ptr<Backend>(
      new TensorParallelBackend(global, std::move(ranks), std::move(collective)));
}

}  // namespace lazyrag
