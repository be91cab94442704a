#include "common/parallel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>
#include <vector>

namespace lazyrag {
namespace {

thread_local bool t_in_pool = false;

class Pool {
 public:
  explicit Pool(int n) {
    for (int i = 0; i < n; ++i) {
      threads_.emplace_back([this] {
        t_in_pool = true;
        for (;;) {
          std::function<void()> task;
          {
            std::unique_lock<std::mutex> lock(mu_);
            cv_.wait(lock, [this] { return stop_ || !tasks_.empty(); });
            if (stop_ && tasks_.empty()) return;
            task = std::move(tasks_.front());
            tasks_.pop_front();
          }
          task();
        }
      });
    }
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
  }
  void Submit(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  bool stop_ = false;
};

Pool& GlobalPool() {
  static Pool* pool = new Pool(std::max(0, NumWorkerThreads() - 1));  // caller runs one chunk
  return *pool;
}

}  // namespace

int NumWorkerThreads() {
  static int n = [] {
    if (const char* env = std::getenv("LAZYRAG_NUM_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return v;
    }
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }();
  return n;
}

void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  int64_t threads = NumWorkerThreads();
  int64_t chunks = std::min<int64_t>(threads, (n + std::max<int64_t>(1, min_chunk) - 1) /
                                                  std::max<int64_t>(1, min_chunk));
  if (chunks <= 1 || t_in_pool) {
    fn(0, n);
    return;
  }
  int64_t per = (n + chunks - 1) / chunks;
  // `remaining` is only touched under `mu`, and a worker notifies while holding it, so the
  // caller cannot return (destroying mu and cv) while a worker still uses them.
  int64_t remaining = chunks - 1;
  std::mutex mu;
  std::condition_variable cv;
  for (int64_t c = 1; c < chunks; ++c) {
    int64_t b = c * per, e = std::min(n, b + per);
    GlobalPool().Submit([&, b, e] {
      if (b < e) fn(b, e);
      std::lock_guard<std::mutex> lock(mu);
      if (--remaining == 0) cv.notify_all();
    });
  }
  fn(0, std::min(n, per));
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return remaining == 0; });
}

}  // namespace lazyrag
