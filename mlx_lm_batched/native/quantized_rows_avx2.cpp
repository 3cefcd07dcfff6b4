/* The decode-step rows (up to SMALL_ROWS) of quantized_linear for 4-, 5- and 8-bit MLX affine
 * weights on x86 CPUs with AVX2, FMA and F16C (the binary is built with -march=native per
 * CPU, see _native_build.py: elsewhere, ARM or an older x86, quantized_linear.cpp's
 * portable kernel serves).
 *
 * A decode step reads every weight once, and on a 2-core AMD EPYC the instructions per
 * weight, not memory, bound it. Dequantizing each weight to float32 and multiplying in
 * float costs about 7 vector instructions per 8 weights (widen the bytes to int32, convert,
 * scale and bias, multiply-add): one thread reached ~9-12 G weights a second where
 * llama.cpp, whose activations are rounded to 8 bits, reaches more with integer dot
 * products. Here the weights stay integers and the activations become integers too,
 * without losing float32's precision:
 *
 * - each input row is split per group into three signed 7-bit digits: with d = the group's
 *   largest |x| / 2^20, x ~ d * a for an integer |a| <= 2^20 (21 bits: a float32's own
 *   rounding, within a factor of 8 of the group's largest value), a = h * 2^14 + m * 2^7 + l
 *   with m and l in [-64, 63] and h in [-64, 64];
 * - the weights' bytes (4-bit: 16 bytes split into nibbles; 5-bit: gathered by a byte
 *   shuffle; 8-bit: as stored) are multiplied by each digit with u8 x s8 byte dot products
 *   (AVX-512 VNNI's vpdpbusd, or AVX2's vpmaddubsw + vpmaddwd: |q * digit| pairs stay below
 *   int16's limit, 2 * 255 * 64 = 32640, so both give the same integers) and combined
 *   exactly in int32 by Horner's rule, ((h.q) * 2^7 + m.q) * 2^7 + l.q: the sum of
 *   32 weights times the row's integers, exact;
 * - per 32 weights that integer becomes a float and is multiplied by scale * d into 8
 *   float lanes; the group's bias times the row's float sum of the group is added after,
 *   the layer's bias last: sum_g scale_g * sum(q * x) + bias_g * sum(x) = x . w.
 *
 * One thread, 4-bit weights: 1.4x (AVX2) to 1.65x (VNNI) the float kernel's weights a
 * second, within a few 1e-7 of the exact product (the float kernel: ~1e-7 to 4e-7).
 *
 * Each output is one chain whatever the number of input rows, the tile or the thread:
 * the integers are exact whatever their order, and the float steps run in K order for
 * every output, so a row gets the same bits alone as in a batch (batch invariance). The
 * sums are not MLX's (which dequantizes then multiplies): the outputs agree with
 * mx.quantized_matmul to float32 rounding.
 */
#include "quantized_rows.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "quantized_digits.h"

