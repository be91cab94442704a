#include "common/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#if defined(__linux__)
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include "common/logging.h"

namespace lazyrag::metrics {
namespace {

bool IsNameChar(char c, bool first, bool allow_colon) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') return true;
  if (allow_colon && c == ':') return true;
  return !first && c >= '0' && c <= '9';
}

// Returns `name` with every character that may not appear replaced by '_'.
std::string SanitizeName(std::string_view name, bool allow_colon, std::string_view what) {
  std::string out = name.empty() ? std::string(1, '_') : std::string(name);
  bool changed = name.empty();
  for (size_t i = 0; i < out.size(); ++i) {
    if (!IsNameChar(out[i], i == 0, allow_colon)) {
      out[i] = '_';
      changed = true;
    }
  }
  if (changed) {
    LOG_ERROR << "metrics: invalid " << what << " name '" << name << "'; using " << out;
  }
  return out;
}

Labels SanitizeLabels(const Labels& labels, bool histogram) {
  Labels out;
  for (const auto& [name, value] : labels) {
    std::string n = SanitizeName(name, /*allow_colon=*/false, "label");
    if (n.rfind("__", 0) == 0 || (histogram && n == "le")) {
      LOG_ERROR << "metrics: reserved label name '" << n << "'";
      n = "x" + n;
    }
    out[n] = value;
  }
  return out;
}

void AppendLabels(const Labels& labels, std::string_view extra_name, std::string_view extra_value,
                  std::string* out) {
  if (labels.empty() && extra_name.empty()) return;
  out->push_back('{');
  bool first = true;
  for (const auto& [name, value] : labels) {
    if (!first) out->push_back(',');
    first = false;
    out->append(name).append("=\"").append(internal::EscapeLabelValue(value)).push_back('"');
  }
  if (!extra_name.empty()) {
    if (!first) out->push_back(',');
    out->append(extra_name).append("=\"").append(extra_value).push_back('"');
  }
  out->push_back('}');
}

void AppendSample(std::string_view name, const Labels& labels, std::string_view extra_name,
                  std::string_view extra_value, double value, std::string* out) {
  out->append(name);
  AppendLabels(labels, extra_name, extra_value, out);
  out->push_back(' ');
  out->append(internal::FormatValue(value));
  out->push_back('\n');
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

void AppendHeader(const FamilyBase& family, std::string* out) {
  out->append("# HELP ").append(family.name()).push_back(' ');
  out->append(internal::EscapeHelp(family.help())).push_back('\n');
  out->append("# TYPE ").append(family.name()).push_back(' ');
  out->append(TypeName(family.type())).push_back('\n');
}

std::vector<double> CleanBounds(std::vector<double> bounds) {
  bounds.erase(
      std::remove_if(bounds.begin(), bounds.end(), [](double b) { return !std::isfinite(b); }),
      bounds.end());
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

}  // namespace

namespace internal {

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buf[64];
  // Whole numbers (counts, bytes) print as integers: 3000000, not 3e+06.
  if (value == std::trunc(value) && std::fabs(value) < 1e15) {
    auto result = std::to_chars(buf, buf + sizeof(buf), static_cast<int64_t>(value));
    return std::string(buf, result.ptr);
  }
  auto result = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, result.ptr);
}

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out.push_back(c);
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace internal

void Counter::Increment(double delta) {
  if (!(delta >= 0)) return;
  value_.fetch_add(delta, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(CleanBounds(std::move(bounds))), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  // Bucket i counts values <= bounds_[i]; the last counts the rest (+Inf).
  size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
}

Histogram::Snapshot Histogram::Collect() const {
  Snapshot s;
  s.bounds = bounds_;
  absl::MutexLock lock(&mu_);
  s.cumulative.resize(counts_.size());
  uint64_t running = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    running += counts_[i];
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_;
  return s;
}

std::vector<double> DefaultLatencyBuckets() {
  return {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
}

std::vector<double> ExponentialBuckets(double start, double factor, int count) {
  std::vector<double> out;
  double b = start;
  for (int i = 0; i < count; ++i, b *= factor) out.push_back(b);
  return out;
}

template <typename T>
Family<T>::Family(std::string name, std::string help, std::vector<double> bucket_bounds)
    : FamilyBase(std::move(name), std::move(help), TypeOf()),
      bucket_bounds_(std::move(bucket_bounds)) {}

template <>
MetricType Family<Counter>::TypeOf() {
  return MetricType::kCounter;
}
template <>
MetricType Family<Gauge>::TypeOf() {
  return MetricType::kGauge;
}
template <>
MetricType Family<Histogram>::TypeOf() {
  return MetricType::kHistogram;
}

template <typename T>
T& Family<T>::Add(const Labels& labels) {
  Labels clean = SanitizeLabels(labels, TypeOf() == MetricType::kHistogram);
  absl::MutexLock lock(&mu_);
  auto it = metrics_.find(clean);
  if (it != metrics_.end()) return *it->second;
  std::unique_ptr<T> metric;
  if constexpr (std::is_same_v<T, Histogram>) {
    metric = std::make_unique<Histogram>(bucket_bounds_);
  } else {
    metric = std::make_unique<T>();
  }
  T& ref = *metric;
  metrics_.emplace(std::move(clean), std::move(metric));
  return ref;
}

template <typename T>
void Family<T>::Serialize(std::string* out) const {
  AppendHeader(*this, out);
  absl::MutexLock lock(&mu_);
  for (const auto& [labels, metric] : metrics_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      Histogram::Snapshot s = metric->Collect();
      const std::string bucket_name = name() + "_bucket";
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        AppendSample(bucket_name, labels, "le", internal::FormatValue(s.bounds[i]),
                     static_cast<double>(s.cumulative[i]), out);
      }
      AppendSample(bucket_name, labels, "le", "+Inf", static_cast<double>(s.count), out);
      AppendSample(name() + "_sum", labels, "", "", s.sum, out);
      AppendSample(name() + "_count", labels, "", "", static_cast<double>(s.count), out);
    } else {
      AppendSample(name(), labels, "", "", metric->Value(), out);
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

template <typename T>
Family<T>& Registry::AddFamily(std::string_view name, std::string_view help,
                               std::vector<double> bucket_bounds) {
  std::string clean = SanitizeName(name, /*allow_colon=*/true, "metric");
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) {
    if (family->name() != clean) continue;
    if (auto* same = dynamic_cast<Family<T>*>(family.get())) return *same;
    LOG_ERROR << "metrics: '" << clean << "' registered again with another type; not exported";
    detached_.push_back(
        std::make_unique<Family<T>>(clean, std::string(help), std::move(bucket_bounds)));
    return static_cast<Family<T>&>(*detached_.back());
  }
  families_.push_back(
      std::make_unique<Family<T>>(std::move(clean), std::string(help), std::move(bucket_bounds)));
  return static_cast<Family<T>&>(*families_.back());
}

Family<Counter>& Registry::AddCounter(std::string_view name, std::string_view help) {
  return AddFamily<Counter>(name, help, {});
}

Family<Gauge>& Registry::AddGauge(std::string_view name, std::string_view help) {
  return AddFamily<Gauge>(name, help, {});
}

Family<Histogram>& Registry::AddHistogram(std::string_view name, std::string_view help,
                                          std::vector<double> bucket_bounds) {
  return AddFamily<Histogram>(name, help, CleanBounds(std::move(bucket_bounds)));
}

std::string Registry::Serialize() const {
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& family : families_) family->Serialize(&out);
  return out;
}

namespace {

void AppendSample(std::string* out, const char* name, const char* type, const char* help,
                  double value) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
  out->append(name).append(" ").append(internal::FormatValue(value)).append("\n");
}

}  // namespace

void AppendProcessMetrics(std::string* out) {
#if defined(__linux__)
  const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  std::ifstream stat_file("/proc/self/stat");
  std::string stat((std::istreambuf_iterator<char>(stat_file)), std::istreambuf_iterator<char>());
  // Fields after the command name, which is in parentheses and may hold spaces: field 3 on.
  const size_t paren = stat.rfind(')');
  if (paren != std::string::npos && ticks > 0) {
    std::istringstream fields(stat.substr(paren + 2));
    std::vector<std::string> f;
    for (std::string x; fields >> x;) f.push_back(x);
    // f[0] is field 3 (state): field N is f[N - 3].
    if (f.size() > 21) {
      const double utime = std::strtod(f[14 - 3].c_str(), nullptr);
      const double stime = std::strtod(f[15 - 3].c_str(), nullptr);
      const double start_ticks = std::strtod(f[22 - 3].c_str(), nullptr);
      const double vsize = std::strtod(f[23 - 3].c_str(), nullptr);
      const double rss_pages = std::strtod(f[24 - 3].c_str(), nullptr);
      AppendSample(out, "process_cpu_seconds_total", "counter",
                   "Total user and system CPU time spent in seconds.", (utime + stime) / ticks);
      AppendSample(out, "process_resident_memory_bytes", "gauge",
                   "Resident memory size in bytes.", rss_pages * page);
      AppendSample(out, "process_virtual_memory_bytes", "gauge",
                   "Virtual memory size in bytes.", vsize);
      double boot_time = -1;
      std::ifstream proc_stat("/proc/stat");
      for (std::string line; std::getline(proc_stat, line);) {
        if (line.rfind("btime ", 0) == 0) {
          boot_time = std::strtod(line.c_str() + 6, nullptr);
          break;
        }
      }
      if (boot_time >= 0) {
        AppendSample(out, "process_start_time_seconds", "gauge",
                     "Start time of the process since unix epoch in seconds.",
                     boot_time + start_ticks / ticks);
      }
    }
  }
  if (DIR* dir = opendir("/proc/self/fd")) {
    int fds = 0;
    while (const dirent* e = readdir(dir)) {
      if (e->d_name[0] != '.') ++fds;
    }
    closedir(dir);
    AppendSample(out, "process_open_fds", "gauge", "Number of open file descriptors.",
                 fds - 1);  // less the one reading the directory
  }
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    AppendSample(out, "process_max_fds", "gauge", "Maximum number of open file descriptors.",
                 limit.rlim_cur == RLIM_INFINITY ? INFINITY : static_cast<double>(limit.rlim_cur));
  }
#else
  (void)out;
#endif
}

namespace {
absl::Mutex build_info_mu;
std::string* build_version ABSL_GUARDED_BY(build_info_mu) = nullptr;
std::string* build_commit ABSL_GUARDED_BY(build_info_mu) = nullptr;
}  // namespace

void SetBuildInfo(std::string_view version, std::string_view commit) {
  absl::MutexLock l(&build_info_mu);
  delete build_version;
  delete build_commit;
  build_version = new std::string(version);
  build_commit = new std::string(commit);
}

void AppendBuildInfo(std::string* out) {
  std::string version = "unknown", commit = "unknown";
  {
    absl::MutexLock l(&build_info_mu);
    if (build_version != nullptr && !build_version->empty()) version = *build_version;
    if (build_commit != nullptr && !build_commit->empty()) commit = *build_commit;
  }
  out->append("# HELP lazyrag_build_info The version and commit the server was built from.\n");
  out->append("# TYPE lazyrag_build_info gauge\n");
  out->append("lazyrag_build_info{version=\"")
      .append(internal::EscapeLabelValue(version))
      .append("\",commit=\"")
      .append(internal::EscapeLabelValue(commit))
      .append("\"} 1\n");
}

}  // namespace lazyrag::metrics
