/* A gated MLP's silu(gate) * up for MLX's CPU backend, as one MLX primitive.
 *
 * layers/cpu_ops.py computes SiLU with its vectorised exp formula in MLX ops: with the
 * product by `up`, about ten graph nodes per MLP call (the formula's compiled parts, the
 * view of the exponent bits, a negation, the product), 300 of a 30-layer decode step's
 * 1,260 after the linear primitive. Here it is one node and one pass: the same formula
 * (exp_lanes.h), the same operation order (gate / (1 + exp(-gate)), then times up), so
 * the values are those of cpu_ops, and each element depends on its own inputs only.
 * Float16 and bfloat16 operands are computed in float32 and the result rounded once.
 */
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_prims.h"
#include "exp_lanes.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mlxlmb {

namespace {

/* out[i] = gate[i] / (1 + exp(-gate[i])) * up[i] for n contiguous elements. */
void swiglu_span(const float* gate, const float* up, float* out, size_t n) {
  size_t i = 0;
  for (; i + VW <= n; i += VW) {
    const vf g = load(gate + i);
    const vf r = g / (1.0f + exp_lanes(-g)) * load(up + i);
    store_vector(out + i, r);
  }
  if (i < n) {
    const int rest = static_cast<int>(n - i);
    const vf g = load_tail(gate + i, rest);
    const vf r = g / (1.0f + exp_lanes(-g)) * load_tail(up + i, rest);
    for (int j = 0; j < rest; j++) out[i + j] = r[j];
  }
}

class SwiGLU : public CpuPrimitive {
 public:
  explicit SwiGLU(mx::Stream stream) : CpuPrimitive(stream) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    run_on_cpu(inputs, out, [inputs, out]() mutable {
      /* Split halves of a fused gate_up projection are strided views: copied first. */
      std::vector<float> gate_copy, up_copy;
      FloatOut result(out);
      swiglu_span(float_rows(inputs[0], gate_copy), float_rows(inputs[1], up_copy),
                  result.data(), out.size());
      result.finish();
    });
  }

  /* Gradients (training on the CPU): those of silu(gate) * up in MLX ops. */
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const auto s = stream();
    auto reference = [s](const std::vector<mx::array>& in) {
      auto silu = mx::multiply(in[0], mx::sigmoid(in[0], s), s);
      return std::vector<mx::array>{mx::multiply(silu, in[1], s)};
    };
    return reference_vjp(reference, primals, cotangents, argnums, primals.size());
  }
  const char* name() const override { return "MlxlmbSwiGLU"; }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }
};

}  // namespace

mx::array swiglu(const mx::array& gate, const mx::array& up) {
  if (!float_dtype(gate.dtype()) || !float_dtype(up.dtype()))
    throw std::invalid_argument("swiglu: float32, float16 or bfloat16 gate and up");
  if (gate.shape() != up.shape())
    throw std::invalid_argument("swiglu: gate and up must have the same shape");
  return mx::array(gate.shape(), mx::promote_types(gate.dtype(), up.dtype()),
                   std::make_shared<SwiGLU>(cpu_stream()), {gate, up});
}

}  // namespace mlxlmb
