// Repeated timings of one benchmark quantity (ttft_bench, tp_bench): median, min, max and the
// JSON object they write.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lazyrag::bench {

struct Stats {
  std::vector<double> ms;
  double Median() const {
    if (ms.empty()) return 0;
    std::vector<double> s = ms;
    std::sort(s.begin(), s.end());
    return s.size() % 2 ? s[s.size() / 2] : 0.5 * (s[s.size() / 2 - 1] + s[s.size() / 2]);
  }
  double Min() const { return ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end()); }
  double Max() const { return ms.empty() ? 0 : *std::max_element(ms.begin(), ms.end()); }
  std::string Json() const {
    std::string all;
    for (double v : ms) absl::StrAppend(&all, all.empty() ? "" : ", ", v);
    return absl::StrCat("{\"median\": ", Median(), ", \"min\": ", Min(), ", \"max\": ", Max(),
                        ", \"all\": [", all, "]}");
  }
};

}  // namespace lazyrag::bench
