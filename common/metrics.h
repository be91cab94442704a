// A small Prometheus metrics registry shaped like prometheus-cpp: a Registry owns Families of
// Counters, Gauges or Histograms; a Family holds one metric per label set. Serialize() writes
// the text exposition format 0.0.4 that /metrics serves (common/metrics_http.h).
//
// Thread safety: everything here is safe to call from any thread. References returned by
// Add*() and Family::Add() stay valid for the lifetime of the Registry.
//
// Names: metric names must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*
// and not start with "__"; "le" is reserved for histogram buckets. Names are code constants,
// so an invalid one is a programming error: it is logged and its bad characters become '_'.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lazyrag::metrics {

// Label name -> value. Ordered, so a label set has one canonical form.
using Labels = std::map<std::string, std::string>;

// A value that only goes up (requests, bytes, evictions).
class Counter {
 public:
  // REQUIRES: delta >= 0 (negative deltas are ignored).
  void Increment(double delta = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (entries, bytes held, queue length).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double delta = 1.0) { value_.fetch_add(delta, std::memory_order_relaxed); }
  void Decrement(double delta = 1.0) { value_.fetch_sub(delta, std::memory_order_relaxed); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Observations counted into buckets with fixed upper bounds (seconds for latencies).
class Histogram {
 public:
  struct Snapshot {
    std::vector<double> bounds;        // finite upper bounds, ascending
    std::vector<uint64_t> cumulative;  // bounds.size() + 1 entries; the last is +Inf
    uint64_t count = 0;                // == cumulative.back()
    double sum = 0.0;
  };

  // `bounds`: upper bounds; sorted and de-duplicated here, non-finite ones dropped.
  explicit Histogram(std::vector<double> bounds);

  void Observe(double value);
  Snapshot Collect() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);  // per bucket, not cumulative
  double sum_ ABSL_GUARDED_BY(mu_) = 0.0;
};

// 0.005 s .. 10 s, Prometheus' default latency buckets.
std::vector<double> DefaultLatencyBuckets();
// start, start*factor, ..., `count` bounds. REQUIRES: start > 0, factor > 1.
std::vector<double> ExponentialBuckets(double start, double factor, int count);

enum class MetricType { kCounter, kGauge, kHistogram };

// Type-erased part of a Family, used by the Registry to serialize.
class FamilyBase {
 public:
  FamilyBase(std::string name, std::string help, MetricType type)
      : name_(std::move(name)), help_(std::move(help)), type_(type) {}
  virtual ~FamilyBase() = default;
  FamilyBase(const FamilyBase&) = delete;
  FamilyBase& operator=(const FamilyBase&) = delete;

  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }

  // Appends "# HELP", "# TYPE" and one sample line per metric (several for histograms).
  virtual void Serialize(std::string* out) const = 0;

 private:
  const std::string name_;
  const std::string help_;
  const MetricType type_;
};

template <typename T>
class Family final : public FamilyBase {
 public:
  Family(std::string name, std::string help, std::vector<double> bucket_bounds = {});

  // Returns the metric for `labels`, creating it (at zero) on first use.
  T& Add(const Labels& labels = {});

  void Serialize(std::string* out) const override;

 private:
  static MetricType TypeOf();

  const std::vector<double> bucket_bounds_;  // histograms only
  mutable absl::Mutex mu_;
  std::map<Labels, std::unique_ptr<T>> metrics_ ABSL_GUARDED_BY(mu_);
};

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Each returns the family called `name`, creating it on first use. Asking again for an
  // existing name with the same type returns the existing family (its help and buckets
  // stay); asking with another type logs an error and returns a family that is not exported.
  Family<Counter>& AddCounter(std::string_view name, std::string_view help);
  Family<Gauge>& AddGauge(std::string_view name, std::string_view help);
  Family<Histogram>& AddHistogram(std::string_view name, std::string_view help,
                                  std::vector<double> bucket_bounds = DefaultLatencyBuckets());

  // Text exposition format 0.0.4, families in registration order.
  std::string Serialize() const;

 private:
  template <typename T>
  Family<T>& AddFamily(std::string_view name, std::string_view help,
                       std::vector<double> bucket_bounds);

  mutable absl::Mutex mu_;
  std::vector<std::unique_ptr<FamilyBase>> families_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<FamilyBase>> detached_ ABSL_GUARDED_BY(mu_);
};

// The process metrics of the Prometheus client libraries' conventions, read from /proc/self
// (Linux; elsewhere nothing is appended): process_cpu_seconds_total,
// process_resident_memory_bytes, process_virtual_memory_bytes, process_open_fds,
// process_max_fds, process_start_time_seconds. MetricsHttpServer appends them to every /metrics
// answer, so every server exports them.
void AppendProcessMetrics(std::string* out);

// lazyrag_build_info{version, commit} 1, from SetBuildInfo ("unknown" before it: the binaries
// set it from common/build_info.h when they parse their flags). Also appended to every /metrics
// answer. Thread-safe.
void SetBuildInfo(std::string_view version, std::string_view commit);
void AppendBuildInfo(std::string* out);

// Exposed for tests.
namespace internal {
std::string FormatValue(double value);  // shortest round-trip form, "+Inf", "-Inf", "NaN"
std::string EscapeLabelValue(std::string_view value);
std::string EscapeHelp(std::string_view help);
}  // namespace internal

}  // namespace lazyrag::metrics
