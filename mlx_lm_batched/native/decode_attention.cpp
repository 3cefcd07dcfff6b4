/* Decode attention for MLX's CPU backend, as one MLX primitive.
 *
 * A decode step attends one query per row. Composed from MLX ops on the CPU that is a
 * dozen dispatches per layer (a matmul per KV head and row, the mask, a softmax of
 * several passes over the scores, a second matmul), each reading and writing the
 * whole (rows, heads, slots) score tensor once, on one core. Here each (row, KV head)
 * is one task: its query heads' scores against the row's keys, their softmax and the
 * weighted sum of the values, with the keys and values read once for all the query
 * heads that share them (GQA), on every core (the tasks shared out by shared_work.h).
 *
 * Masked slots (padding, keys outside a sliding window) are skipped, not zeroed: a
 * row's output is the same chain of float32 operations over its attended keys in slot
 * order, whatever the padding before them, the other rows of the batch or the thread
 * that computes it (batch invariance, docs/architecture.md). Each score is a dot
 * product in 16 lanes then lanes.h's fixed tree (as native/small_gemm.c's products);
 * the exponential is 2^(x log2 e) from the exponent bits times a degree-7 polynomial
 * (as layers/cpu_ops.py); the softmax's sum goes in 16 lanes by attended-key index,
 * then the same tree; the values are summed in slot order. Float16 and bfloat16 queries,
 * keys and values (a model and cache in half precision) are converted to float32 as each
 * row is read, and the output rounded once to their dtype.
 *
 * Built by mlx_lm_batched/_cpu_prims.py with the system's C++ compiler against
 * the installed MLX and nanobind (once per machine, cached).
 */

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <stdexcept>
#include <vector>

#include "cpu_prims.h"
#include "exp_lanes.h"
#include "lanes.h"
#include "shared_work.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mlxlmb {