namespace mlxlmb {

namespace {

constexpr int WEIGHT_ROWS = 4;  // weight rows per block (one thread's unit of work)

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

/* Sums of 4 adjacent u8 x s8 products added to acc's int32 lanes. */
inline __m256i dot_bytes(__m256i acc, __m256i unsigned_bytes, __m256i signed_bytes) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, unsigned_bytes, signed_bytes);
#elif defined(__AVXVNNI__)
  return _mm256_dpbusd_avx_epi32(acc, unsigned_bytes, signed_bytes);
#else
  const __m256i pairs = _mm256_maddubs_epi16(unsigned_bytes, signed_bytes);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

/* pshufb control for one 8-value pack of 5-bit values starting at byte `at` of a 16-byte
 * source held in both halves: lane i gets the pack's byte 5i/8 and, where its 5 bits cross
 * into the next byte, that byte too (as a little-endian 16-bit word); -1 gives zero. */
inline __m256i pack5_control(char at) {
  return _mm256_setr_epi8(at, -1, -1, -1, char(at + 0), char(at + 1), -1, -1,
                          char(at + 1), -1, -1, -1, char(at + 1), char(at + 2), -1, -1,
                          char(at + 2), char(at + 3), -1, -1, char(at + 3), -1, -1, -1,
                          char(at + 3), char(at + 4), -1, -1, char(at + 4), -1, -1, -1);
}

/* The 32 values of a weight row from column k, BITS wide (a little-endian bit stream),
 * as 32 bytes in digit_order<BITS>'s order (quantized_digits.h). Reads only the 32
 * values' own bytes (a row's last values end its array). */
template <int BITS>
inline __m256i weight_bytes(const uint8_t* __restrict w, int k) {
  if constexpr (BITS == 4) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed),
                            _mm256_set1_epi8(15));
  } else if constexpr (BITS == 5) {
    // 20 bytes, 4 packs of 8 values in 5 bytes: bytes 0-15 and 12-19 (no read past them).
    const uint8_t* at = w + k / 8 * 5;
    const __m256i head = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    const __m256i tail = _mm256_broadcastsi128_si256(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at + 12)));
    const __m256i shifts = _mm256_setr_epi32(0, 5, 2, 7, 4, 1, 6, 3);  // 5i mod 8
    const __m256i five_bits = _mm256_set1_epi32(31);
    __m256i ints[4] = {_mm256_shuffle_epi8(head, pack5_control(0)),
                       _mm256_shuffle_epi8(head, pack5_control(5)),
                       _mm256_shuffle_epi8(head, pack5_control(10)),
                       _mm256_shuffle_epi8(tail, pack5_control(3))};
    for (int j = 0; j < 4; j++)
      ints[j] = _mm256_and_si256(_mm256_srlv_epi32(ints[j], shifts), five_bits);
    // Packed to bytes within 128-bit halves: the order digit_order<5> describes.
    return _mm256_packus_epi16(_mm256_packs_epi32(ints[0], ints[1]),
                               _mm256_packs_epi32(ints[2], ints[3]));
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k));
  }
}

/* 32 weights, centred (DigitScheme), times one row's block of digits as 8 float lanes: the
 * integers exact, one rounding into float (two for 8-bit weights). */
template <int BITS>
inline __m256 exact_dot(__m256i q, const int8_t* __restrict block) {
  using Scheme = DigitScheme<BITS>;
  const auto vector = [block](int j) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 32 * j));
  };
  const auto two = [&](int j, int shift) {  // digits j and j + 1 by Horner's rule
    return dot_bytes(_mm256_slli_epi32(dot_bytes(_mm256_setzero_si256(), q, vector(j)), shift),
                     q, vector(j + 1));
  };
  if constexpr (Scheme::COUNT == 3) {
    const __m256i sum = dot_bytes(_mm256_slli_epi32(two(0, 8), 8), q, vector(2));
    return _mm256_cvtepi32_ps(_mm256_sub_epi32(sum, vector(3)));
  } else {
    const __m256i high = _mm256_sub_epi32(two(0, 7), vector(4));
    const __m256i low = _mm256_sub_epi32(two(2, 7), vector(5));
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(high), _mm256_set1_ps(1 << 14),
                           _mm256_cvtepi32_ps(low));
  }
}

/* Outputs of MB input rows (from m0) by NB weight rows (from n0): each 32 weights are
 * taken apart once and multiplied with every input row. */
