#include "worker/engine/step_planner.h"

#include <algorithm>

namespace lazyrag {
namespace {

int64_t Remaining(const ScheduledRequest &r) { return int64_t(r.feed.size()) - int64_t(r.fed); }

bool IsDecode(const ScheduledRequest &r) { return Remaining(r) == 1 && !r.generated.empty(); }

bool Runs(const ScheduledRequest &r) { return !r.finished && r.phase == ScheduledRequest::kRun; }

// Of the next n tokens of `r`'s feed, those appended at own.len (not filling a
// reserved slot).
int Appended(const ScheduledRequest &r, int n) {
  const int64_t fills = std::clamp<int64_t>(int64_t(r.fill_slot.size()) - int64_t(r.fed), 0, n);
  return n - int(fills);
}

}  // namespace

StepPlanner::StepPlanner(DocumentTable *table, int page_size, int prefill_chunk,
                         int max_batch_tokens)
    : table_(table),
      page_size_(page_size),
      prefill_chunk_(prefill_chunk),
      max_batch_tokens_(max_batch_tokens) {}

std::vector<StepSequence> StepPlanner::Pack(
    std::span<const std::shared_ptr<ScheduledRequest>> running,
    const std::map<std::string, std::shared_ptr<DocJob>> &jobs, const GrowFn &grow) const {
  std::vector<StepSequence> seqs;
  int budget = max_batch_tokens_;
  std::vector<std::shared_ptr<ScheduledRequest>> by_age;
  for (const auto &r : running) {
    if (Runs(*r) && Remaining(*r) > 0) by_age.push_back(r);
  }
  std::sort(by_age.begin(), by_age.end(),
            [](const auto &a, const auto &b) { return a->order < b->order; });
  auto add_request = [&](const std::shared_ptr<ScheduledRequest> &r) {
    if (!Runs(*r) || budget <= 0) return;
    const int n = int(std::min<int64_t>({Remaining(*r), prefill_chunk_, budget}));
    if (!grow(r, int64_t(r->own.len) + Appended(*r, n))) return;
    if (!Runs(*r)) return;
    seqs.push_back({r, nullptr, n});
    budget -= n;
  };
  // Decode tokens first (oldest request first), then document chunks, then
  // prefill chunks.
  for (auto &r : by_age) {
    if (IsDecode(*r)) add_request(r);
  }
  for (const auto &[id, job] : jobs) {
    if (job->state != DocJob::kComputing || budget <= 0) continue;
    const int n = std::min<int>({int(job->tokens.size()) - job->fed, prefill_chunk_, budget});
    if (n <= 0) continue;
    seqs.push_back({nullptr, job, n});
    budget -= n;
  }
  for (auto &r : by_age) {
    if (!IsDecode(*r)) add_request(r);
  }
  // Drop sequences whose request was preempted or failed after being packed.
  seqs.erase(std::remove_if(
                 seqs.begin(), seqs.end(),
                 [](const StepSequence &s) { return s.request != nullptr && !Runs(*s.request); }),
             seqs.end());
  return seqs;
}

StepPlan StepPlanner::Build(std::vector<StepSequence> seqs) const {
  const int ps = page_size_;
  StepPlan plan;
  plan.seqs = std::move(seqs);
  ForwardBatch &b = plan.batch;
  b.view.page_size = ps;
  int row = 0;
  for (size_t i = 0; i < plan.seqs.size(); ++i) {
    const StepSequence &s = plan.seqs[i];
    std::vector<int32_t> q_pos(s.n);
    if (s.job) {
      // A document alone, from local position 0, or after the shared prefix.
      const DocJob &j = *s.job;
      int32_t after = 0;
      if (!sink_id_.empty() && j.id != sink_id_) {
        b.view.AddSegment(0, sink_run_.num_tokens, sink_run_.pages);
        after = sink_run_.num_tokens;
      }
      b.view.AddSegment(after, j.fed + s.n, j.pages);
      for (int t = 0; t < s.n; ++t) {
        const int32_t local = j.fed + t;
        b.tokens.push_back(j.tokens[local]);
        b.kv_pos.push_back(local);
        b.kv_slot.push_back(int64_t(j.pages[local / ps]) * ps + local % ps);
        q_pos[t] = after + local;
      }
    } else {
      const ScheduledRequest &r = *s.request;
      for (const Segment &f : r.fixed) {
        b.view.AddSegment(f.start, f.len, f.pages, f.skip, f.scale, f.bias);
      }
      for (const Segment &f : r.own_pieces) {
        b.view.AddSegment(f.start, f.len, r.own.pages, f.skip, f.scale, f.bias);
      }
      b.view.AddSegment(r.own.start, r.own.len + Appended(r, s.n), r.own.pages, r.own.skip);
      int32_t next = r.own.len;
      for (int t = 0; t < s.n; ++t) {
        const size_t f = r.fed + t;
        const bool fill = f < r.fill_slot.size();
        // Own-run index: its key is rotated at it (local to the own run).
        const int32_t local = fill ? r.fill_slot[f] : next++;
        b.tokens.push_back(r.feed[f]);
        b.kv_pos.push_back(local);
        b.kv_slot.push_back(int64_t(r.own.pages[local / ps]) * ps + local % ps);
        q_pos[t] = fill ? r.fill_pos[f] : r.own.start + local;
      }
      if (r.fed + s.n == r.feed.size()) {
        b.logit_rows.push_back(row + s.n - 1);
        plan.logit_seq.push_back(int(i));
      }
    }
    b.view.EndRequest(q_pos);
    row += s.n;
  }
  // Greedy rows whose caller does not want the logits need only their argmax:
  // the backend may reduce on the device and return one id per row
  // (ForwardArgmax).
  plan.argmax_only = !plan.logit_seq.empty();
  for (int i : plan.logit_seq) {
    const ScheduledRequest &r = *plan.seqs[i].request;
    plan.argmax_only =
        plan.argmax_only && r.opts.sampling.temperature == 0.0f && !r.opts.step_logits;
  }
  return plan;
}

bool StepPlanner::ApplyFed(const StepSequence &s) const {
  if (s.job) {
    s.job->fed += s.n;
    return s.job->fed == int(s.job->tokens.size());
  }
  ScheduledRequest &r = *s.request;
  r.own.len += Appended(r, s.n);
  r.fed += s.n;
  if (r.opts.mode == AttentionMode::kPrefix && !r.prefix_inserted && r.fed >= r.prompt_feed) {
    // Hand the newly computed full prompt pages to the prefix cache.
    r.prefix_inserted = true;
    for (size_t k = r.reused_pages; k < r.page_ids.size(); ++k) {
      const int32_t page = r.own.pages[k];
      auto owned = std::find(r.own_pages.begin(), r.own_pages.end(), page);
      if (owned == r.own_pages.end()) continue;
      r.own_pages.erase(owned);
      DocumentRun run = table_->Insert(r.page_ids[k], DocumentRun{{page}, page_size_});
      r.pinned.push_back(r.page_ids[k]);
      r.own.pages[k] = run.pages[0];  // a concurrent insert won: same KV, its page
    }
  }
  return false;
}

int32_t StepPlanner::TokenOf(const StepPlan &plan, size_t k, std::span<const int32_t> argmax,
                             std::span<const float> logits, int vocab) {
  if (plan.argmax_only) return argmax[k];
  ScheduledRequest &r = *plan.seqs[plan.logit_seq[k]].request;
  std::span<const float> row = logits.subspan(k * vocab, vocab);
  if (r.opts.step_logits) r.opts.step_logits->emplace_back(row.begin(), row.end());
  return r.sampler->Sample(row);
}

}  // namespace lazyrag