namespace {

/* x[i] = exp(x[i] - shift), then their sum: in 16 lanes by index, then the tree. */
inline float exp_and_sum(float* x, int n, float shift) {
  vf lanes = {0};
  int i = 0;
  for (; i + VW <= n; i += VW) {
    vf e = exp_lanes(load(x + i) - shift);
    store_vector(x + i, e);
    lanes += e;
  }
  if (i < n) {
    vf e = exp_lanes(load_tail(x + i, n - i) - shift);
    for (int j = 0; j < n - i; j++) x[i + j] = e[j];
    for (int j = n - i; j < VW; j++) e[j] = 0.0f;
    lanes += e;
  }
  return hsum1(lanes);
}

inline float max_of(const float* x, int n) {
  float top = x[0];
  int i = 0;
  if (n >= VW) {
    vf lanes = load(x);
    for (i = VW; i + VW <= n; i += VW) {
      vf v = load(x + i);
      lanes = v > lanes ? v : lanes;
    }
    for (int j = 0; j < VW; j++) top = std::fmax(top, lanes[j]);
  }
  for (; i < n; i++) top = std::fmax(top, x[i]);
  return top;
}

/* Where one operand's elements are: base pointer, element strides (rows, heads, slots,
 * features) and element type (float16 and bfloat16 converted to float32 as they are read;
 * the mask's: unused). */
struct View {
  const void* data;
  int64_t s0, s1, s2, s3;
  FloatType elem = FloatType::float32;
};

inline size_t elem_bytes(FloatType e) { return e == FloatType::float32 ? 4 : 2; }

/* The address `offset` elements past `base`. */
inline const void* advance(const void* base, int64_t offset, FloatType e) {
  return static_cast<const char*>(base) + offset * static_cast<int64_t>(elem_bytes(e));
}

inline float read_float(const void* p, int64_t i, FloatType e) {
  if (e == FloatType::float16) return static_cast<float>(static_cast<const mx::float16_t*>(p)[i]);
  if (e == FloatType::bfloat16) return static_cast<float>(static_cast<const mx::bfloat16_t*>(p)[i]);
  return static_cast<const float*>(p)[i];
}

/* Keys and values of consecutive slots: a row's slots are its segments' in order (one
 * segment for a plain cache; a shared prefix's blocks then the row's own slots for a
 * cache that shares them, cache/row_blocks.py). */
struct Segment {
  View k, v;
  int len;
};

struct Geometry {
  int B, H, n_kv, S, D, Dv;
  float scale;
  View q, mask;                  /* mask.data null: every slot attended */
  std::vector<Segment> segments; /* their lengths add up to S */
  float* out;                    /* (B, H, 1, Dv), contiguous */
};

/* Per task: where each attended slot's key and value rows are, their strides and element
 * types. */
struct SlotRows {
  std::vector<const void*> k, v;
  std::vector<int64_t> k_step, v_step;
  std::vector<FloatType> k_elem, v_elem;
};

int configured_threads = 1;

/* A row of `n` elements with stride `stride` as contiguous float32: in place when it is
 * float32 and contiguous, else copied (converted) into `scratch`. */
inline const float* float_row(const void* p, int64_t stride, FloatType e, int n, float* scratch) {
  if (e == FloatType::float32 && stride == 1) return static_cast<const float*>(p);
  if (stride == 1) {  /* a span, converted a vector at a time (cpu_prims.h) */
    if (e == FloatType::bfloat16)
      bf16_to_float(static_cast<const uint16_t*>(p), scratch, n);
    else
      f16_to_float(static_cast<const mx::float16_t*>(p), scratch, n);
    return scratch;
  }
  for (int i = 0; i < n; i++) scratch[i] = read_float(p, i * stride, e);
  return scratch;
}

/* One task: query heads [h0, h0 + G) of row b against KV head kvh. */
void attend_one(const Geometry& g, int b, int kvh, std::vector<float>& work,
                SlotRows& at) {
  const int G = g.H / g.n_kv, D = g.D, Dv = g.Dv;
  const int h0 = kvh * G;
  const void* qb = advance(g.q.data, b * g.q.s0, g.q.elem);
  const bool* mb = g.mask.data
      ? static_cast<const bool*>(g.mask.data) + b * g.mask.s0  /* one mask for all heads */
      : nullptr;

  /* The attended slots' key and value rows, in slot order (the same addresses whether
   * the slots are one array or several segments: the same bits). */
  at.k.clear();
  at.v.clear();
  at.k_step.clear();
  at.v_step.clear();
  at.k_elem.clear();
  at.v_elem.clear();
  int j = 0;
  for (const Segment& seg : g.segments) {
    const int64_t k_base = b * seg.k.s0 + kvh * seg.k.s1, v_base = b * seg.v.s0 + kvh * seg.v.s1;
    for (int i = 0; i < seg.len; i++, j++) {
      if (mb && !mb[j * g.mask.s3]) continue;
      at.k.push_back(advance(seg.k.data, k_base + i * seg.k.s2, seg.k.elem));
      at.v.push_back(advance(seg.v.data, v_base + i * seg.v.s2, seg.v.elem));
      at.k_step.push_back(seg.k.s3);
      at.v_step.push_back(seg.v.s3);
      at.k_elem.push_back(seg.k.elem);
      at.v_elem.push_back(seg.v.elem);
    }
  }
  const int n = static_cast<int>(at.k.size());

  /* work: scaled queries (G x D), scores (G x n), strided keys' and a value's
   * scratch (16 x D + Dv), output accumulators (G x Dv), inverse softmax sums (G). */
  work.resize(static_cast<size_t>(G) * D + static_cast<size_t>(G) * n + VW * D + Dv +
              static_cast<size_t>(G) * Dv + G);
  float* qs = work.data();
  float* scores = qs + static_cast<size_t>(G) * D;
  float* key_scratch = scores + static_cast<size_t>(G) * n;
  float* value_scratch = key_scratch + VW * D;
  float* acc = value_scratch + Dv;
  float* inv = acc + static_cast<size_t>(G) * Dv;

  for (int h = 0; h < G; h++) {
    const int64_t at_head = (h0 + h) * g.q.s1;
    for (int d = 0; d < D; d++)
      qs[h * D + d] = read_float(qb, at_head + d * g.q.s3, g.q.elem) * g.scale;
  }
  float* out0 = g.out + (static_cast<int64_t>(b) * g.H + h0) * Dv;
  if (n == 0) { /* nothing attended (never for a decode query: it attends itself) */
    std::memset(out0, 0, sizeof(float) * G * Dv);
    return;
  }

  /* Scores, 16 keys at a time: each key row is read for the G query heads while in
   * L1, and the 16 dot products' lanes are added by one transposed tree (hsum16, the
   * same order as hsum1 for the keys left over). */
  const int full = D - D % VW;
  int c = 0;
#ifdef MLXLMB_AVX2_HALVES
  /* AVX2: every key alone, each score in 8-float halves (lanes.h): the same products,
   * sums and order (hsum16 adds each lane as hsum1 does); the 16-key block's 16-lane
   * accumulators spilled. */
  auto dot = [&](const float* qh, const float* kj) {
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int d = 0; d < full; d += VW) {
      lo = _mm256_add_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(kj + d)));
      hi = _mm256_add_ps(hi, _mm256_mul_ps(_mm256_loadu_ps(qh + d + 8),
                                           _mm256_loadu_ps(kj + d + 8)));
    }
    if (full < D) {
      const int t = D - full;
      lo = _mm256_add_ps(lo, _mm256_mul_ps(half_tail(qh + full, t), half_tail(kj + full, t)));
      const __m256 qt = t > 8 ? half_tail(qh + full + 8, t - 8) : _mm256_setzero_ps();
      const __m256 kt = t > 8 ? half_tail(kj + full + 8, t - 8) : _mm256_setzero_ps();
      hi = _mm256_add_ps(hi, _mm256_mul_ps(qt, kt));
    }
    return hsum_halves(lo, hi);
  };
