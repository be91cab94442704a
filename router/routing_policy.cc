#include "router/routing_policy.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/sha256.h"

namespace lazyrag::router {
namespace {

// FNV-1a, then a final avalanche (splitmix64). Stable across processes and builds, so that
// several router replicas place a document set on the same worker.
uint64_t StableHash(std::string_view data, uint64_t seed = 0) {
  uint64_t h = 0xcbf29ce484222325ull ^ seed;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  h += 0x9e3779b97f4a7c15ull;
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  return h ^ (h >> 31);
}

// Order-independent digest of a set of keys: a request's documents in another order, or
// repeated, are the same set.
uint64_t DocumentSetHash(const std::vector<DocumentRef>& documents) {
  std::vector<std::string_view> keys;
  keys.reserve(documents.size());
  for (const DocumentRef& d : documents) keys.push_back(d.key);
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  uint64_t h = 0;
  for (std::string_view k : keys) h = StableHash(k, h);
  return h;
}

}  // namespace

std::string TextDocumentKey(std::string_view cache_namespace, std::string_view text) {
  Sha256 hasher;
  hasher.Update(cache_namespace);
  hasher.Update(std::string_view("\0", 1));
  hasher.Update(text);
  return "text:" + ToHex(hasher.Finish());
}

std::string_view RouteReasonName(RouteReason reason) {
  switch (reason) {
    case RouteReason::kAffinity:
      return "affinity";
    case RouteReason::kBalance:
      return "balance";
    case RouteReason::kHash:
      return "hash";
    case RouteReason::kLeastLoaded:
      return "least_loaded";
  }
  return "unknown";
}

bool IsRetryableBeforeFirstToken(absl::StatusCode code, bool client_cancelled) {
  switch (code) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kUnknown:
      return !client_cancelled;
    case absl::StatusCode::kCancelled:
      return !client_cancelled;
    default:
      return false;
  }
}

RoutingPolicy::RoutingPolicy(RoutingPolicyOptions options) : options_(std::move(options)) {}

void RoutingPolicy::SetWorkers(const std::vector<std::string>& addresses) {
  std::vector<std::string> sorted = addresses;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, WorkerState>> next;
  next.reserve(sorted.size());
  for (const std::string& address : sorted) {
    auto it = std::find_if(workers_.begin(), workers_.end(),
                           [&](const auto& w) { return w.first == address; });
    if (it != workers_.end()) {
      next.push_back(std::move(*it));
    } else {
      next.emplace_back(address, WorkerState{});
    }
  }
  workers_ = std::move(next);
}

bool RoutingPolicy::SetHealthy(const std::string& worker, bool healthy) {
  absl::MutexLock lock(&mu_);
  for (auto& [address, state] : workers_) {
    if (address != worker) continue;
    bool changed = state.healthy != healthy;
    state.healthy = healthy;
    return changed;
  }
  return false;
}

StatsTicket RoutingPolicy::BeginStatsPoll(const std::string& worker) const {
  absl::MutexLock lock(&mu_);
  StatsTicket ticket;
  ticket.sequence = sequence_;
  for (const auto& [address, state] : workers_) {
    if (address == worker) ticket.in_flight = state.in_flight;
  }
  return ticket;
}

void RoutingPolicy::UpdateStats(const std::string& worker, const StatsTicket& ticket,
                                const WorkerLoadReport& report) {
  absl::MutexLock lock(&mu_);
  for (auto& [address, state] : workers_) {
    if (address != worker) continue;
    // The report counts this router's requests that reached the worker. Those in flight when
    // the poll started or when it ended bound them; taking the larger keeps a burst of requests
    // routed during the poll from being counted twice.
    const int64_t own = std::max(ticket.in_flight, state.in_flight);
    state.others_load = std::max<int64_t>(0, report.running + report.waiting - own);
    state.reported.clear();
    size_t limit = std::min(report.resident_document_ids.size(), options_.max_remembered_documents);
    for (size_t i = 0; i < limit; ++i) state.reported.insert(report.resident_document_ids[i]);
    // What the router sent before the poll is now either in the report or was evicted.
    absl::erase_if(state.learned,
                   [&](const auto& entry) { return entry.second <= ticket.sequence; });
    return;
  }
}

bool RoutingPolicy::Holds(const WorkerState& w, const std::string& key) const {
  if (w.reported.contains(key) || w.learned.contains(key)) return true;
  auto alias = aliases_.find(key);
  if (alias == aliases_.end()) return false;
  return w.reported.contains(alias->second) || w.learned.contains(alias->second);
}

int64_t RoutingPolicy::TokensOf(const DocumentRef& document) const {
  auto it = tokens_.find(document.key);
  if (it != tokens_.end()) return it->second;
  if (auto alias = aliases_.find(document.key); alias != aliases_.end()) {
    it = tokens_.find(alias->second);
    if (it != tokens_.end()) return it->second;
  }
  if (document.tokens > 0) return document.tokens;
  return options_.default_document_tokens;
}

void RoutingPolicy::Learn(WorkerState& w, const std::string& key) {
  w.learned[key] = ++sequence_;
  if (w.learned.size() <= options_.max_remembered_documents) return;
  // Drop the older half.
  std::vector<uint64_t> sequences;
  sequences.reserve(w.learned.size());
  for (const auto& entry : w.learned) sequences.push_back(entry.second);
  auto middle = sequences.begin() + sequences.size() / 2;
  std::nth_element(sequences.begin(), middle, sequences.end());
  uint64_t cutoff = *middle;
  absl::erase_if(w.learned, [&](const auto& entry) { return entry.second < cutoff; });
}

