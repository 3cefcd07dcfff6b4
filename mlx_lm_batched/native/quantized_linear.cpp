/* The portable kernels of a quantized linear layer's x @ dequantize(W)^T (+ bias) for MLX's
 * CPU backend (the primitive: quantized_linear_primitive.cpp).
 *
 * MLX's CPU quantized_matmul runs a scalar loop at about 2 GFLOP/s whatever the number
 * of rows: a decode step of a 4-bit SmolLM2-135M took longer than the float32 model's,
 * which streams 6x the bytes, and prefill ran at single-digit tokens/s. Here, for MLX's
 * "affine" quantization (w = scale * q + bias per group of `group` weights along K, q
 * packed little end first into uint32 words, 1, 2, 3, 4, 5, 6 or 8 bits):
 *
 * - up to SMALL_ROWS rows (decode steps), each thread unpacks its weight rows once and
 *   multiplies every input row with them, a tile of rows and weight rows at a time:
 *   per group, 16 fixed lanes gather x * q and take the group's scale; the group's bias
 *   multiplies the input's group sum. Each output is the same chain of float operations
 *   whatever the number of rows, the tile or the threads, so a row gets the same bits
 *   alone as in a batch (batch invariance);
 * - more rows (prefill), the weight is dequantized by MLX's formula into float32, 1 MB
 *   of weight rows at a time, and each block multiplied by the BLAS call MLX's own matmul
 *   makes (`sgemm_nt`, linear.cpp), the output's columns split over our threads.
 *
 * Where the build has AVX2, FMA and F16C, 4-, 5- and 8-bit weights' decode rows take
 * quantized_rows_avx2.cpp's kernel instead of the tiled one (see there).
 *
 * The sums run in another order than MLX's loop: outputs agree with mx.quantized_matmul
 * to float32 rounding (about 1e-6 relative), not bit for bit. Float16 and bfloat16 inputs
 * are computed in float32 and the output rounded to their dtype once.
 */

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_prims.h"
#include "lanes.h"
#include "quantized_rows.h"
#include "shared_work.h"

