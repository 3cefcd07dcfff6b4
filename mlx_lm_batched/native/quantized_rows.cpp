/* quantized_linear's arrays taken apart for quantized_rows_fast (quantized_rows.h): the
 * scales and biases passed in their own dtype, row-major views where the arrays are laid
 * out so. */
#include "quantized_rows.h"

namespace mlxlmb {

/* Decode rows by quantized_rows_fast (true), the scales and biases read in their own
 * dtype rather than copied into float32 on every call; false where that kernel does not
 * serve them (no AVX2 build, other widths or dtypes), nothing done. */
bool fast_rows(const std::vector<mx::array>& inputs, mx::array& out, int M, int N, int K,
               int group, int bits) {
  const auto& scales = inputs[2];
  const auto& biases = inputs[3];
  if ((bits != 4 && bits != 5 && bits != 8) || scales.dtype() != biases.dtype()) return false;
  QuantizedRows p{M, N, K, bits, group, nullptr, nullptr, nullptr, nullptr,
                  float_type(scales.dtype()), nullptr, nullptr};
  std::vector<float> x_copy, bias_copy, s32, b32;
  std::vector<uint32_t> w_copy;
  std::vector<mx::float16_t> s16, b16;
  std::vector<mx::bfloat16_t> sb16, bb16;
  if (scales.dtype() == mx::float16) {
    p.scales = row_major(scales, s16);
    p.biases = row_major(biases, b16);
  } else if (scales.dtype() == mx::bfloat16) {
    p.scales = row_major(scales, sb16);
    p.biases = row_major(biases, bb16);
  } else {
    p.scales = row_major(scales, s32);
    p.biases = row_major(biases, b32);
  }
  FloatOut result(out);
  p.x = float_rows(inputs[0], x_copy);
  p.w = row_major(inputs[1], w_copy);
  p.bias = inputs.size() > 4 ? float_rows(inputs[4], bias_copy) : nullptr;
  p.out = result.data();
  if (!quantized_rows_fast(p, primitive_threads())) return false;
  result.finish();
  return true;
}

}  // namespace mlxlmb
