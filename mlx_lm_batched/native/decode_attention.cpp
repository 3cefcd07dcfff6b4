/* Decode attention for MLX's CPU backend, as one MLX primitive.
 *
 * A decode step attends one query per row. Composed from MLX ops on the CPU that is a
 * dozen dispatches per layer (a matmul per KV head and row, the mask, a softmax of
 * several passes over the scores, a second matmul), each reading and writing the
 * whole (rows, heads, slots) score tensor once, on one core. Here each (row, KV head)
 * is one task: its query heads' scores against the row's keys, their softmax and the
 * weighted sum of the values, with the keys and values read once for all the query
 * heads that share them (GQA), on every core (OpenMP over the tasks).
 *
 * Masked slots (padding, keys outside a sliding window) are skipped, not zeroed: a
 * row's output is the same chain of float32 operations over its attended keys in slot
 * order, whatever the padding before them, the other rows of the batch or the thread
 * that computes it (batch invariance, DESIGN.md invariant 8). Each score is a dot
 * product in 16 lanes then a fixed tree (as native/small_gemm.c); the exponential is
 * 2^(x log2 e) from the exponent bits times a degree-7 polynomial (as
 * layers/cpu_ops.py); sums go in 16 lanes by attended-key index, then the same tree.
 *
 * Built by mlx_lm_batched/_decode_attention.py with the system's C++ compiler against
 * the installed MLX and nanobind (once per machine, cached).
 */
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;
namespace nb = nanobind;

