// The router's choice of a worker for each request (DESIGN.md section 3, issue 5). Knows
// nothing of gRPC: the service in router_service.h feeds it worker health, Stats answers and
// request outcomes, and asks it where to send each request.
//
// For each healthy candidate worker w:
//
//   cost(w) = missing_tokens(w) + load_weight * load(w)
//
//   missing_tokens(w)  tokens of the request's documents that w does not hold (it would have
//                      to compute or fetch them). What w holds is learned from its Stats
//                      (resident document ids) and from what this router sent there.
//   load(w)            this router's requests in flight on w, plus the running and waiting
//                      requests w reported in its last Stats that were not this router's.
//
// The lowest cost wins, except:
//   * when max load - min load among the candidates exceeds imbalance_threshold, balance
//     wins over affinity: the least-loaded worker is chosen (ties: fewest missing tokens);
//   * when no candidate is known to hold any of the documents, the document set is placed by
//     rendezvous (highest-random-weight) hashing, so that the first requests for one set
//     agree on a worker and adding or removing a worker moves few sets;
//   * a request without documents goes to the least-loaded worker.
//
// Documents are known by key: the document id when the request names one, else
// TextDocumentKey() of the text (the router computes no tokens); the ids that a worker
// returns for text documents are remembered as aliases of their text keys.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace lazyrag::router {

struct RoutingPolicyOptions {
  // Document tokens that one request of load is worth in the cost. Default 128 (a queued
  // request costs about as much as computing a 128-token document). 0 = pure affinity
  // below the imbalance threshold.
  double load_weight = 128;
  // Requests: when max load - min load among the candidates exceeds this, the least-loaded
  // worker wins whatever it holds. Default 8.
  int imbalance_threshold = 8;
  // Size assumed for a document known only by id whose size the router has not learned.
  // Default 512 tokens.
  int64_t default_document_tokens = 512;
  // Bytes per token used to estimate the size of a document given by text. Default 4.
  double bytes_per_token = 4;
  // Upper bound on remembered document keys (per worker, and for aliases and sizes); past it
  // the oldest knowledge is dropped. Default 1,000,000.
  size_t max_remembered_documents = 1000000;
};

// The affinity key of a document given by text: a digest of (cache namespace, text), with a
// "text:" prefix so that it never equals a document id.
std::string TextDocumentKey(std::string_view cache_namespace, std::string_view text);

// A request's document as the router sees it.
struct DocumentRef {
  std::string key;     // document id, or TextDocumentKey()
  int64_t tokens = 0;  // estimate; 0 = unknown (the policy uses what it learned, or a default)
};

// What a worker reported in Stats.
struct WorkerLoadReport {
  std::vector<std::string> resident_document_ids;
  int64_t running = 0;
  int64_t waiting = 0;
};

enum class RouteReason {
  kAffinity,     // lowest cost among workers that hold some of the documents
  kBalance,      // loads diverged past the threshold: least-loaded worker
  kHash,         // no residency known: rendezvous hash of the document set
  kLeastLoaded,  // no documents
};
std::string_view RouteReasonName(RouteReason reason);

struct RouteDecision {
  std::string worker;
  RouteReason reason = RouteReason::kLeastLoaded;
  int64_t document_tokens = 0;  // estimated tokens of all the request's documents
  int64_t missing_tokens = 0;   // ... of which the chosen worker is not known to hold
  // The chosen worker holds at least one of the documents.
  bool affinity_hit() const { return missing_tokens < document_tokens; }
};

// One worker as the policy sees it (for logs, metrics and tests).
struct WorkerView {
  std::string address;
  bool healthy = false;
  int64_t in_flight = 0;  // this router's requests on it
  int64_t load = 0;       // in_flight + others' running and waiting
  size_t known_documents = 0;
};

// Taken before asking a worker for Stats and handed back with its answer, so that knowledge
// the router gained while the Stats call was in flight is not lost, and the router's own
// in-flight requests are not counted twice.
struct StatsTicket {
  uint64_t sequence = 0;
  int64_t in_flight = 0;
};

// Codes a failed call may be retried on another worker with, when the worker sent nothing yet:
// UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED, UNKNOWN (transport errors), and CANCELLED when
// the client did not cancel (the worker shut down).
bool IsRetryableBeforeFirstToken(absl::StatusCode code, bool client_cancelled);

class RoutingPolicy {
 public:
  explicit RoutingPolicy(RoutingPolicyOptions options);
  RoutingPolicy(const RoutingPolicy&) = delete;
  RoutingPolicy& operator=(const RoutingPolicy&) = delete;

  const RoutingPolicyOptions& options() const { return options_; }

  // Replaces the set of workers ("HOST:PORT"). Workers that stay keep what is known of them;
  // new ones start healthy (a failed call or health check ejects them).
  void SetWorkers(const std::vector<std::string>& addresses);
  // Ejects (false) or readmits (true) a worker. Returns whether its state changed. Unknown
  // workers are ignored.
  bool SetHealthy(const std::string& worker, bool healthy);

  StatsTicket BeginStatsPoll(const std::string& worker) const;
  // The worker's resident documents replace what was known of it, except documents the
  // router sent there after `ticket` was taken.
  void UpdateStats(const std::string& worker, const StatsTicket& ticket,
                   const WorkerLoadReport& report);

  // Chooses a worker among the healthy ones not in `exclude` and counts the request in
  // flight there. UNAVAILABLE when there is none. Each successful Route() must be followed by
  // one Finish() for the same worker.
  absl::StatusOr<RouteDecision> Route(const std::vector<DocumentRef>& documents,
                                      const absl::flat_hash_set<std::string>& exclude = {});

  // Ends a request routed to `worker`. When `succeeded`, the worker now holds the documents.
  // `document_ids` (the worker's ids of the documents, in order; may be empty) become aliases
  // of the documents' keys.
  void Finish(const std::string& worker, const std::vector<DocumentRef>& documents, bool succeeded,
              const std::vector<std::string>& document_ids = {});

  // Remembers a document's size, learned from PrepareDocuments (key and id may be equal).
  void LearnDocumentTokens(const std::string& key, const std::string& id, int64_t tokens);

  std::vector<WorkerView> Workers() const;

 private:
  struct WorkerState {
    bool healthy = true;
    int64_t in_flight = 0;
    // running + waiting from the last Stats, less this router's requests in flight then.
    int64_t others_load = 0;
    // Document ids from the last Stats.
    absl::flat_hash_set<std::string> reported;
    // Keys (ids or text keys) the router sent here -> sequence number when learned.
    absl::flat_hash_map<std::string, uint64_t> learned;
  };

  int64_t LoadOf(const WorkerState& w) const { return w.in_flight + w.others_load; }
  bool Holds(const WorkerState& w, const std::string& key) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int64_t TokensOf(const DocumentRef& document) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void Learn(WorkerState& w, const std::string& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const RoutingPolicyOptions options_;
  mutable absl::Mutex mu_;
  uint64_t sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t round_robin_ ABSL_GUARDED_BY(mu_) = 0;
  // Ordered by address, for deterministic ties.
  std::vector<std::pair<std::string, WorkerState>> workers_ ABSL_GUARDED_BY(mu_);
  // Text key -> document id the workers gave it.
  absl::flat_hash_map<std::string, std::string> aliases_ ABSL_GUARDED_BY(mu_);
  // Key or id -> tokens learned from PrepareDocuments.
  absl::flat_hash_map<std::string, int64_t> tokens_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyrag::router
