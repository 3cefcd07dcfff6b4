/* A linear layer with a float16 or bfloat16 weight, x @ W^T (+ bias), for MLX's CPU
 * backend, as one MLX primitive.
 *
 * Most checkpoints on the Hugging Face hub are bfloat16, and `load` keeps their dtype (as
 * mlx-lm does). MLX's CPU matmul of half-precision operands skips the BLAS: a bfloat16
 * SmolLM2-135M decoded at 8-19 tok/s and prefilled at about 20 tok/s, where its float32
 * copy runs 35-280 and 350-520 (2-core AMD EPYC). Here:
 *
 * - up to SMALL_ROWS input rows (decode steps), each weight row is read once in its own
 *   dtype, half the bytes of float32, converted in registers (bfloat16: a shift; float16:
 *   F16C) and multiplied at once by every input row of a pass of 4: one 8-lane accumulator
 *   per output, one fused multiply-add per 8 weights along K in order, the lanes added in
 *   one fixed order (hsum8), blocks of weight rows shared out by shared_work.h. Every
 *   output is that chain whatever the rows, the pass or the thread: a row's bits do not
 *   depend on the batch;
 * - more rows (prefill), blocks of weight rows are converted to float32 and multiplied by
 *   the BLAS (`sgemm_nt`), blocks handed to our threads as they come free (`for_blocks`,
 *   split_gemm.cpp).
 *
 * Inputs of any float dtype are computed in float32, the output rounded once to the dtype
 * MLX's matmul gives (float16 or bfloat16 when both operands are; float32 with a float32
 * input). Builds without AVX2, FMA and F16C take the same structure in scalar code.
 */
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_prims.h"
#include "shared_work.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#define MLXLMB_HALF_AVX2 1
#endif

namespace mlxlmb {

namespace {

constexpr int SMALL_ROWS = 64;   // as quantized_linear.cpp: decode steps below, prefill above
constexpr int WEIGHT_ROWS = 4;   // weight rows per block (one thread's unit of work)

struct Problem {
  int M, N, K;
  bool bf16;              // the weight's dtype (else float16)
  const float* x;         // (M, K) row-major
  const uint16_t* w;      // (N, K) row-major, half bits
  const float* bias;      // (N,) or null
  float* out;             // (M, N) row-major
};

/* Weight row n's K values as float32 into `dst`. */
inline void weight_row(const Problem& p, int n, float* dst) {
  const uint16_t* row = p.w + static_cast<size_t>(n) * p.K;
  if (p.bf16)
    bf16_to_float(row, dst, p.K);
  else
    f16_to_float(reinterpret_cast<const mx::float16_t*>(row), dst, p.K);
}

#ifdef MLXLMB_HALF_AVX2
template <bool BF16>
inline __m256 load8(const uint16_t* w) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w));
  if constexpr (BF16)
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  else
    return _mm256_cvtph_ps(h);
}

/* MB input rows (from m0) by NB weight rows (from n0): the chain above. The last K % 8
 * values are one more step of 8 lanes, zero-padded. */
template <bool BF16, int MB, int NB>
void tile(const Problem& p, int m0, int n0) {
  const int K8 = p.K - p.K % 8;
  __m256 acc[MB][NB];
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) acc[i][r] = _mm256_setzero_ps();
  const uint16_t* w[NB];
  for (int r = 0; r < NB; r++) w[r] = p.w + static_cast<size_t>(n0 + r) * p.K;
  const float* x[MB];
  for (int i = 0; i < MB; i++) x[i] = p.x + static_cast<size_t>(m0 + i) * p.K;
  for (int k = 0; k < K8; k += 8) {
    for (int r = 0; r < NB; r++) {
      const __m256 wv = load8<BF16>(w[r] + k);
      for (int i = 0; i < MB; i++)
        acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[i] + k), wv, acc[i][r]);
    }
  }
  if (K8 < p.K) {
    alignas(32) uint16_t wt[8] = {0};
    alignas(32) float xt[8] = {0};
    for (int r = 0; r < NB; r++) {
      std::memcpy(wt, w[r] + K8, sizeof(uint16_t) * (p.K - K8));
      const __m256 wv = load8<BF16>(wt);
      for (int i = 0; i < MB; i++) {
        std::memcpy(xt, x[i] + K8, sizeof(float) * (p.K - K8));
        acc[i][r] = _mm256_fmadd_ps(_mm256_load_ps(xt), wv, acc[i][r]);
      }
    }
  }
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) {
      float y = hsum8(acc[i][r]);
      if (p.bias) y += p.bias[n0 + r];
      p.out[static_cast<size_t>(m0 + i) * p.N + n0 + r] = y;
    }
}

/* A block's `count` weight rows against MB input rows: 4 weight rows at a time for one
 * input row, 2 for more (AVX2's 16 registers). */
