// Plans one scheduler step (DESIGN section 6, chunked prefill): packs, under
// the per-step token budget, the decode token of every running request (oldest
// first), then prefill chunks of documents being computed, then prefill chunks
// of requests; builds the step's ForwardBatch (segments, positions, KV slots,
// logit rows) and applies what the step computed. Scheduler thread only.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "worker/backend/backend.h"
#include "worker/cache/document_table.h"
#include "worker/engine/scheduled_request.h"

namespace lazyrag {

// One sequence of a step: the next `n` tokens of a request or of a document
// being computed (exactly one of `request` and `job` is set).
struct StepSequence {
  std::shared_ptr<ScheduledRequest> request;
  std::shared_ptr<DocJob> job;
  int n = 0;
};

struct StepPlan {
  std::vector<StepSequence> seqs;
  ForwardBatch batch;
  std::vector<int> logit_seq;  // the sequence (index into seqs) of each logit row
  // Every logit row is greedy and nobody wants its logits: ForwardArgmax
  // suffices.
  bool argmax_only = false;
};

class StepPlanner {
 public:
  // Makes the own segment of a request hold `tokens` tokens (allocating pages,
  // which may preempt younger requests); false when the request was preempted
  // or failed instead.
  using GrowFn = std::function<bool(const std::shared_ptr<ScheduledRequest> &, int64_t tokens)>;

  // `table` (for PREFIX mode's page hand-off) is not owned and must outlive the
  // planner.
  StepPlanner(DocumentTable *table, int page_size, int prefill_chunk, int max_batch_tokens);

  // The sequences of the next step from the running requests and the document
  // jobs.
  std::vector<StepSequence> Pack(std::span<const std::shared_ptr<ScheduledRequest>> running,
                                 const std::map<std::string, std::shared_ptr<DocJob>> &jobs,
                                 const GrowFn &grow) const;
  // From now on every block computed, but the block `id` itself, attends `run`
  // (the engine's shared prefix) at positions [0, run.num_tokens) and sits after
  // it; its keys are still rotated at local positions 0.. (EngineOptions).
  void SetSink(std::string id, DocumentRun run) {
    sink_id_ = std::move(id);
    sink_run_ = std::move(run);
  }
  // The ForwardBatch of `seqs` (REQUIRES: non-empty, from Pack).
  StepPlan Build(std::vector<StepSequence> seqs) const;

  // Records that the step fed `s.n` tokens of `s`. PREFIX: a request whose
  // prompt is all in the KV hands its newly computed full prompt pages to the
  // table (pinned by it). Returns true when a document job has all its tokens
  // in the KV.
  bool ApplyFed(const StepSequence &s) const;
  // The token of logit row `k` of the step: the argmax the backend returned, or
  // sampled from the row (whose logits go to step_logits when the caller asked
  // for them).
  static int32_t TokenOf(const StepPlan &plan, size_t k, std::span<const int32_t> argmax,
                         std::span<const float> logits, int vocab);

 private:
  DocumentTable *const table_;
  const int page_size_;
  const int prefill_chunk_;
  const int max_batch_tokens_;
  std::string sink_id_;  // empty: no shared prefix
  DocumentRun sink_run_;
};

}  // namespace lazyrag
