// absl::Mutex with and without its deadlock detection, the setting the server binaries change
// (common/server_main.h). Debian builds absl without NDEBUG, so detection is on by default and
// every lock goes through one process-wide lock-order graph. Two single-thread loops, nanoseconds
// per iteration, median of 5 rounds of 200,000:
//   * a mutex created, locked, unlocked and destroyed (a graph node added and removed);
//   * two mutexes locked nested and unlocked (an edge checked in the graph).
// Then the same with 4 threads, each on its own mutexes (the graph's lock is shared by all).
//
//   mutex_cost [--out FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/json.h"

namespace {

constexpr int kIterations = 200000;
constexpr int kRounds = 5;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Nanoseconds per iteration of `body` run by `threads` threads at once (the slowest thread).
template <typename Body>
double TimeLoop(int threads, Body body) {
  std::vector<double> rounds;
  for (int r = 0; r < kRounds; ++r) {
    std::vector<double> ns(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const auto t0 = std::chrono::steady_clock::now();
        body();
        ns[t] = std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0)
                    .count() /
                kIterations;
      });
    }
    for (std::thread& th : pool) th.join();
    rounds.push_back(*std::max_element(ns.begin(), ns.end()));
  }
  return Median(rounds);
}

void CreateLockDestroy() {
  for (int i = 0; i < kIterations; ++i) {
    auto m = std::make_unique<absl::Mutex>();
    m->Lock();
    m->Unlock();
  }
}

void NestedPair() {
  absl::Mutex a, b;
  for (int i = 0; i < kIterations; ++i) {
    a.Lock();
    b.Lock();
    b.Unlock();
    a.Unlock();
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--out") == 0) out = argv[i + 1];
  }
  lazyrag::Json j = lazyrag::Json::object();
  j["benchmark"] = "mutex_cost";
  j["rows"] = lazyrag::Json::array();
  std::printf("%-28s %8s %12s %12s\n", "loop", "threads", "detect ns", "ignore ns");
  for (int threads : {1, 4}) {
    for (const auto& [name, body] :
         {std::pair<const char*, void (*)()>{"create+lock+destroy", CreateLockDestroy},
          std::pair<const char*, void (*)()>{"nested lock pair", NestedPair}}) {
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kAbort);
      const double detect = TimeLoop(threads, body);
      absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
      const double ignore = TimeLoop(threads, body);
      std::printf("%-28s %8d %12.1f %12.1f\n", name, threads, detect, ignore);
      j["rows"].push_back(
          {{"loop", name}, {"threads", threads}, {"detect_ns", detect}, {"ignore_ns", ignore}});
    }
  }
  if (!out.empty()) std::ofstream(out) << j.dump(2) << "\n";
  return 0;
}
