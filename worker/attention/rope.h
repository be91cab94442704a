// RoPE in the rotate-half layout (Hugging Face): within a head of dimension D, feature i pairs
// with feature i + D/2 and rotates by angle pos * inv_freq[i], i < D/2.
#pragma once

#include <cmath>
#include <vector>

#include "worker/model/config.h"

namespace lazyrag {

// inv_freq[i] = theta^(-2i/D), with Llama-3 frequency scaling when configured.
inline std::vector<float> RopeInvFreq(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<float> inv(half);
  for (int i = 0; i < half; ++i) {
    double f = std::pow(double(c.rope_theta), -2.0 * i / c.head_dim);
    if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
      const auto& s = c.rope_scaling;
      double low_wavelen = s.original_max_position / s.low_freq_factor;
      double high_wavelen = s.original_max_position / s.high_freq_factor;
      double wavelen = 2.0 * M_PI / f;
      if (wavelen > low_wavelen) {
        f = f / s.factor;
      } else if (wavelen >= high_wavelen) {
        double smooth = (s.original_max_position / wavelen - s.low_freq_factor) /
                        (s.high_freq_factor - s.low_freq_factor);
        f = (1.0 - smooth) * f / s.factor + smooth * f;
      }
    }
    inv[i] = static_cast<float>(f);
  }
  return inv;
}

// Rotates x[0..D) in place by `pos` (may be negative: the inverse rotation).
// Angles are computed in double so that large positions keep fp32 accuracy.
inline void RopeRotate(float* x, int head_dim, const float* inv_freq, double pos) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    double a = pos * double(inv_freq[i]);
    float c = static_cast<float>(std::cos(a)), s = static_cast<float>(std::sin(a));
    float x0 = x[i], x1 = x[i + half];
    x[i] = x0 * c - x1 * s;
    x[i + half] = x1 * c + x0 * s;
  }
}

}  // namespace lazyrag
