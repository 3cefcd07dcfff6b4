/* quantized_linear's arrays taken apart for quantized_rows_fast (quantized_rows.h): the
 * scales and biases passed in their own dtype, row-major views where the arrays are laid
 * out so. */
#include "quantized_rows.h"

#include <memory>

namespace mlxlmb {

namespace {

/* One layer's arrays as QuantizedRows, with the copies of those not laid out row-major
 * and the float32 buffer of a half-precision output. */
struct LayerRows {
  QuantizedRows p;
  std::vector<float> x_copy, bias_copy, s32, b32;
  std::vector<uint32_t> w_copy;
  std::vector<mx::float16_t> s16, b16;
  std::vector<mx::bfloat16_t> sb16, bb16;
  FloatOut result;

  LayerRows(const mx::array& x, const std::vector<mx::array>& layer, mx::array& out, int M,
            int K, int group, int bits)
      : p{M, layer[0].shape(0), K, bits, group, nullptr, nullptr, nullptr, nullptr,
          float_type(layer[1].dtype()), nullptr, nullptr},
        result(out) {
    const auto& scales = layer[1];
    const auto& biases = layer[2];
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
    p.x = float_rows(x, x_copy);
    p.w = row_major(layer[0], w_copy);
    p.bias = layer.size() > 3 ? float_rows(layer[3], bias_copy) : nullptr;
    p.out = result.data();
  }
};

}  // namespace

/* Decode rows by quantized_rows_fast (true), the scales and biases read in their own
 * dtype rather than copied into float32 on every call; false where that kernel does not
 * serve them (no AVX2 build, other widths or dtypes), nothing done. */
bool fast_rows(const mx::array& x, const std::vector<std::vector<mx::array>>& layers,
               std::vector<mx::array>& outs, int M, int K, int group, int bits) {
  if (bits != 4 && bits != 5 && bits != 8) return false;
  for (const auto& layer : layers)
    if (layer[1].dtype() != layer[2].dtype() || layer[1].dtype() != layers[0][1].dtype())
      return false;
  std::vector<std::unique_ptr<LayerRows>> prepared;
  std::vector<QuantizedRows> parts;
  for (size_t i = 0; i < layers.size(); i++) {
    prepared.push_back(std::make_unique<LayerRows>(x, layers[i], outs[i], M, K, group, bits));
    parts.push_back(prepared.back()->p);
  }
  if (!quantized_rows_fast(parts.data(), static_cast<int>(parts.size()), primitive_threads()))
    return false;
  for (auto& layer : prepared) layer->result.finish();
  return true;
}

}  // namespace mlxlmb