namespace mlxlmb {

namespace {

constexpr int LANES = 16;

/* A fixed-order sum of 16 lanes (pairwise halves): the same bits wherever it runs. */
inline float reduce_lanes(float* lanes) {
  for (int w = LANES / 2; w; w >>= 1)
    for (int j = 0; j < w; j++) lanes[j] += lanes[j + w];
  return lanes[0];
}

/* The K integer values of one packed weight row, as floats, read byte by byte (the
 * words are a little-endian bit stream: element i takes bits [i * BITS, (i + 1) * BITS)).
 * 8 and 4 bits make each step one vector of 16 bytes: 4-bit values come out
 * block-permuted, each block of 32 elements as its 16 even then its 16 odd elements (byte
 * i's low nibble is element 2i; `permute_blocks` puts x in the same order). The other
 * widths (GGUF's Q5 types, mlx-lm's 2-, 3- and 6-bit recipe layers, 1 bit) come in element
 * order, every 8 values from BITS bytes. */
template <int BITS>
inline void unpack_bits(const uint8_t* __restrict bytes, int K, float* __restrict q) {
  if constexpr (BITS == 8) {
    for (int k = 0; k < K; k++) q[k] = static_cast<float>(bytes[k]);
  } else if constexpr (BITS == 4) {
    for (int b = 0; b < K / 32; b++) {
      const uint8_t* by = bytes + 16 * b;
      float* qb = q + 32 * b;
      for (int j = 0; j < 16; j++) qb[j] = static_cast<float>(by[j] & 15);
      for (int j = 0; j < 16; j++) qb[16 + j] = static_cast<float>(by[j] >> 4);
    }
  } else {
    constexpr uint64_t mask = (uint64_t{1} << BITS) - 1;
    for (int o = 0; o < K / 8; o++) {
      uint64_t v = 0;
      for (int b = 0; b < BITS; b++) v |= static_cast<uint64_t>(bytes[BITS * o + b]) << (8 * b);
      for (int j = 0; j < 8; j++) q[8 * o + j] = static_cast<float>((v >> (BITS * j)) & mask);
    }
  }
}

inline void unpack_row(const uint32_t* words, int bits, int K, float* q) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(words);
  switch (bits) {
    case 1: unpack_bits<1>(bytes, K, q); break;
    case 2: unpack_bits<2>(bytes, K, q); break;
    case 3: unpack_bits<3>(bytes, K, q); break;
    case 4: unpack_bits<4>(bytes, K, q); break;
    case 5: unpack_bits<5>(bytes, K, q); break;
    case 6: unpack_bits<6>(bytes, K, q); break;
    default: unpack_bits<8>(bytes, K, q);
  }
}

/* Rows of x in 4-bit weights' element order (see unpack_bits). */
void permute_blocks(const float* x, int M, int K, float* out) {
  for (int m = 0; m < M; m++)
    for (int b = 0; b < K / 32; b++) {
      const float* src = x + static_cast<size_t>(m) * K + 32 * b;
      float* dst = out + static_cast<size_t>(m) * K + 32 * b;
      for (int j = 0; j < 16; j++) {
        dst[j] = src[2 * j];
        dst[16 + j] = src[2 * j + 1];
      }
    }
}

struct Problem {
  int M, N, K, bits, group;
  const float* x;        // (M, K) row-major
  const uint32_t* w;     // (N, K * bits / 32) row-major
  const float* scales;   // (N, K / group)
  const float* biases;   // (N, K / group)
  const float* bias;     // (N,) or null
  float* out;            // (M, N)
};

/* Vectors of 16 float lanes, their one-instruction load and their fixed-order sum are
 * lanes.h's `vf`, `load` and `hsum1` (the order of reduce_lanes). Lane j of every vector
 * operation below is the scalar operation it replaces, so the bits are those of the
 * lane-by-lane loop (no contraction: -ffp-contract=off). */
static_assert(VW == LANES, "lanes.h's vectors hold this kernel's 16 lanes");

/* Outputs (m0 .. m0 + MB) x (n0 .. n0 + NB) from NB unpacked weight rows `q` (K floats
 * each). Per output, per group: 16 lanes gather x * q, the group's scale multiplies
 * them into the output's lanes, and its bias times the input's group sum goes into a
 * separate sum; the lanes are reduced in reduce_lanes' fixed order at the end. MB input
 * rows share each weight load and NB weight rows each input load (register tiling);
 * every output is the same chain of operations for any tile shape, so a row's bits do
 * not depend on the batch it is in. */
template <int MB, int NB>
void small_tile(const Problem& p, int m0, int n0, const float* q, const float* xsum) {
  const int groups = p.K / p.group;
  const float* x[MB];
  const float* xs[MB];
  for (int i = 0; i < MB; i++) {
    x[i] = p.x + static_cast<size_t>(m0 + i) * p.K;
    xs[i] = xsum + static_cast<size_t>(m0 + i) * groups;
  }
  const float* sc[NB];
  const float* bi[NB];
  for (int r = 0; r < NB; r++) {
    sc[r] = p.scales + static_cast<size_t>(n0 + r) * groups;
    bi[r] = p.biases + static_cast<size_t>(n0 + r) * groups;
  }
  vf lanes[MB][NB];
  float offsets[MB][NB];
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) {
      lanes[i][r] = vf{};
      offsets[i][r] = 0.0f;
    }
  for (int g = 0; g < groups; g++) {
    vf part[MB][NB];
    for (int i = 0; i < MB; i++)
      for (int r = 0; r < NB; r++) part[i][r] = vf{};
    for (int k = g * p.group; k < (g + 1) * p.group; k += LANES) {
      vf qv[NB];
      for (int r = 0; r < NB; r++) qv[r] = load(q + static_cast<size_t>(r) * p.K + k);
      for (int i = 0; i < MB; i++) {
        const vf xv = load(x[i] + k);
        for (int r = 0; r < NB; r++) part[i][r] += xv * qv[r];
      }
    }
    for (int i = 0; i < MB; i++)
      for (int r = 0; r < NB; r++) {
        lanes[i][r] += sc[r][g] * part[i][r];
        offsets[i][r] += bi[r][g] * xs[i][g];
      }
  }
  for (int i = 0; i < MB; i++)
    for (int r = 0; r < NB; r++) {
      float y = hsum1(lanes[i][r]) + offsets[i][r];
      if (p.bias) y += p.bias[n0 + r];
      p.out[static_cast<size_t>(m0 + i) * p.N + n0 + r] = y;
    }
}

/* The tile: MB input rows by NB weight rows, MB * NB accumulators of 16 lanes plus as
 * many partial sums held in registers. 8 x 2 fills AVX-512's 32 registers and ran
 * 2.5-3.2x the one-output-at-a-time loop at 8 to 32 rows on a 2-core AMD EPYC (Zen 4);
 * elsewhere (AVX2's 16 registers of half the width, NEON) a smaller tile (not measured). */
#if defined(__AVX512F__)
constexpr int TILE_ROWS = 8, TILE_COLS = 2;
#else
constexpr int TILE_ROWS = 4, TILE_COLS = 1;
#endif

/* The last `rest` (< TILE_ROWS) input rows from m0, by the tile of that height. */
template <int NB, int MB = TILE_ROWS - 1>
void last_rows(const Problem& p, int m0, int rest, int n0, const float* q, const float* xsum) {
  if constexpr (MB > 0) {
    if (rest == MB)
      small_tile<MB, NB>(p, m0, n0, q, xsum);
    else
      last_rows<NB, MB - 1>(p, m0, rest, n0, q, xsum);
  }
}

