/* The decode-step rows (up to SMALL_ROWS) of quantized_linear for 4- and 8-bit MLX affine
 * weights on x86 CPUs with AVX2, FMA and F16C (the binary is built with -march=native per
 * CPU, see _native_build.py: elsewhere, ARM or an older x86, quantized_linear.cpp's
 * portable kernel serves).
 *
 * A decode step is bound by reading the weights once: SmolLM2-135M's Q4_1 GGUF streams
 * about 85 MB per step. Per group of `group` weights, w = scale * q + bias, so
 *
 *     sum_k x_k w_k = scale * sum_k x_k q_k + bias * sum_k x_k,
 *
 * and the kernel multiplies the integer values q (exact as floats) with x and scales each
 * group's sum once, rather than dequantizing every weight. Per tile of input rows and 4
 * weight rows, 16 weights of each row at a time are unpacked in registers (8 bytes of
 * nibbles widened to 8 int32 lanes, the low and the high nibbles split by a mask and a
 * shift, converted; or 16 bytes of 8-bit values) and multiplied with every input row of the
 * tile, whose values `prepare` put once in the order the nibbles come out. The groups'
 * input sums for the biases are computed once per call too. The scales and biases are
 * read in their own dtype (float32, float16 by F16C, bfloat16). An earlier version
 * dequantized 4 weight rows into an L1 buffer and multiplied from there: about twice the
 * instructions per weight, half the speed at one row.
 *
 * Each output is one chain of operations whatever the number of input rows, the tile or
 * the thread that computes it (see `tile`): a row gets the same bits alone as in a batch
 * (batch invariance). The sums are not the portable kernel's or MLX's: all agree with
 * mx.quantized_matmul to float32 rounding.
 */
#include "quantized_rows.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace mlxlmb {

namespace {

constexpr int WEIGHT_ROWS = 4;  // weight rows unpacked and multiplied together
constexpr int INPUT_ROWS = 2;   // input rows per tile: 2 x 4 x 3 accumulators, 8 weight vectors
/* How far ahead (in weight rows) the weights are prefetched: the 4 rows a tile reads at
 * once are 4 short streams, which the hardware prefetcher followed worse than one long
 * one (an 8-bit 49152 x 576 LM head read at half the bandwidth). */
constexpr int PREFETCH_ROWS = 8;

inline float scalar(float v) { return v; }
inline float scalar(uint16_t half) { return _cvtsh_ss(half); }
struct Bf16 { uint16_t bits; };
inline float scalar(Bf16 v) {
  const uint32_t word = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &word, sizeof f);
  return f;
}

/* The 8 lanes added in one order: lane l with l + 4, then l with l + 2, then 0 with 1. */
inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}

/* Each input row prepared for the kernel: for 4 bits, every block of 32 values reordered
 * as the packed bytes unpack (see Block below), and the row's sum over each group (for the
 * groups' biases), added in one fixed order. 8-bit rows are read in place. */
struct Inputs {
  std::vector<float> ordered;  // (M, K) for 4 bits, else empty
  std::vector<float> sums;     // (M, K / group)
  const float* rows;           // ordered.data() or p.x
};

Inputs prepare(const QuantizedRows& p) {
  Inputs in;
  const int groups = p.K / p.group;
  in.sums.resize(static_cast<size_t>(p.M) * groups);
  in.rows = p.x;
  if (p.bits == 4) {
    in.ordered.resize(static_cast<size_t>(p.M) * p.K);
    for (int m = 0; m < p.M; m++)
      for (int b = 0; b < p.K / 32; b++) {
        const float* src = p.x + static_cast<size_t>(m) * p.K + 32 * b;
        float* dst = in.ordered.data() + static_cast<size_t>(m) * p.K + 32 * b;
        for (int h = 0; h < 2; h++)      // bytes 8h .. 8h + 7 of the block's 16
          for (int l = 0; l < 8; l++) {  // byte 8h + l: elements 2(8h + l) and the next
            dst[16 * h + l] = src[2 * (8 * h + l)];
            dst[16 * h + 8 + l] = src[2 * (8 * h + l) + 1];
          }
      }
    in.rows = in.ordered.data();
  }
  for (int m = 0; m < p.M; m++)
    for (int g = 0; g < groups; g++) {
      const float* xg = p.x + static_cast<size_t>(m) * p.K + static_cast<size_t>(g) * p.group;
      __m256 lanes = _mm256_setzero_ps();
      for (int k = 0; k < p.group; k += 8) lanes = _mm256_add_ps(lanes, _mm256_loadu_ps(xg + k));
      in.sums[static_cast<size_t>(m) * groups + g] = hsum8(lanes);
    }
  return in;
}

/* The integer values of 16 weights (8 bytes of 4-bit pairs or 16 bytes of 8-bit values
 * from `w`) as two vectors of 8 floats, `first` and `second`, in the order the prepared
 * input rows hold their values: 4 bits: byte l's low nibbles, then its high nibbles;
 * 8 bits: 8 values, then the next 8. */
template <int BITS>
inline void unpack16(const uint8_t* __restrict w, __m256& first, __m256& second) {
  if constexpr (BITS == 4) {
    const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w)));
    const __m256i low = _mm256_set1_epi32(15);
    first = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, low));
    second = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
  } else {
    first = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w))));
    second = _mm256_cvtepi32_ps(
        _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + 8))));
  }
}

