/* The decode-step rows (up to SMALL_ROWS) of quantized_linear for 4-, 5- and 8-bit MLX affine
 * weights on x86 CPUs with AVX2, FMA and F16C (the binary is built with -march=native per
 * CPU, see _native_build.py: elsewhere, ARM or an older x86, quantized_linear.cpp's
 * portable kernel serves).
 *
 * A decode step reads every weight once (SmolLM2-135M's Q4_1 GGUF: about 85 MB); at one
 * row the instructions per weight, not memory, bound this kernel on a 2-core AMD EPYC.
 * The portable kernel unpacked each weight row into floats byte by byte, took the
 * group's f16 scales and biases as float32 copies of the whole arrays on every call (1.7 M
 * values for the 49152-row LM head alone) and summed with separate multiplies and adds.
 * Here, per block of 4 weight rows, input rows 4 at a time (a pass per 4 input rows):
 *
 * - each weight row's 32 values at a time are dequantized in registers: 16 bytes of
 *   nibbles split and interleaved into element order (or 20 bytes of 5-bit values gathered
 *   by a byte shuffle and shifted, GGUF's Q5 types; or 32 bytes of 8-bit values), widened
 *   to int32, converted, and w = scale * q + bias in one fused multiply-add, the group's
 *   scale and bias read in their own dtype (float32, float16 by F16C, bfloat16); on
 *   AVX-512 builds 4-bit weights are instead looked up among the group's 16 possible
 *   weights (the same values in fewer instructions, below);
 * - and used at once by every input row of the pass: one 8-lane accumulator per output, one
 *   fused multiply-add per 8 weights along K in order, the 8 lanes added in one fixed order
 *   at the end (hsum8), then the layer's bias; 4 weight rows at a time for one input row,
 *   2 for more (AVX2's 16 registers); the next block's weight bytes are prefetched (the
 *   prefetch alone was 1.3x at one row on 4-bit rows and 2.2x on an 8-bit LM head).
 *
 * One thread, 4-bit rows, an AMD EPYC: about 9 G weights a second at one row; with the
 * lookup (0.8.8) 1.2-1.46x that from the cache (4096 x 4096), 1.07-1.1x with
 * the weights streamed from memory, equal from 4 rows, where each dequantized weight serves
 * several input rows; a 3.4 B-parameter Q4_1 model decodes 1.15x faster at batch 1
 * (docs/performance.md). Up to 0.8.5,
 * 5 or more input rows took the weights dequantized once into an L1 buffer and read back
 * per 2 input rows; dequantizing again per 4 input rows instead (the block's weight bytes
 * stay in L1) was 1.3-1.8x that at 5-12 rows, 1.1-1.15x at 16-24 and equal at 32-64 (one
 * thread, SmolLM2's 4- and 8-bit shapes, 0.8.6), and leaves one path for every row count.
 *
 * Each output is that one chain of operations whatever the number of input rows, the tile
 * or the thread that computes it: a row gets the same bits alone as in a batch (batch
 * invariance). The sums are not the portable kernel's (which sums x * q per group before
 * scaling): both agree with mx.quantized_matmul to float32 rounding.
 */
#include "quantized_rows.h"
#include "shared_work.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

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

/* pshufb control for one 8-value pack of 5-bit values starting at byte `at` of a 16-byte
 * source held in both halves: lane i gets the pack's byte 5i/8 and, where its 5 bits cross
 * into the next byte, that byte too (as a little-endian 16-bit word); -1 gives zero. */
inline __m256i pack5_control(char at) {
  return _mm256_setr_epi8(at, -1, -1, -1, char(at + 0), char(at + 1), -1, -1,
                          char(at + 1), -1, -1, -1, char(at + 1), char(at + 2), -1, -1,
                          char(at + 2), char(at + 3), -1, -1, char(at + 3), -1, -1, -1,
                          char(at + 3), char(at + 4), -1, -1, char(at + 4), -1, -1, -1);
}