template <int BITS, typename S, int MB, int NB>
void tile(const QuantizedRows& p, const RowDigits<BITS>& xd, int m0, int n0, const uint8_t* w,
          size_t row_bytes, const S* __restrict scales, const S* __restrict biases) {
  const int groups = p.K / p.group;
  const uint8_t* row[NB];
  for (int r = 0; r < NB; r++) row[r] = w + static_cast<size_t>(n0 + r) * row_bytes;
  __m256 acc[MB][NB];
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) acc[i][r] = _mm256_setzero_ps();
  const size_t ahead = WEIGHT_ROWS * row_bytes;  // the same bytes of the next block
  for (int g = 0; g < groups; g++) {
    float scale[NB];
    for (int r = 0; r < NB; r++)
      scale[r] = scalar(scales[static_cast<size_t>(n0 + r) * groups + g]);
    __m256 step[MB][NB];  // scale * d: a float per 32 weights' integer
    for (int i = 0; i < MB; i++)
      for (int r = 0; r < NB; r++) step[i][r] = _mm256_set1_ps(scale[r] * xd.step(m0 + i, g));
    for (int k = g * p.group; k < (g + 1) * p.group; k += 32) {
      for (int r = 0; r < NB; r++) {
        _mm_prefetch(reinterpret_cast<const char*>(row[r] + ahead + k * BITS / 8), _MM_HINT_T0);
        const __m256i q = weight_bytes<BITS>(row[r], k);
        for (int i = 0; i < MB; i++) {
          const __m256 sum = exact_dot<BITS>(q, xd.block(m0 + i, k));
          acc[i][r] = _mm256_fmadd_ps(step[i][r], sum, acc[i][r]);
        }
      }
    }
  }
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) {
      float y = hsum8(acc[i][r]);
      float offsets = 0.0f;  // sum_g (bias_g + centre * scale_g) * sum(x over g), in g order
      for (int g = 0; g < groups; g++) {
        const size_t at = static_cast<size_t>(n0 + r) * groups + g;
        const float offset = scalar(biases[at]) + DigitScheme<BITS>::CENTRE * scalar(scales[at]);
        offsets += offset * xd.sum(m0 + i, g);
      }
      y += offsets;
      if (p.bias) y += p.bias[n0 + r];
      p.out[static_cast<size_t>(m0 + i) * p.N + n0 + r] = y;
    }
}

/* A block's `count` weight rows against every input row: 4 weight rows at a time for one
 * input row, 2 at a time for tiles of up to 4 input rows. */
template <int BITS, typename S>
void block(const QuantizedRows& p, const RowDigits<BITS>& xd, int n0, int count, const uint8_t* w,
           size_t row_bytes, const S* scales, const S* biases) {
  if (p.M == 1) {
    switch (count) {
      case 4: return tile<BITS, S, 1, 4>(p, xd, 0, n0, w, row_bytes, scales, biases);
      case 3: return tile<BITS, S, 1, 3>(p, xd, 0, n0, w, row_bytes, scales, biases);
      case 2: return tile<BITS, S, 1, 2>(p, xd, 0, n0, w, row_bytes, scales, biases);
      default: return tile<BITS, S, 1, 1>(p, xd, 0, n0, w, row_bytes, scales, biases);
    }
  }
  for (int r0 = 0; r0 < count; r0 += 2) {
    const int n = n0 + r0;
    const bool two = count - r0 >= 2;
    int m0 = 0;
    for (; m0 + 4 <= p.M; m0 += 4)
      two ? tile<BITS, S, 4, 2>(p, xd, m0, n, w, row_bytes, scales, biases)
          : tile<BITS, S, 4, 1>(p, xd, m0, n, w, row_bytes, scales, biases);
    for (; m0 < p.M; m0++)
      two ? tile<BITS, S, 1, 2>(p, xd, m0, n, w, row_bytes, scales, biases)
          : tile<BITS, S, 1, 1>(p, xd, m0, n, w, row_bytes, scales, biases);
  }
}

template <int BITS, typename S>
void run(const QuantizedRows& p, int threads) {
  const auto* scales = static_cast<const S*>(p.scales);
  const auto* biases = static_cast<const S*>(p.biases);
  const auto* w = reinterpret_cast<const uint8_t*>(p.w);
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const RowDigits<BITS> xd(p.x, p.M, p.K, p.group);
  const int blocks = (p.N + WEIGHT_ROWS - 1) / WEIGHT_ROWS;
  const int teams = std::max(1, std::min(threads, blocks));
#pragma omp parallel for num_threads(teams) schedule(static)
  for (int b = 0; b < blocks; b++) {
    const int n0 = b * WEIGHT_ROWS;
    block<BITS, S>(p, xd, n0, std::min(WEIGHT_ROWS, p.N - n0), w, row_bytes, scales, biases);
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
  if ((p.bits != 4 && p.bits != 5 && p.bits != 8) || p.group % 32 != 0) return false;
  if (p.bits == 4)
    run_bits<4>(p, threads);
  else if (p.bits == 5)
    run_bits<5>(p, threads);
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
