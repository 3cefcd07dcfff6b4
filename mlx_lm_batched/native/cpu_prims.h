/* Our MLX primitives for the CPU backend (built into one extension module by
 * mlx_lm_batched/_cpu_prims.py; bindings in cpu_prims.cpp). */
#pragma once

#include <optional>

#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace mlxlmb {

/* The stream every primitive here runs on: the CPU's default. */
inline mx::Stream cpu_stream() {
  return mx::default_stream(mx::Device(mx::Device::cpu));
}

/* softmax(q k^T * scale) v for one query per row (decode_attention.cpp). */
mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, std::optional<mx::array> mask);
/* Threads decode_attention's tasks are split over. */
void set_attention_threads(int threads);

/* x * rsqrt(mean(x^2) + eps) * weight over the last axis (norm_rope.cpp). */
mx::array rms_norm(const mx::array& x, std::optional<mx::array> weight, float eps);
/* Rotary embedding of the first `dims` features of x (B, ..., L, D), position of column l
 * of row b: offset[b] + l, times `scale` (norm_rope.cpp). */
mx::array rope(const mx::array& x, int dims, bool traditional, const mx::array& inv_freq,
               float scale, const mx::array& offset);

}  // namespace mlxlmb