/* The 32 values of weight row `w` from column k, BITS wide (4, 5 or 8; a little-endian bit
 * stream, element i at bits [i * BITS, (i + 1) * BITS)), as 4 x 8 int32 lanes in element
 * order. Reads only the 32 values' own bytes (a row's last values end its array). */
template <int BITS>
inline void unpack32(const uint8_t* __restrict w, int k, __m256i ints[4]) {
  if constexpr (BITS == 4) {
    const __m128i low_nibbles = _mm_set1_epi8(15);
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w + k / 2));
    const __m128i lo = _mm_and_si128(packed, low_nibbles);
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(packed, 4), low_nibbles);
    const __m128i first = _mm_unpacklo_epi8(lo, hi), second = _mm_unpackhi_epi8(lo, hi);
    ints[0] = _mm256_cvtepu8_epi32(first);
    ints[1] = _mm256_cvtepu8_epi32(_mm_srli_si128(first, 8));
    ints[2] = _mm256_cvtepu8_epi32(second);
    ints[3] = _mm256_cvtepu8_epi32(_mm_srli_si128(second, 8));
  } else if constexpr (BITS == 5) {
    // 20 bytes, 4 packs of 8 values in 5 bytes: bytes 0-15 and 12-19 (no read past them).
    const uint8_t* at = w + k / 8 * 5;
    const __m256i head = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(at)));
    const __m256i tail = _mm256_broadcastsi128_si256(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(at + 12)));
    const __m256i shifts = _mm256_setr_epi32(0, 5, 2, 7, 4, 1, 6, 3);  // 5i mod 8
    const __m256i five_bits = _mm256_set1_epi32(31);
    const __m256i words[4] = {_mm256_shuffle_epi8(head, pack5_control(0)),
                              _mm256_shuffle_epi8(head, pack5_control(5)),
                              _mm256_shuffle_epi8(head, pack5_control(10)),
                              _mm256_shuffle_epi8(tail, pack5_control(3))};
    for (int j = 0; j < 4; j++)
      ints[j] = _mm256_and_si256(_mm256_srlv_epi32(words[j], shifts), five_bits);
  } else {
    for (int j = 0; j < 4; j++)
      ints[j] = _mm256_cvtepu8_epi32(
          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + k + 8 * j)));
  }
}

/* 8 of those values as weights: scale * q + bias in one fused multiply-add. */
inline __m256 weights8(__m256i ints, __m256 scale, __m256 bias) {
  return _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(ints), bias);
}

#if defined(__AVX512F__) && defined(__AVX512VL__)
/* 4-bit weights on AVX-512 builds: a group's 16 possible weights, fma(scale, q, bias) for
 * q = 0..15, are two registers, and 8 weights are one lookup (`vpermt2ps`, whose 256-bit
 * form needs AVX-512 VL) by their nibbles, each shifted to the bottom of its lane
 * (`vpsrlvd` of the 32-bit word that holds the 8 values; the lookup reads an index's low
 * 4 bits only): the same values as weights8 on unpack32's integers, in 2 instructions for
 * 8 weights instead of about 5, so the same bits as the AVX2 build's. */
#define MLXLMB_LOOKUP_4BIT 1

struct Lookup16 {
  __m256 low, high;  // the weights of q = 0..7 and 8..15
};

inline Lookup16 lookup16(__m256 scale, __m256 bias) {
  const __m256 q = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  return {_mm256_fmadd_ps(scale, q, bias),
          _mm256_fmadd_ps(scale, _mm256_add_ps(q, _mm256_set1_ps(8)), bias)};
}

/* The 8 weights of a 4-bit row from column k (k a multiple of 8). */
inline __m256 looked_up8(const Lookup16& table, const uint8_t* __restrict w, int k) {
  int32_t word;
  std::memcpy(&word, w + k / 2, sizeof word);
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i at = _mm256_srlv_epi32(_mm256_set1_epi32(word), shifts);
  return _mm256_permutex2var_ps(table.low, at, table.high);
}
#endif