template <bool BF16, int MB>
void block(const Problem& p, int m0, int n0, int count) {
  if constexpr (MB == 1) {
    switch (count) {
      case 4: tile<BF16, 1, 4>(p, m0, n0); break;
      case 3: tile<BF16, 1, 3>(p, m0, n0); break;
      case 2: tile<BF16, 1, 2>(p, m0, n0); break;
      default: tile<BF16, 1, 1>(p, m0, n0);
    }
  } else {
    for (int r0 = 0; r0 < count; r0 += 2) {
      if (count - r0 >= 2)
        tile<BF16, MB, 2>(p, m0, n0 + r0);
      else
        tile<BF16, MB, 1>(p, m0, n0 + r0);
    }
  }
}

template <bool BF16>
void rows_of(const Problem& p, int n0, int count) {
  for (int m0 = 0; m0 < p.M; m0 += 4) {
    switch (std::min(4, p.M - m0)) {
      case 4: block<BF16, 4>(p, m0, n0, count); break;
      case 3: block<BF16, 3>(p, m0, n0, count); break;
      case 2: block<BF16, 2>(p, m0, n0, count); break;
      default: block<BF16, 1>(p, m0, n0, count);
    }
  }
}
#else
/* Without AVX2: the same structure in scalar code, 8 lanes along K, mul then add. */
void rows_of_portable(const Problem& p, int n0, int count) {
  std::vector<float> w(p.K);
  for (int r = 0; r < count; r++) {
    weight_row(p, n0 + r, w.data());
    for (int m = 0; m < p.M; m++) {
      const float* x = p.x + static_cast<size_t>(m) * p.K;
      float lanes[8] = {0};
      for (int k = 0; k < p.K; k++) lanes[k % 8] += x[k] * w[k];
      float y = ((lanes[0] + lanes[4]) + (lanes[2] + lanes[6])) +
                ((lanes[1] + lanes[5]) + (lanes[3] + lanes[7]));
      if (p.bias) y += p.bias[n0 + r];
      p.out[static_cast<size_t>(m) * p.N + n0 + r] = y;
    }
  }
}
#endif

void small_rows(const Problem& p, int threads) {
  auto block = [&p](int b) {
    const int n0 = b * WEIGHT_ROWS, count = std::min(WEIGHT_ROWS, p.N - n0);
#ifdef MLXLMB_HALF_AVX2
    if (p.bf16)
      rows_of<true>(p, n0, count);
    else
      rows_of<false>(p, n0, count);
#else
    rows_of_portable(p, n0, count);
#endif
  };
  share_blocks((p.N + WEIGHT_ROWS - 1) / WEIGHT_ROWS, threads, block);
}

/* A prefill's rows: weight rows converted to float32 a block at a time for the BLAS. */
void many_rows(const Problem& p, int threads) {
  gemm_converted_rows(p.M, p.N, p.K, p.x, p.bias, p.out, threads,
                      [&](int n, float* row) { weight_row(p, n, row); });
}

class HalfLinear : public LinearPrimitive {
 public:
  using LinearPrimitive::LinearPrimitive;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto& out = outputs[0];
    out.set_data(mx::allocator::malloc(out.nbytes()));
    run_on_cpu(inputs, out, [inputs, out]() mutable {
      const auto& x = inputs[0];
      const auto& w = inputs[1];
      const int K = x.shape(-1), N = w.shape(0);
      const int M = static_cast<int>(x.size() / (K > 0 ? K : 1));
      FloatOut result(out);
      if (M == 0 || N == 0) return;
      std::vector<float> x_copy, bias_copy;
      std::vector<uint16_t> w_copy;
      Problem p{M, N, K, w.dtype() == mx::bfloat16, float_rows(x, x_copy),
                row_major<uint16_t>(w, w_copy),  /* the half bits, as stored */
                inputs.size() > 2 ? float_rows(inputs[2], bias_copy) : nullptr, result.data()};
      if (M <= SMALL_ROWS)
        small_rows(p, primitive_threads());
      else
        many_rows(p, primitive_threads());
      result.finish();
    });
  }

  const char* name() const override { return "MlxlmbHalfLinear"; }
};

}  // namespace

mx::array half_linear(const mx::array& x, const mx::array& weight, std::optional<mx::array> bias) {
  if (x.ndim() < 1 || !float_dtype(x.dtype()))
    throw std::invalid_argument("half_linear: a float32, float16 or bfloat16 input");
  if (weight.dtype() != mx::float16 && weight.dtype() != mx::bfloat16)
    throw std::invalid_argument("half_linear: a float16 or bfloat16 weight");
  if (weight.ndim() != 2 || weight.shape(1) != x.shape(-1))
    throw std::invalid_argument("half_linear: the weight must be (N, K) for an input (..., K)");
  std::vector<mx::array> inputs = {x, weight};
  auto dtype = mx::promote_types(x.dtype(), weight.dtype());
  if (bias) {
    if (!float_dtype(bias->dtype()) || bias->ndim() != 1 || bias->shape(0) != weight.shape(0))
      throw std::invalid_argument("half_linear: the bias must be a float array of shape (N,)");
    inputs.push_back(*bias);
    dtype = mx::promote_types(dtype, bias->dtype());
  }
  auto shape = x.shape();
  shape.back() = weight.shape(0);
  return mx::array(std::move(shape), dtype, std::make_shared<HalfLinear>(cpu_stream()),
                   std::move(inputs));
}

}  // namespace mlxlmb
