/* RMSNorm and rotary position embeddings for MLX's CPU backend, one primitive each.
 *
 * On the CPU, mx.fast.rms_norm and mx.fast.rope fall back to compositions of MLX ops
 * (about 8 and 20 graph nodes per call: squares, a mean, a reciprocal square root; an
 * arange, exp, cos, sin, slices, products and a concatenation). A decode step of a
 * 30-layer model calls them 120 times, and each node costs graph building and a
 * dispatch on MLX's stream whatever its size: replaced by stand-ins that cost nothing,
 * the two took a quarter of SmolLM2-135M's batch-8 step (scripts/bench_cpu_prims.py). Here each call
 * is one node, a single pass over its rows.
 *
 * Each row is computed alone (batch invariance, docs/architecture.md): the sum of
 * squares in 16 lanes and lanes.h's fixed tree; a rotation's angles from the row's own
 * position. Values agree with MLX's fallbacks to float32 rounding (the rotation's
 * inverse frequencies are computed by the caller with MLX's own formula), and so do
 * their gradients (training on the CPU).
 */
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_prims.h"
#include "lanes.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mlxlmb {

namespace {

/* A float32, float16 or bfloat16 input's rows as float32: its own memory (`offsets`, the
 * last axis' stride) when float32, else a row-major converted copy in `scratch`, its row
 * offsets in `scratch_rows`. */
struct FloatView {
  const float* data;
  const int64_t* rows;  // element offset of each row (as many as `offsets`)
  int64_t step;         // between a row's elements
};
FloatView float_view(const mx::array& x, const std::vector<int64_t>& offsets,
                     std::vector<float>& scratch, std::vector<int64_t>& scratch_rows) {
  if (x.dtype() == mx::float32) return {x.data<float>(), offsets.data(), x.strides().back()};
  const int64_t D = x.shape(-1);
  scratch_rows.resize(offsets.size());
  for (size_t r = 0; r < offsets.size(); r++) scratch_rows[r] = static_cast<int64_t>(r) * D;
  return {float_rows(x, scratch), scratch_rows.data(), 1};
}

class RMSNorm : public CpuPrimitive {
 public:
  RMSNorm(mx::Stream stream, float eps) : CpuPrimitive(stream), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const int D = x.shape(-1);
    run_on_cpu(inputs, out, [inputs, out, offsets = row_offsets(x), D, eps = eps_]() mutable {
      std::vector<float> x_copy, w_copy;
      std::vector<int64_t> copy_rows;
      const auto [xp, rows, x_step] = float_view(inputs[0], offsets, x_copy, copy_rows);
      const float* w = inputs.size() > 1 ? float_rows(inputs[1], w_copy) : nullptr;
      FloatOut result(out);
      float* op = result.data();
      std::vector<float> row(D);
      for (size_t r = 0; r < offsets.size(); r++) {
        const float* xr = xp + rows[r];
        if (x_step != 1) {
          for (int d = 0; d < D; d++) row[d] = xr[d * x_step];
          xr = row.data();
        }
        const int full = D - D % VW;
        vf lanes = {0};
        for (int d = 0; d < full; d += VW) {
          vf v = load(xr + d);
          lanes += v * v;
        }
        if (full < D) {
          vf v = load_tail(xr + full, D - full);
          lanes += v * v;
        }
        const float scale = 1.0f / std::sqrt(hsum1(lanes) / D + eps);
        float* o = op + r * D;
        if (w) {
          for (int d = 0; d < D; d++) o[d] = (xr[d] * scale) * w[d];
        } else {
          for (int d = 0; d < D; d++) o[d] = xr[d] * scale;
        }
      }
      result.finish();
    });
  }

  /* Gradients (training on the CPU): those of mx.fast.rms_norm, the same function. */
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const float eps = eps_;
    const auto s = stream();
    auto reference = [eps, s](const std::vector<mx::array>& in) {
      std::optional<mx::array> w;
      if (in.size() > 1) w = in[1];
      return std::vector<mx::array>{mx::fast::rms_norm(in[0], w, eps, s)};
    };
    return reference_vjp(reference, primals, cotangents, argnums, primals.size());
  }
  const char* name() const override { return "MlxlmbRMSNorm"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RMSNorm&>(other).eps_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  float eps_;
};

