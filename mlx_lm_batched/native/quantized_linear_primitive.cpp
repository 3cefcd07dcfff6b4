/* The quantized linear primitive: one or several quantized layers of one input
 * (quantized_linear, quantized_linears in cpu_prims.h), computed by the decode kernel
 * (quantized_rows_avx2.cpp) up to SMALL_ROWS rows where it serves, else by the portable
 * kernels (quantized_linear.cpp), one output per layer. */
#include <stdexcept>
#include <utility>
#include <vector>

#include "cpu_prims.h"
#include "quantized_rows.h"

namespace mlxlmb {

namespace {

/* One or several quantized linear layers of one input (a layer's query, key and value
 * projections), one output each: the decode kernel takes every layer's weight rows in one
 * parallel region (quantized_rows_fast), each output with the bits it gets alone; other
 * rows and builds run the layers one after another. Inputs: x, then per layer w, scales,
 * biases and, where `has_bias_` says so, its bias. */
class QuantizedLinear : public CpuPrimitive {
 public:
  QuantizedLinear(mx::Stream stream, int group, int bits, std::vector<bool> has_bias)
      : CpuPrimitive(stream), group_(group), bits_(bits), has_bias_(std::move(has_bias)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    for (auto& out : outputs) out.set_data(mx::allocator::malloc(out.nbytes()));
    run_on_cpu(inputs, outputs, [parts = layers(inputs), x = inputs[0], outputs,
                                 group = group_, bits = bits_]() mutable {
      const int K = x.shape(-1);
      const int M = static_cast<int>(x.size() / (K > 0 ? K : 1));
      if (M == 0) return;
      if (M <= SMALL_ROWS && fast_rows(x, parts, outputs, M, K, group, bits)) return;
      for (size_t i = 0; i < parts.size(); i++) {  // alone (layers whose scales differ)
        std::vector<mx::array> out = {outputs[i]};
        if (M <= SMALL_ROWS && parts.size() > 1 && fast_rows(x, {parts[i]}, out, M, K, group, bits))
          continue;
        portable_rows(x, parts[i], outputs[i], group, bits);
      }
    });
  }

  /* Gradients with respect to x and the layers' biases (LoRA on a quantized model): those
   * of MLX's op. */
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const auto s = stream();
    const int group = group_, bits = bits_;
    const auto parts = layers(primals);
    std::vector<mx::array> at = {primals[0]};
    std::vector<int> bias_at(parts.size(), -1), bias_primal(parts.size(), -1);
    for (size_t i = 0, primal = 1; i < parts.size(); primal += parts[i].size(), i++)
      if (has_bias_[i]) {
        bias_at[i] = static_cast<int>(at.size());
        bias_primal[i] = static_cast<int>(primal + 3);
        at.push_back(parts[i][3]);
      }
    auto reference = [=](const std::vector<mx::array>& in) {
      std::vector<mx::array> ys;
      for (size_t i = 0; i < parts.size(); i++) {
        auto y = mx::quantized_matmul(in[0], parts[i][0], parts[i][1], parts[i][2], true, group,
                                      bits, "affine", s);
        if (bias_at[i] >= 0) y = mx::add(y, in[bias_at[i]], s);
        ys.push_back(y);
      }
      return ys;
    };
    auto grads = mx::vjp(reference, at, cotangents).second;
    std::vector<mx::array> result;
    for (int a : argnums) {
      int found = a == 0 ? 0 : -1;
      for (size_t i = 0; i < parts.size(); i++)
        if (bias_primal[i] == a) found = bias_at[i];
      result.push_back(found >= 0 ? grads[found] : mx::zeros_like(primals[a], s));
    }
    return result;
  }
  const char* name() const override { return "MlxlmbQuantizedLinear"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const QuantizedLinear&>(other);
    return group_ == o.group_ && bits_ == o.bits_ && has_bias_ == o.has_bias_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    std::vector<mx::Shape> shapes;
    for (const auto& layer : layers(inputs)) {
      auto shape = inputs[0].shape();
      shape.back() = layer[0].shape(0);
      shapes.push_back(shape);
    }
    return shapes;
  }

 private:
  /* The inputs after x, one (w, scales, biases[, bias]) per layer. */
  std::vector<std::vector<mx::array>> layers(const std::vector<mx::array>& inputs) const {
    std::vector<std::vector<mx::array>> out;
    size_t at = 1;
    for (bool bias : has_bias_) {
      const size_t n = bias ? 4 : 3;
      out.emplace_back(inputs.begin() + at, inputs.begin() + at + n);
      at += n;
    }
    return out;
  }

  int group_, bits_;
  std::vector<bool> has_bias_;
};

}  // namespace

std::vector<mx::array> quantized_linears(const mx::array& x, const std::vector<mx::array>& ws,
                                         const std::vector<mx::array>& scales,
                                         const std::vector<mx::array>& biases,
                                         const std::vector<std::optional<mx::array>>& bias,
                                         int group_size, int bits) {
  if (bits < 1 || bits > 8 || bits == 7)
    throw std::invalid_argument("quantized_linear: 1, 2, 3, 4, 5, 6 or 8 bits");
  if (group_size != 32 && group_size != 64 && group_size != 128)
    throw std::invalid_argument("quantized_linear: group size 32, 64 or 128");
  if (x.ndim() < 1 || !float_dtype(x.dtype()))
    throw std::invalid_argument("quantized_linear: a float32, float16 or bfloat16 input");
  if (ws.empty() || scales.size() != ws.size() || biases.size() != ws.size() ||
      bias.size() != ws.size())
    throw std::invalid_argument("quantized_linear: one scales, biases and bias per weight");
  const int K = x.shape(-1);
  std::vector<mx::array> inputs = {x};
  std::vector<bool> has_bias;
  std::vector<mx::Shape> shapes;
  for (size_t i = 0; i < ws.size(); i++) {
    const auto& w = ws[i];
    if (w.dtype() != mx::uint32 || w.ndim() != 2 ||
        static_cast<int64_t>(w.shape(1)) * 32 != static_cast<int64_t>(K) * bits)
      throw std::invalid_argument("quantized_linear: a uint32 (N, K * bits / 32) weight");
    const int N = w.shape(0);
    for (const auto* a : {&scales[i], &biases[i]})
      if (!float_dtype(a->dtype()) || a->ndim() != 2 || a->shape(0) != N ||
          a->shape(1) * group_size != K)
        throw std::invalid_argument("quantized_linear: scales and biases of shape (N, K / group)");
    inputs.insert(inputs.end(), {w, scales[i], biases[i]});
    if (bias[i]) {
      if (!float_dtype(bias[i]->dtype()) || bias[i]->ndim() != 1 || bias[i]->shape(0) != N)
        throw std::invalid_argument("quantized_linear: the bias must be a float array of shape (N,)");
      inputs.push_back(*bias[i]);
    }
    has_bias.push_back(bias[i].has_value());
    auto shape = x.shape();
    shape.back() = N;
    shapes.push_back(std::move(shape));
  }
  auto primitive = std::make_shared<QuantizedLinear>(cpu_stream(), group_size, bits, has_bias);
  if (ws.size() == 1)
    return {mx::array(std::move(shapes[0]), x.dtype(), primitive, std::move(inputs))};
  return mx::array::make_arrays(std::move(shapes), std::vector<mx::Dtype>(ws.size(), x.dtype()),
                                primitive, std::move(inputs));
}

mx::array quantized_linear(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, std::optional<mx::array> bias,
                           int group_size, int bits) {
  return quantized_linears(x, {w}, {scales}, {biases}, {bias}, group_size, bits)[0];
}

}  // namespace mlxlmb
