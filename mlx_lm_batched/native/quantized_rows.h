/* A decode step's rows of quantized_linear by an instruction-set specific kernel
 * (quantized_rows_avx2.cpp; the arrays taken apart in quantized_rows.cpp), and the
 * conversions quantized_linear.cpp shares with them. */
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_prims.h"

namespace mlxlmb {

enum class ScaleType { float32, float16, bfloat16 };

/* x (M, K) float32 row-major times the affine-quantized weight (N, K) transposed, plus
 * bias, into out (M, N) row-major. Weight, scales and biases row-major; scales and biases
 * of one dtype, `scale_type`, read as they are stored. */
struct QuantizedRows {
  int M, N, K, bits, group;
  const float* x;
  const uint32_t* w;       // (N, K * bits / 32)
  const void* scales;      // (N, K / group)
  const void* biases;      // (N, K / group)
  ScaleType scale_type;
  const float* bias;       // (N,) or null
  float* out;
};

/* Computes `p` on `threads` threads and returns true, or returns false (nothing done)
 * where this build's kernel does not serve it (no AVX2 build, a width other than 4, 5 or
 * 8 bits). */
bool quantized_rows_fast(const QuantizedRows& p, int threads);

/* quantized_linear's inputs (x, w, scales, biases[, bias]) into `out` (allocated) by
 * quantized_rows_fast: true, or false with nothing done where it does not serve them. */
bool fast_rows(const std::vector<mx::array>& inputs, mx::array& out, int M, int N, int K,
               int group, int bits);

/* A float32, float16 or bfloat16 array as row-major float32 (`row_major`: in place for
 * row-contiguous float32, else converted into `scratch`). */
inline const float* float_rows(const mx::array& a, std::vector<float>& scratch) {
  if (a.dtype() == mx::float16) return row_major<float, mx::float16_t>(a, scratch);
  if (a.dtype() == mx::bfloat16) return row_major<float, mx::bfloat16_t>(a, scratch);
  return row_major(a, scratch);
}

/* The float32 results `y` into a float16 or bfloat16 output, rounded once. */
inline void store_half(mx::array& out, const std::vector<float>& y) {
  if (out.dtype() == mx::float16)
    for (size_t i = 0; i < y.size(); i++) out.data<mx::float16_t>()[i] = y[i];
  else if (out.dtype() == mx::bfloat16)
    for (size_t i = 0; i < y.size(); i++) out.data<mx::bfloat16_t>()[i] = y[i];
}

}  // namespace mlxlmb