/* One weight row's group, its weights 32 at a time as float32: fma(scale, q, bias) of the
 * unpacked integers, or on AVX-512 builds for 4-bit weights the same values looked up. */
template <int BITS>
struct GroupWeights {
  __m256 scale, bias;
#ifdef MLXLMB_LOOKUP_4BIT
  Lookup16 table;  // for 4-bit weights
#endif

  GroupWeights() = default;
  GroupWeights(float s, float b) : scale(_mm256_set1_ps(s)), bias(_mm256_set1_ps(b)) {
#ifdef MLXLMB_LOOKUP_4BIT
    if constexpr (BITS == 4) table = lookup16(scale, bias);
#endif
  }

  /* Weight row w's 32 weights from column k, 8 to a register. */
  void weights32(const uint8_t* __restrict w, int k, __m256 out[4]) const {
#ifdef MLXLMB_LOOKUP_4BIT
    if constexpr (BITS == 4) {
      for (int j = 0; j < 4; j++) out[j] = looked_up8(table, w, k + 8 * j);
      return;
    }
#endif
    __m256i ints[4];
    unpack32<BITS>(w, k, ints);
    for (int j = 0; j < 4; j++) out[j] = weights8(ints[j], scale, bias);
  }
};

/* MB input rows (1 to 4, from m0) by NB weight rows (from n0), each weight dequantized in
 * registers and used at once: w = fma(scale, q, bias) rounded to float32, then
 * acc = fma(x, w, acc) along K 8 lanes at a time, hsum8, the bias. The same chain for every
 * output whatever MB, NB or the pass: a row's bits are those of any batch. */