class RoPE : public CpuPrimitive {
 public:
  RoPE(mx::Stream stream, int dims, bool traditional, float scale)
      : CpuPrimitive(stream), dims_(dims), traditional_(traditional), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& x = inputs[0];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    const int D = x.shape(-1), L = x.shape(-2), B = x.shape(0);
    const int64_t per_row = x.size() / (static_cast<int64_t>(B) * D); /* rows per batch row */
    run_on_cpu(inputs, out, [inputs, out, offsets = row_offsets(x), D, L, B, per_row,
                      off_step = inputs[1].strides()[0],
                      freq_step = inputs[2].strides()[0], dims = dims_,
                      traditional = traditional_, scale = scale_]() mutable {
      std::vector<float> x_copy;
      std::vector<int64_t> copy_rows;
      const auto [xp, rows, x_step] = float_view(inputs[0], offsets, x_copy, copy_rows);
      const int32_t* positions = inputs[1].data<int32_t>();
      const float* inv_freq = inputs[2].data<float>();
      FloatOut result(out);
      float* op = result.data();
      const int half = dims / 2;
      /* cos and sin of each (row, query position, pair), computed once for the heads. */
      std::vector<float> cosines(static_cast<size_t>(B) * L * half), sines(cosines.size());
      for (int b = 0; b < B; b++)
        for (int l = 0; l < L; l++) {
          const float pos = static_cast<float>(positions[b * off_step] + l) * scale;
          for (int i = 0; i < half; i++) {
            const float theta = pos * inv_freq[i * freq_step];
            cosines[(static_cast<size_t>(b) * L + l) * half + i] = std::cos(theta);
            sines[(static_cast<size_t>(b) * L + l) * half + i] = std::sin(theta);
          }
        }
      for (size_t r = 0; r < offsets.size(); r++) {
        const int b = static_cast<int>(r / per_row), l = static_cast<int>(r % L);
        const float* c = cosines.data() + (static_cast<size_t>(b) * L + l) * half;
        const float* s = sines.data() + (static_cast<size_t>(b) * L + l) * half;
        const float* xr = xp + rows[r];
        float* o = op + r * D;
        for (int i = 0; i < half; i++) {
          const int i1 = traditional ? 2 * i : i, i2 = traditional ? 2 * i + 1 : i + half;
          const float x1 = xr[i1 * x_step], x2 = xr[i2 * x_step];
          o[i1] = x1 * c[i] - x2 * s[i];
          o[i2] = x1 * s[i] + x2 * c[i];
        }
        for (int d = 2 * half; d < D; d++) o[d] = xr[d * x_step];
      }
      result.finish();
    });
  }

  /* Gradients (training on the CPU): a rotation's transpose is the rotation by the
   * opposite angles; positions and frequencies are constants. */
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    std::vector<mx::array> out;
    for (int a : argnums) {
      if (a == 0) {
        auto opposite = mx::negative(primals[2], stream());
        out.push_back(mx::array(cotangents[0].shape(), cotangents[0].dtype(),
                                std::make_shared<RoPE>(stream(), dims_, traditional_, scale_),
                                {cotangents[0], primals[1], opposite}));
      } else {
        out.push_back(mx::zeros_like(primals[a], stream()));
      }
    }
    return out;
  }
  const char* name() const override { return "MlxlmbRoPE"; }
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RoPE&>(other);
    return dims_ == o.dims_ && traditional_ == o.traditional_ && scale_ == o.scale_;
  }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {inputs[0].shape()};
  }

 private:
  int dims_;
  bool traditional_;
  float scale_;
};

}  // namespace

mx::array rms_norm(const mx::array& x, std::optional<mx::array> weight, float eps) {
  if (x.ndim() < 1 || !float_dtype(x.dtype()))
    throw std::invalid_argument("rms_norm: a float32, float16 or bfloat16 input with a last axis");
  std::vector<mx::array> inputs = {x};
  auto dtype = x.dtype();
  if (weight) {
    if (!float_dtype(weight->dtype()) || weight->ndim() != 1 ||
        weight->shape(0) != x.shape(-1))
      throw std::invalid_argument("rms_norm: the weight must be a float array of the last axis' size");
    inputs.push_back(*weight);
    dtype = mx::promote_types(dtype, weight->dtype());  // mx.fast.rms_norm's output dtype
  }
  return mx::array(x.shape(), dtype, std::make_shared<RMSNorm>(cpu_stream(), eps),
                   std::move(inputs));
}

mx::array rope(const mx::array& x, int dims, bool traditional, const mx::array& inv_freq,
               float scale, const mx::array& offset) {
  if (x.ndim() < 3 || !float_dtype(x.dtype()))
    throw std::invalid_argument("rope: a float32, float16 or bfloat16 input (B, ..., L, D)");
  if (dims % 2 != 0 || dims > x.shape(-1) || dims <= 0)
    throw std::invalid_argument("rope: dims must be even and at most the last axis' size");
  if (inv_freq.dtype() != mx::float32 || inv_freq.ndim() != 1 || inv_freq.shape(0) != dims / 2)
    throw std::invalid_argument("rope: inv_freq must be float32 of dims / 2 values");
  if (offset.dtype() != mx::int32 || offset.ndim() != 1 ||
      (offset.shape(0) != x.shape(0) && offset.shape(0) != 1))
    throw std::invalid_argument("rope: offset must be int32 of shape (B,) or (1,)");
  auto stream = cpu_stream();
  auto positions = mx::broadcast_to(offset, {x.shape(0)}, stream);
  return mx::array(x.shape(), x.dtype(),
                   std::make_shared<RoPE>(stream, dims, traditional, scale),
                   {x, positions, inv_freq});
}

}  // namespace mlxlmb