absl::StatusOr<RouteDecision> RoutingPolicy::Route(
    const std::vector<DocumentRef>& documents, const absl::flat_hash_set<std::string>& exclude) {
  absl::MutexLock lock(&mu_);
  struct Candidate {
    WorkerState* state;
    const std::string* address;
    int64_t load;
    int64_t missing;
  };
  std::vector<Candidate> candidates;
  int64_t document_tokens = 0;
  std::vector<int64_t> tokens;
  tokens.reserve(documents.size());
  for (const DocumentRef& d : documents) {
    tokens.push_back(TokensOf(d));
    document_tokens += tokens.back();
  }
  bool any_resident = false;
  for (auto& [address, state] : workers_) {
    if (!state.healthy || exclude.contains(address)) continue;
    Candidate c{&state, &address, LoadOf(state), 0};
    for (size_t i = 0; i < documents.size(); ++i) {
      if (Holds(state, documents[i].key)) {
        any_resident = true;
      } else {
        c.missing += tokens[i];
      }
    }
    candidates.push_back(c);
  }
  if (candidates.empty()) {
    if (workers_.empty()) return absl::UnavailableError("no workers known");
    return absl::UnavailableError(
        exclude.empty() ? "no healthy worker"
                        : "no healthy worker left to try (the others failed this request)");
  }

  int64_t min_load = std::numeric_limits<int64_t>::max();
  int64_t max_load = 0;
  for (const Candidate& c : candidates) {
    min_load = std::min(min_load, c.load);
    max_load = std::max(max_load, c.load);
  }
  const uint64_t set_hash = DocumentSetHash(documents);
  auto hash_rank = [&](const Candidate& c) { return StableHash(*c.address, set_hash); };

  const Candidate* chosen = nullptr;
  RouteReason reason;
  if (documents.empty()) {
    // Least loaded; ties rotate so that idle workers share the work.
    reason = RouteReason::kLeastLoaded;
    std::vector<const Candidate*> least;
    for (const Candidate& c : candidates) {
      if (c.load == min_load) least.push_back(&c);
    }
    chosen = least[round_robin_++ % least.size()];
  } else if (max_load - min_load > options_.imbalance_threshold) {
    reason = RouteReason::kBalance;
    for (const Candidate& c : candidates) {
      if (c.load != min_load) continue;
      if (chosen == nullptr || c.missing < chosen->missing ||
          (c.missing == chosen->missing && hash_rank(c) > hash_rank(*chosen))) {
        chosen = &c;
      }
    }
  } else if (!any_resident) {
    reason = RouteReason::kHash;
    for (const Candidate& c : candidates) {
      if (chosen == nullptr || hash_rank(c) > hash_rank(*chosen)) chosen = &c;
    }
  } else {
    reason = RouteReason::kAffinity;
    auto cost = [&](const Candidate& c) {
      return static_cast<double>(c.missing) + options_.load_weight * static_cast<double>(c.load);
    };
    for (const Candidate& c : candidates) {
      if (chosen == nullptr || cost(c) < cost(*chosen) ||
          (cost(c) == cost(*chosen) &&
           (c.missing < chosen->missing ||
            (c.missing == chosen->missing && hash_rank(c) > hash_rank(*chosen))))) {
        chosen = &c;
      }
    }
  }

  chosen->state->in_flight++;
  RouteDecision decision;
  decision.worker = *chosen->address;
  decision.reason = reason;
  decision.document_tokens = document_tokens;
  decision.missing_tokens = chosen->missing;
  return decision;
}

void RoutingPolicy::Finish(const std::string& worker, const std::vector<DocumentRef>& documents,
                           bool succeeded, const std::vector<std::string>& document_ids) {
  absl::MutexLock lock(&mu_);
  const bool ids_match = document_ids.size() == documents.size();
  if (ids_match) {
    for (size_t i = 0; i < documents.size(); ++i) {
      if (documents[i].key == document_ids[i]) continue;
      if (aliases_.size() >= options_.max_remembered_documents) aliases_.clear();
      aliases_[documents[i].key] = document_ids[i];
    }
  }
  for (auto& [address, state] : workers_) {
    if (address != worker) continue;
    if (state.in_flight > 0) state.in_flight--;
    if (!succeeded) return;
    for (size_t i = 0; i < documents.size(); ++i) {
      Learn(state, documents[i].key);
      if (ids_match) Learn(state, document_ids[i]);
    }
    return;
  }
}

void RoutingPolicy::LearnDocumentTokens(const std::string& key, const std::string& id,
                                        int64_t tokens) {
  if (tokens <= 0) return;
  absl::MutexLock lock(&mu_);
  if (tokens_.size() + 2 > options_.max_remembered_documents) tokens_.clear();
  tokens_[key] = tokens;
  tokens_[id] = tokens;
  if (key != id) {
    if (aliases_.size() >= options_.max_remembered_documents) aliases_.clear();
    aliases_[key] = id;
  }
}

std::vector<WorkerView> RoutingPolicy::Workers() const {
  absl::MutexLock lock(&mu_);
  std::vector<WorkerView> out;
  out.reserve(workers_.size());
  for (const auto& [address, state] : workers_) {
    WorkerView v;
    v.address = address;
    v.healthy = state.healthy;
    v.in_flight = state.in_flight;
    v.load = LoadOf(state);
    v.known_documents = state.reported.size() + state.learned.size();
    out.push_back(std::move(v));
  }
  return out;
}

}  // namespace lazyrag::router
