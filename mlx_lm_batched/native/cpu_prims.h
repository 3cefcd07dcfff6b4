/* Our MLX primitives for the CPU backend (built into one extension module by
 * mlx_lm_batched/_cpu_prims.py; bindings in cpu_prims.cpp). */
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mlx/mlx.h"

namespace mx = mlx::core;

namespace mlxlmb {

/* The stream every primitive here runs on: the CPU's default. */
inline mx::Stream cpu_stream() {
  return mx::default_stream(mx::Device(mx::Device::cpu));
}

/* `a`'s elements in row-major order, copied into `scratch` (for inputs whose layout a
 * kernel cannot read in place). */
inline const float* row_major_copy(const mx::array& a, std::vector<float>& scratch) {
  scratch.resize(a.size());
  const float* src = a.data<float>();
  const int nd = a.ndim();
  std::vector<int> index(nd, 0);
  for (size_t i = 0; i < scratch.size(); i++) {
    int64_t off = 0;
    for (int d = 0; d < nd; d++) off += index[d] * a.strides()[d];
    scratch[i] = src[off];
    for (int d = nd - 1; d >= 0; d--) { /* next index, last axis fastest */
      if (++index[d] < a.shape(d)) break;
      index[d] = 0;
    }
  }
  return scratch.data();
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

/* x @ weight^T (+ bias) as MLX's Matmul/AddMM compute it, one node (linear.cpp). */
mx::array linear(const mx::array& x, const mx::array& weight, std::optional<mx::array> bias);
/* silu(gate) * up, elementwise, with layers/cpu_ops.py's exp (swiglu.cpp). */
mx::array swiglu(const mx::array& gate, const mx::array& up);

/* Whether cblas_sgemm is in the process's global symbol scope (linear.cpp). */
bool linear_available();

}  // namespace mlxlmb