namespace {

constexpr int VW = 16;
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline vf load_tail(const float* p, int n) {
  vf v = {0};
  for (int i = 0; i < n; i++) v[i] = p[i];
  return v;
}
/* The one order in which 16 lane partials are added: lane l with l + 8, then l + 4,
 * l + 2, l + 1 (small_gemm.c's hsum1). */
inline float hsum(vf v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

/* exp(x) for x <= 0 (scores minus their maximum): 2^round(t) from the exponent bits
 * times 2^f, f = t - round(t) in [-1/2, 1/2], by Taylor's polynomial of degree 7;
 * t = x log2 e clipped at -127 (exp of less is 0). layers/cpu_ops.py's formula. */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float POLY[8] = {1.0f,
                           0.6931471805599453f,
                           0.2402265069591007f,
                           0.05550410866482158f,
                           0.009618129107628477f,
                           0.0013333558146428443f,
                           0.00015403530393381606f,
                           1.525273380405984e-05f};

inline void exp_in_place(float* x, int n) {
  for (int i = 0; i < n; i++) {
    float t = std::fmin(std::fmax(x[i] * LOG2E, -127.0f), 127.49f);
    int32_t m = static_cast<int32_t>(t + 127.5f); /* round(t) + 127, in [0, 254] */
    float f = t - static_cast<float>(m - 127);
    float p = POLY[7];
    for (int c = 6; c >= 0; c--) p = p * f + POLY[c];
    int32_t bits = m << 23;
    float power;
    std::memcpy(&power, &bits, sizeof power);
    x[i] = p * power;
  }
}

/* Where one operand's elements are: base pointer and element strides (rows, heads,
 * slots, features). */
struct View {
  const void* data;
  int64_t s0, s1, s2, s3;
};

struct Geometry {
  int B, H, n_kv, S, D, Dv;
  float scale;
  View q, k, v, mask; /* mask.data null: every slot attended */
  float* out;         /* (B, H, 1, Dv), contiguous */
};

int configured_threads = 1;

/* A row of `n` floats with stride `stride` as a contiguous pointer (copied into
 * `scratch` when strided). */
inline const float* contiguous_row(const float* p, int64_t stride, int n, float* scratch) {
  if (stride == 1) return p;
  for (int i = 0; i < n; i++) scratch[i] = p[i * stride];
  return scratch;
}

/* One task: query heads [h0, h0 + G) of row b against KV head kvh. */
void attend_one(const Geometry& g, int b, int kvh, std::vector<float>& work,
                std::vector<int>& slots) {
  const int G = g.H / g.n_kv, D = g.D, Dv = g.Dv, S = g.S;
  const int h0 = kvh * G;
  const float* qb = static_cast<const float*>(g.q.data) + b * g.q.s0;
  const float* kb = static_cast<const float*>(g.k.data) + b * g.k.s0 + kvh * g.k.s1;
  const float* vb = static_cast<const float*>(g.v.data) + b * g.v.s0 + kvh * g.v.s1;
  const bool* mb = g.mask.data
      ? static_cast<const bool*>(g.mask.data) + b * g.mask.s0  /* one mask for all heads */
      : nullptr;

  /* The attended slots, in order. */
  slots.clear();
  for (int j = 0; j < S; j++)
    if (!mb || mb[j * g.mask.s3]) slots.push_back(j);
  const int n = static_cast<int>(slots.size());

  /* work: scaled queries (G x D), scores (G x n), key/value scratch (D + Dv),
   * output accumulators (G x Dv). */
  work.resize(static_cast<size_t>(G) * D + static_cast<size_t>(G) * n + D + Dv +
              static_cast<size_t>(G) * Dv);
  float* qs = work.data();
  float* scores = qs + static_cast<size_t>(G) * D;
  float* row_scratch = scores + static_cast<size_t>(G) * n;
  float* acc = row_scratch + D + Dv;

  for (int h = 0; h < G; h++) {
    const float* qh = qb + (h0 + h) * g.q.s1;
    for (int d = 0; d < D; d++) qs[h * D + d] = qh[d * g.q.s3] * g.scale;
  }
  float* out0 = g.out + (static_cast<int64_t>(b) * g.H + h0) * Dv;
  if (n == 0) { /* nothing attended (never for a decode query: it attends itself) */
    std::memset(out0, 0, sizeof(float) * G * Dv);
    return;
  }

  /* Scores: each key row is read once for the G query heads. */
  const int full = D - D % VW;
  for (int c = 0; c < n; c++) {
    const float* kj = contiguous_row(kb + slots[c] * g.k.s2, g.k.s3, D, row_scratch);
    for (int h = 0; h < G; h++) {
      const float* qh = qs + h * D;
      vf lanes = {0};
      for (int d = 0; d < full; d += VW) lanes += load(qh + d) * load(kj + d);
      if (full < D) lanes += load_tail(qh + full, D - full) * load_tail(kj + full, D - full);
      scores[h * n + c] = hsum(lanes);
    }
  }

  /* Softmax numerators and sums, per query head. */
  float inv_sum[64];
  std::vector<float> inv_sum_big;
  float* inv = inv_sum;
  if (G > 64) {
    inv_sum_big.resize(G);
    inv = inv_sum_big.data();
  }
  for (int h = 0; h < G; h++) {
    float* sh = scores + h * n;
    float top = sh[0];
    for (int c = 1; c < n; c++) top = std::fmax(top, sh[c]);
    for (int c = 0; c < n; c++) sh[c] -= top;
    exp_in_place(sh, n);
    const int n_full = n - n % VW;
    vf lanes = {0};
    for (int c = 0; c < n_full; c += VW) lanes += load(sh + c);
    if (n_full < n) lanes += load_tail(sh + n_full, n - n_full);
    inv[h] = 1.0f / hsum(lanes);
  }

  /* Weighted sums of the value rows, in slot order. */
  std::memset(acc, 0, sizeof(float) * G * Dv);
  for (int c = 0; c < n; c++) {
    const float* vj = contiguous_row(vb + slots[c] * g.v.s2, g.v.s3, Dv, row_scratch + D);
    for (int h = 0; h < G; h++) {
      const float w = scores[h * n + c];
      float* ah = acc + h * Dv;
      for (int d = 0; d < Dv; d++) ah[d] += w * vj[d];
    }
  }
  for (int h = 0; h < G; h++)
    for (int d = 0; d < Dv; d++) out0[h * Dv + d] = acc[h * Dv + d] * inv[h];
}

void attend_all(const Geometry& g) {
  const int tasks = g.B * g.n_kv;
  const int threads = std::max(1, std::min(configured_threads, tasks));
#pragma omp parallel num_threads(threads)
  {
    std::vector<float> work;
    std::vector<int> slots;
#pragma omp for schedule(dynamic, 1)
    for (int t = 0; t < tasks; t++) attend_one(g, t / g.n_kv, t % g.n_kv, work, slots);
  }
}

View view_of(const mx::array& a) {
  const auto& st = a.strides();
  return {a.data<void>(), st[0], st[1], st[2], st[3]};
}

class DecodeAttention : public mx::Primitive {
 public:
  DecodeAttention(mx::Stream stream, float scale) : mx::Primitive(stream), scale_(scale) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto &q = inputs[0], &k = inputs[1], &v = inputs[2];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    Geometry g;
    g.B = q.shape(0);
    g.H = q.shape(1);
    g.n_kv = k.shape(1);
    g.S = k.shape(2);
    g.D = q.shape(3);
    g.Dv = v.shape(3);
    g.scale = scale_;
    g.q = view_of(q);
    g.k = view_of(k);
    g.v = view_of(v);
    g.mask = inputs.size() > 3 ? view_of(inputs[3]) : View{nullptr, 0, 0, 0, 0};
    g.out = out.data<float>();
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    // The arrays ride along so their buffers outlive the task.
    encoder.dispatch([g, inputs, out]() { attend_all(g); });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("DecodeAttention is a CPU kernel (other devices use mx.fast)");
  }

  const char* name() const override { return "DecodeAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const DecodeAttention&>(other).scale_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto &q = inputs[0], &v = inputs[2];
    return {{q.shape(0), q.shape(1), 1, v.shape(3)}};
  }

 private:
  float scale_;
};

/* Softmax(q k^T * scale) v for one query per row: q (B, H, 1, D), k (B, n_kv, S, D),
 * v (B, n_kv, S, Dv), float32; mask boolean, broadcastable to (B, 1, 1, S) (True =
 * attend). */
mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, std::optional<mx::array> mask) {
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 || q.shape(2) != 1)
    throw std::invalid_argument("decode_attention: q (B, H, 1, D), k and v (B, n_kv, S, D)");
  const int B = q.shape(0), H = q.shape(1), n_kv = k.shape(1), S = k.shape(2);
  if (k.shape(0) != B || v.shape(0) != B || v.shape(1) != n_kv || v.shape(2) != S ||
      k.shape(3) != q.shape(3) || n_kv == 0 || H % n_kv != 0)
    throw std::invalid_argument("decode_attention: q, k and v shapes disagree");
  if (q.dtype() != mx::float32 || k.dtype() != mx::float32 || v.dtype() != mx::float32)
    throw std::invalid_argument("decode_attention: float32 only");
  auto stream = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> inputs = {q, k, v};
  if (mask) {
    if (mask->dtype() != mx::bool_)
      throw std::invalid_argument("decode_attention: the mask must be boolean");
    inputs.push_back(mx::broadcast_to(*mask, {B, 1, 1, S}, stream));
  }
  return mx::array({B, H, 1, v.shape(3)}, mx::float32,
                   std::make_shared<DecodeAttention>(stream, scale), std::move(inputs));
}

}  // namespace

NB_MODULE(_mlxlmb_decode_attention, m) {
  m.doc() = "Fused decode attention for MLX's CPU backend (mlx_lm_batched)";
  m.def("decode_attention", &decode_attention, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("scale"), nb::arg("mask") = nb::none(),
        "softmax(q k^T * scale) v for one query per row (float32, CPU).");
  m.def("set_threads", [](int threads) { configured_threads = threads > 0 ? threads : 1; },
        nb::arg("threads"), "Threads the kernel's tasks are split over.");
}