#else
  auto dot_lanes = [&](const float* qh, const float* kj) {
    vf lanes = {0};
    for (int d = 0; d < full; d += VW) lanes += load(qh + d) * load(kj + d);
    if (full < D) lanes += load_tail(qh + full, D - full) * load_tail(kj + full, D - full);
    return lanes;
  };
  auto dot = [&](const float* qh, const float* kj) { return hsum1(dot_lanes(qh, kj)); };
  for (; c + VW <= n; c += VW) {
    const float* rows[VW];
    for (int i = 0; i < VW; i++)
      rows[i] = float_row(at.k[c + i], at.k_step[c + i], at.k_elem[c + i], D,
                          key_scratch + i * D);
    for (int h = 0; h < G; h++) {
      vf acc[VW];
      for (int i = 0; i < VW; i++) acc[i] = dot_lanes(qs + h * D, rows[i]);
      vf sums = hsum16(acc);
      store_vector(scores + h * n + c, sums);
    }
  }
#endif
  for (; c < n; c++) {  /* the keys left over (on AVX2, every key) */
    const float* kj = float_row(at.k[c], at.k_step[c], at.k_elem[c], D, key_scratch);
    for (int h = 0; h < G; h++) scores[h * n + c] = dot(qs + h * D, kj);
  }

  /* Softmax numerators and their sums, per query head. */
  for (int h = 0; h < G; h++) {
    float* sh = scores + h * n;
    inv[h] = 1.0f / exp_and_sum(sh, n, max_of(sh, n));
  }

  /* Weighted sums of the value rows, in slot order. */
  std::memset(acc, 0, sizeof(float) * G * Dv);
  for (c = 0; c < n; c++) {
    const float* vj = float_row(at.v[c], at.v_step[c], at.v_elem[c], Dv, value_scratch);
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
  auto task = [&g](int t) {
    thread_local std::vector<float> work;  // each thread's scratch, kept between calls
    thread_local SlotRows at;
    attend_one(g, t / g.n_kv, t % g.n_kv, work, at);
  };
  share_chunks(tasks, threads, task);
}

View view_of(const mx::array& a) {
  const auto& st = a.strides();
  return {a.data<void>(), st[0], st[1], st[2], st[3], float_type(a.dtype())};
}

/* Inputs: q, the keys of each segment, the values of each segment, then the mask (if
 * any). */
