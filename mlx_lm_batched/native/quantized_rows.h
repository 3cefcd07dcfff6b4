/* A decode step's rows of quantized_linear by an instruction-set specific kernel
 * (quantized_rows_avx2.cpp; the arrays taken apart in quantized_rows.cpp). The float
 * conversions they share with the other primitives are cpu_prims.h's. */
#pragma once

#include <cstdint>
#include <vector>

#include "cpu_prims.h"

namespace mlxlmb {

/* Rows up to which the decode kernels serve (quantized_rows_fast and the portable tiled
 * kernel): the tiled kernel ran at 0.9-1.2x the dequantize-and-BLAS path at 64 rows and
 * 0.6-0.8x at 256 (2-core AMD EPYC, OpenBLAS), and both are batch-invariant. */
constexpr int SMALL_ROWS = 64;

/* x (M, K) float32 row-major times the affine-quantized weight (N, K) transposed, plus
 * bias, into out (M, N) row-major. Weight, scales and biases row-major; scales and biases
 * of one dtype, `scale_type`, read as they are stored. */
struct QuantizedRows {
  int M, N, K, bits, group;
  const float* x;
  const uint32_t* w;       // (N, K * bits / 32)
  const void* scales;      // (N, K / group)
  const void* biases;      // (N, K / group)
  FloatType scale_type;
  const float* bias;       // (N,) or null
  float* out;
};

/* Computes every layer of `parts` (`count` of them, one input: the same M, K and x, one
 * width, group and scale dtype) on `threads` threads in one parallel region, each output
 * with the bits it gets alone, and returns true; or returns false (nothing done) where
 * this build's kernel does not serve them (no AVX2 build, a width other than 4, 5 or 8
 * bits, layers that differ in those). */
bool quantized_rows_fast(const QuantizedRows* parts, int count, int threads);

/* Layers' arrays (each `w, scales, biases[, bias]`) against one input x (M, K) into
 * `outs` (allocated) by quantized_rows_fast: true, or false with nothing done where it
 * does not serve them. */
bool fast_rows(const mx::array& x, const std::vector<std::vector<mx::array>>& layers,
               std::vector<mx::array>& outs, int M, int K, int group, int bits);

/* One layer's product by the portable kernels (quantized_linear.cpp): the tiled kernel up
 * to SMALL_ROWS rows, the dequantize-and-BLAS one beyond. `layer`: w, scales, biases[,
 * bias]; `out` allocated. */
void portable_rows(const mx::array& x, const std::vector<mx::array>& layer, mx::array& out,
                   int group, int bits);

}  // namespace mlxlmb