/* Outputs of MB input rows (from m0) by NB weight rows (from n0), the weights unpacked in
 * registers and shared by the MB rows. Per output and group: two 8-lane sums of x * q
 * (the first and the second vector of every 16 weights, along K in order), then
 * acc += (both sums) * scale; the groups' biases times the input's group sums add up in a
 * scalar beside it; at the end the 8 lanes of acc in hsum8's order, that sum, the bias.
 * The chain is the same for every MB, NB and thread: batch invariance. */
template <int BITS, typename S, int MB, int NB>
void tile(const QuantizedRows& p, const Inputs& in, int m0, int n0) {
  const int groups = p.K / p.group;
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const auto* scales = static_cast<const S*>(p.scales);
  const auto* biases = static_cast<const S*>(p.biases);
  const uint8_t* w[NB];
  for (int r = 0; r < NB; r++)
    w[r] = reinterpret_cast<const uint8_t*>(p.w) + static_cast<size_t>(n0 + r) * row_bytes;
  const float* x[MB];
  for (int i = 0; i < MB; i++) x[i] = in.rows + static_cast<size_t>(m0 + i) * p.K;
  __m256 acc[MB][NB];
  float offsets[MB][NB];
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) {
      acc[i][r] = _mm256_setzero_ps();
      offsets[i][r] = 0.0f;
    }
  for (int g = 0; g < groups; g++) {
    __m256 even[MB][NB], odd[MB][NB];
    for (int i = 0; i < MB; i++)
      for (int r = 0; r < NB; r++) even[i][r] = odd[i][r] = _mm256_setzero_ps();
    for (int k = g * p.group; k < (g + 1) * p.group; k += 16) {
      __m256 first[NB], second[NB];
      for (int r = 0; r < NB; r++) {
        const uint8_t* at = w[r] + k * BITS / 8;
        _mm_prefetch(reinterpret_cast<const char*>(at + PREFETCH_ROWS * row_bytes), _MM_HINT_T0);
        unpack16<BITS>(at, first[r], second[r]);
      }
      for (int i = 0; i < MB; i++) {
        const __m256 x0 = _mm256_loadu_ps(x[i] + k), x1 = _mm256_loadu_ps(x[i] + k + 8);
        for (int r = 0; r < NB; r++) {
          even[i][r] = _mm256_fmadd_ps(first[r], x0, even[i][r]);
          odd[i][r] = _mm256_fmadd_ps(second[r], x1, odd[i][r]);
        }
      }
    }
    for (int r = 0; r < NB; r++) {
      const size_t at = static_cast<size_t>(n0 + r) * groups + g;
      const __m256 s = _mm256_set1_ps(scalar(scales[at]));
      const float b = scalar(biases[at]);
      for (int i = 0; i < MB; i++) {
        acc[i][r] = _mm256_fmadd_ps(_mm256_add_ps(even[i][r], odd[i][r]), s, acc[i][r]);
        offsets[i][r] += b * in.sums[static_cast<size_t>(m0 + i) * groups + g];
      }
    }
  }
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) {
      float y = hsum8(acc[i][r]) + offsets[i][r];
      if (p.bias) y += p.bias[n0 + r];
      p.out[static_cast<size_t>(m0 + i) * p.N + n0 + r] = y;
    }
}

/* Every input row against NB weight rows. */
template <int BITS, typename S, int NB>
void all_rows(const QuantizedRows& p, const Inputs& in, int n0) {
  int m0 = 0;
  for (; m0 + INPUT_ROWS <= p.M; m0 += INPUT_ROWS) tile<BITS, S, INPUT_ROWS, NB>(p, in, m0, n0);
  for (; m0 < p.M; m0++) tile<BITS, S, 1, NB>(p, in, m0, n0);
}

template <int BITS, typename S>
void run(const QuantizedRows& p, int threads) {
  const Inputs in = prepare(p);
  const int blocks = (p.N + WEIGHT_ROWS - 1) / WEIGHT_ROWS;
  const int teams = std::max(1, std::min(threads, blocks));
#pragma omp parallel for num_threads(teams) schedule(static)
  for (int b = 0; b < blocks; b++) {
    const int n0 = b * WEIGHT_ROWS;
    switch (std::min(WEIGHT_ROWS, p.N - n0)) {
      case 4: all_rows<BITS, S, 4>(p, in, n0); break;
      case 3: all_rows<BITS, S, 3>(p, in, n0); break;
      case 2: all_rows<BITS, S, 2>(p, in, n0); break;
      default: all_rows<BITS, S, 1>(p, in, n0);
    }
  }
}

template <int BITS>
void run_bits(const QuantizedRows& p, int threads) {
  switch (p.scale_type) {
    case ScaleType::float16: run<BITS, uint16_t>(p, threads); break;
    case ScaleType::bfloat16: run<BITS, Bf16>(p, threads); break;
    default: run<BITS, float>(p, threads);
  }
}

}  // namespace

bool quantized_rows_fast(const QuantizedRows& p, int threads) {
  if ((p.bits != 4 && p.bits != 8) || p.group % 32 != 0) return false;
  if (p.bits == 4)
    run_bits<4>(p, threads);
  else
    run_bits<8>(p, threads);
  return true;
}

}  // namespace mlxlmb

#else  // no AVX2 / FMA / F16C in this build: quantized_linear.cpp's portable kernel serves

namespace mlxlmb {
bool quantized_rows_fast(const QuantizedRows&, int) { return false; }
}  // namespace mlxlmb

#endif