class DecodeAttention : public CpuPrimitive {
 public:
  DecodeAttention(mx::Stream stream, float scale, int segments)
      : CpuPrimitive(stream), scale_(scale), segments_(segments) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const auto& q = inputs[0];
    const auto& v0 = inputs[1 + segments_];
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    Geometry g;
    g.B = q.shape(0);
    g.H = q.shape(1);
    g.n_kv = inputs[1].shape(1);
    g.S = 0;
    for (int i = 0; i < segments_; i++) {
      const auto &k = inputs[1 + i], &v = inputs[1 + segments_ + i];
      g.segments.push_back({view_of(k), view_of(v), static_cast<int>(k.shape(2))});
      g.S += k.shape(2);
    }
    g.D = q.shape(3);
    g.Dv = v0.shape(3);
    g.scale = scale_;
    g.q = view_of(q);
    const size_t masked = 1 + 2 * static_cast<size_t>(segments_);
    g.mask = inputs.size() > masked ? view_of(inputs[masked]) : View{nullptr, 0, 0, 0, 0};
    run_on_cpu(inputs, out, [g, inputs, out]() mutable {
      FloatOut result(out);
      g.out = result.data();
      attend_all(g);
      result.finish();
    });
  }

  /* Gradients (training on the CPU, one query per row): those of the same attention
   * composed from MLX ops over the segments joined (masked slots at -inf). */
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const float scale = scale_;
    const int n = segments_;
    const auto s = stream();
    const size_t differentiable = 1 + 2 * static_cast<size_t>(n);
    std::optional<mx::array> mask;
    if (primals.size() > differentiable) mask = primals[differentiable];
    auto reference = [scale, n, s, mask](const std::vector<mx::array>& in) {
      std::vector<mx::array> ks(in.begin() + 1, in.begin() + 1 + n);
      std::vector<mx::array> vs(in.begin() + 1 + n, in.begin() + 1 + 2 * n);
      auto k = n == 1 ? ks[0] : mx::concatenate(ks, 2, s);
      auto v = n == 1 ? vs[0] : mx::concatenate(vs, 2, s);
      const int group = in[0].shape(1) / k.shape(1);
      k = mx::repeat(k, group, 1, s);
      v = mx::repeat(v, group, 1, s);
      auto scores = mx::matmul(mx::multiply(in[0], mx::array(scale), s),
                               mx::swapaxes(k, -1, -2, s), s);
      if (mask)
        scores = mx::where(*mask, scores,
                           mx::array(-std::numeric_limits<float>::infinity()), s);
      return std::vector<mx::array>{mx::matmul(mx::softmax(scores, -1, true, s), v, s)};
    };
    return reference_vjp(reference, primals, cotangents, argnums, differentiable);
  }

  const char* name() const override { return "DecodeAttention"; }

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const DecodeAttention&>(other);
    return scale_ == o.scale_ && segments_ == o.segments_;
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const auto &q = inputs[0], &v = inputs[1 + segments_];
    return {{q.shape(0), q.shape(1), 1, v.shape(3)}};
  }

 private:
  float scale_;
  int segments_;
};

}  // namespace

void set_attention_threads(int threads) {
  configured_threads = threads > 0 ? threads : 1;
}

int primitive_threads() { return configured_threads; }

/* q (B, H, 1, D); the keys (B, n_kv, S_i, D) and values (B, n_kv, S_i, Dv) of the
 * segments, in slot order, float32; mask boolean, broadcastable to (B, 1, 1, sum S_i)
 * (True = attend). */
mx::array decode_attention_segments(const mx::array& q, const std::vector<mx::array>& ks,
                                    const std::vector<mx::array>& vs, float scale,
                                    std::optional<mx::array> mask) {
  if (ks.empty() || ks.size() != vs.size())
    throw std::invalid_argument("decode_attention: as many key as value segments, at least one");
  if (q.ndim() != 4 || q.shape(2) != 1)
    throw std::invalid_argument("decode_attention: q (B, H, 1, D), k and v (B, n_kv, S, D)");
  const int B = q.shape(0), H = q.shape(1), n_kv = ks[0].shape(1);
  int S = 0;
  for (size_t i = 0; i < ks.size(); i++) {
    const auto &k = ks[i], &v = vs[i];
    if (k.ndim() != 4 || v.ndim() != 4 || k.shape(0) != B || v.shape(0) != B ||
        k.shape(1) != n_kv || v.shape(1) != n_kv || v.shape(2) != k.shape(2) ||
        k.shape(3) != q.shape(3) || v.shape(3) != vs[0].shape(3))
      throw std::invalid_argument("decode_attention: q, k and v shapes disagree");
    if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
      throw std::invalid_argument("decode_attention: q, k and v of one dtype");
    S += k.shape(2);
  }
  if (n_kv == 0 || H % n_kv != 0)
    throw std::invalid_argument("decode_attention: q, k and v shapes disagree");
  if (!float_dtype(q.dtype()))
    throw std::invalid_argument("decode_attention: float32, float16 or bfloat16");
  auto stream = cpu_stream();
  std::vector<mx::array> inputs = {q};
  inputs.insert(inputs.end(), ks.begin(), ks.end());
  inputs.insert(inputs.end(), vs.begin(), vs.end());
  if (mask) {
    if (mask->dtype() != mx::bool_)
      throw std::invalid_argument("decode_attention: the mask must be boolean");
    inputs.push_back(mx::broadcast_to(*mask, {B, 1, 1, S}, stream));
  }
  return mx::array({B, H, 1, vs[0].shape(3)}, q.dtype(),
                   std::make_shared<DecodeAttention>(stream, scale, static_cast<int>(ks.size())),
                   std::move(inputs));
}

/* q (B, H, 1, D), k (B, n_kv, S, D), v (B, n_kv, S, Dv), float32; mask boolean,
 * broadcastable to (B, 1, 1, S) (True = attend). */
mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, std::optional<mx::array> mask) {
  return decode_attention_segments(q, {k}, {v}, scale, mask);
}

}  // namespace mlxlmb