template <int BITS, typename S, int MB, int NB>
void in_registers(const QuantizedRows& p, int m0, int n0, const uint8_t* __restrict w,
                  size_t row_bytes, const S* __restrict scales, const S* __restrict biases) {
  const int groups = p.K / p.group;
  const uint8_t* row[NB];
  for (int r = 0; r < NB; r++) row[r] = w + static_cast<size_t>(n0 + r) * row_bytes;
  const float* x[MB];
  for (int i = 0; i < MB; i++) x[i] = p.x + static_cast<size_t>(m0 + i) * p.K;
  __m256 acc[MB][NB];
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) acc[i][r] = _mm256_setzero_ps();
  const size_t ahead = WEIGHT_ROWS * row_bytes;  // the same bytes of the next block
  for (int g = 0; g < groups; g++) {
    GroupWeights<BITS> group[NB];
    for (int r = 0; r < NB; r++) {
      const size_t at = static_cast<size_t>(n0 + r) * groups + g;
      group[r] = GroupWeights<BITS>(scalar(scales[at]), scalar(biases[at]));
    }
    for (int k = g * p.group; k < (g + 1) * p.group; k += 32) {
      for (int r = 0; r < NB; r++) {
        _mm_prefetch(reinterpret_cast<const char*>(row[r] + ahead + k * BITS / 8), _MM_HINT_T0);
        __m256 wv[4];
        group[r].weights32(row[r], k, wv);
        for (int j = 0; j < 4; j++)
          for (int i = 0; i < MB; i++)
            acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(x[i] + k + 8 * j), wv[j], acc[i][r]);
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

/* A block's `count` weight rows against all MB input rows in registers: 4 weight rows at a
 * time for one input row, 2 for more (MB x 2 accumulators, 2 scales and 2 biases fit
 * AVX2's 16 registers). */
template <int BITS, typename S, int MB>
void block_in_registers(const QuantizedRows& p, int m0, int n0, int count, const uint8_t* w,
                        size_t row_bytes, const S* scales, const S* biases) {
  if constexpr (MB == 1) {
    switch (count) {
      case 4: in_registers<BITS, S, 1, 4>(p, m0, n0, w, row_bytes, scales, biases); break;
      case 3: in_registers<BITS, S, 1, 3>(p, m0, n0, w, row_bytes, scales, biases); break;
      case 2: in_registers<BITS, S, 1, 2>(p, m0, n0, w, row_bytes, scales, biases); break;
      default: in_registers<BITS, S, 1, 1>(p, m0, n0, w, row_bytes, scales, biases);
    }
  } else {
    for (int r0 = 0; r0 < count; r0 += 2) {
      if (count - r0 >= 2)
        in_registers<BITS, S, MB, 2>(p, m0, n0 + r0, w, row_bytes, scales, biases);
      else
        in_registers<BITS, S, MB, 1>(p, m0, n0 + r0, w, row_bytes, scales, biases);
    }
  }
}

/* Block b of layer p (its WEIGHT_ROWS weight rows from b * WEIGHT_ROWS) against every
 * input row in registers, the input rows 4 at a time (each pass dequantizes the block's
 * weights again: they stay in L1). */
template <int BITS, typename S>
void one_block(const QuantizedRows& p, int b) {
  const auto* scales = static_cast<const S*>(p.scales);
  const auto* biases = static_cast<const S*>(p.biases);
  const auto* w = reinterpret_cast<const uint8_t*>(p.w);
  const size_t row_bytes = static_cast<size_t>(p.K) * BITS / 8;
  const int n0 = b * WEIGHT_ROWS, count = std::min(WEIGHT_ROWS, p.N - n0);
  for (int m0 = 0; m0 < p.M; m0 += 4) {
    const auto pass = [&](auto rows) {
      block_in_registers<BITS, S, decltype(rows)::value>(p, m0, n0, count, w, row_bytes,
                                                         scales, biases);
    };
    switch (std::min(4, p.M - m0)) {
      case 4: pass(std::integral_constant<int, 4>{}); break;
      case 3: pass(std::integral_constant<int, 3>{}); break;
      case 2: pass(std::integral_constant<int, 2>{}); break;
      default: pass(std::integral_constant<int, 1>{});
    }
  }
}

/* Every block of every layer in `parts`, the layers' blocks in a row, shared out in
 * chunks of consecutive blocks (shared_work.h: the calling thread starts at once, helpers
 * join as they wake). A block is computed as it would be alone. */
template <int BITS, typename S>
void run(const QuantizedRows* parts, int count, int threads) {
  std::vector<int> first(count + 1, 0);  // first[i]: the index of layer i's first block
  for (int i = 0; i < count; i++)
    first[i + 1] = first[i] + (parts[i].N + WEIGHT_ROWS - 1) / WEIGHT_ROWS;
  auto block = [&](int b) {
    int i = 0;
    while (b >= first[i + 1]) i++;
    one_block<BITS, S>(parts[i], b - first[i]);
  };
  share_blocks(first[count], threads, block);
}

template <int BITS>
void run_bits(const QuantizedRows* parts, int count, int threads) {
  switch (parts[0].scale_type) {
    case FloatType::float16: run<BITS, uint16_t>(parts, count, threads); break;
    case FloatType::bfloat16: run<BITS, Bf16>(parts, count, threads); break;
    default: run<BITS, float>(parts, count, threads);
  }
}

}  // namespace

bool quantized_rows_fast(const QuantizedRows* parts, int count, int threads) {
  if (count < 1) return true;
  const QuantizedRows& p = parts[0];
  if ((p.bits != 4 && p.bits != 5 && p.bits != 8) || p.group % 32 != 0) return false;
  for (int i = 1; i < count; i++)
    if (parts[i].bits != p.bits || parts[i].group != p.group || parts[i].M != p.M ||
        parts[i].scale_type != p.scale_type)
      return false;
  if (p.bits == 4)
    run_bits<4>(parts, count, threads);
  else if (p.bits == 5)
    run_bits<5>(parts, count, threads);
  else
    run_bits<8>(parts, count, threads);
  return true;
}

}  // namespace mlxlmb

#else  // no AVX2 / FMA / F16C in this build: quantized_linear.cpp's portable kernel serves

namespace mlxlmb {
bool quantized_rows_fast(const QuantizedRows*, int, int) { return false; }
}  // namespace mlxlmb

#endif