/* Every input row against NB unpacked weight rows. */
template <int NB>
void small_tiles(const Problem& p, int n0, const float* q, const float* xsum) {
  int m0 = 0;
  for (; m0 + TILE_ROWS <= p.M; m0 += TILE_ROWS) small_tile<TILE_ROWS, NB>(p, m0, n0, q, xsum);
  last_rows<NB>(p, m0, p.M - m0, n0, q, xsum);
}

/* Rows of few inputs: blocks of NB weight rows shared out over the threads
 * (shared_work.h), each row unpacked once and multiplied with every input row. */
void small_rows(const Problem& p, int threads) {
  constexpr int NB = TILE_COLS;
  const int groups = p.K / p.group;
  /* Each input row's group sums (for the groups' biases), in one fixed order. */
  std::vector<float> xsum(static_cast<size_t>(p.M) * groups);
  for (int m = 0; m < p.M; m++)
    for (int g = 0; g < groups; g++) {
      const float* xg = p.x + static_cast<size_t>(m) * p.K + g * p.group;
      float lanes[LANES] = {0};
      for (int k = 0; k < p.group; k++) lanes[k % LANES] += xg[k];
      xsum[static_cast<size_t>(m) * groups + g] = reduce_lanes(lanes);
    }
  const int words = p.K * p.bits / 32;
  auto block = [&](int b) {
    thread_local std::vector<float> q;  // each thread's unpacked rows, kept between calls
    q.resize(static_cast<size_t>(NB) * p.K);
    const int n0 = b * NB, rows = std::min(NB, p.N - n0);
    for (int r = 0; r < rows; r++)
      unpack_row(p.w + static_cast<size_t>(n0 + r) * words, p.bits, p.K,
                 q.data() + static_cast<size_t>(r) * p.K);
    if (rows == NB)
      small_tiles<NB>(p, n0, q.data(), xsum.data());
    else  /* the last weight row of an odd N */
      small_tiles<1>(p, n0, q.data(), xsum.data());
  };
  share_blocks((p.N + NB - 1) / NB, threads, block);
}

/* Rows of a prefill: the weight dequantized by MLX's formula (in unpack order, like x),
 * a block of weight rows at a time into a buffer that stays in cache, each block then
 * multiplied by the BLAS call MLX's own matmul makes (`sgemm_nt`, linear.cpp) into its
 * columns of the output. Dequantizing the whole weight first (113 MB for a 49152-token
 * vocabulary) cost more than the product: 125 ms of a 33-row lm_head's 128. The output
 * columns are split over our threads as they come free (for_blocks, split_gemm.cpp:
 * OpenBLAS held to one thread meanwhile), each thread dequantizing its own blocks: the
 * dequantizing ran on the calling thread alone before, beside the BLAS's two threads
 * (gemm_converted_rows, split_gemm.cpp). */
void many_rows(const Problem& p, int threads) {
  const int groups = p.K / p.group, words = p.K * p.bits / 32;
  gemm_converted_rows(p.M, p.N, p.K, p.x, p.bias, p.out, threads, [&](int n, float* row) {
    unpack_row(p.w + static_cast<size_t>(n) * words, p.bits, p.K, row);
    for (int k = 0; k < p.K; k++) {
      const size_t g = static_cast<size_t>(n) * groups + k / p.group;
      row[k] = p.scales[g] * row[k] + p.biases[g];
    }
  });
}

}  // namespace

/* One layer's product by the portable paths: the tiled kernel up to SMALL_ROWS rows, the
 * dequantize-and-BLAS one beyond. `layer`: w, scales, biases[, bias]. */
void portable_rows(const mx::array& x, const std::vector<mx::array>& layer, mx::array& out,
                   int group, int bits) {
  const int K = x.shape(-1), N = layer[0].shape(0);
  const int M = static_cast<int>(x.size() / (K > 0 ? K : 1));
  if (M == 0 || N == 0) return;
  /* Half-precision inputs are computed in float32 and rounded once at the end. */
  std::vector<float> x_copy, s_copy, b_copy, bias_copy;
  std::vector<uint32_t> w_copy;
  FloatOut result(out);
  Problem p{M, N, K, bits, group, float_rows(x, x_copy),
            row_major(layer[0], w_copy), float_rows(layer[1], s_copy),
            float_rows(layer[2], b_copy),
            layer.size() > 3 ? float_rows(layer[3], bias_copy) : nullptr,
            result.data()};
  std::vector<float> x_order;
  if (bits == 4) {  /* x in the order the weights unpack in (both paths) */
    x_order.resize(static_cast<size_t>(M) * K);
    permute_blocks(p.x, M, K, x_order.data());
    p.x = x_order.data();
  }
  if (M <= SMALL_ROWS)
    small_rows(p, primitive_threads());
  else
    many_rows(p, primitive_threads());
  result.finish();
}

}  // namespace mlxlmb
