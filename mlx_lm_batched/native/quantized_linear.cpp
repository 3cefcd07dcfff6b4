/* A quantized linear layer's x @ dequantize(W)^T (+ bias) for MLX's CPU backend, as one
 * MLX primitive.
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

/* Rows up to which the tiled kernel serves: it ran at 0.9-1.2x the dequantize-and-BLAS
 * path at 64 rows and 0.6-0.8x at 256 (2-core AMD EPYC, OpenBLAS), and it is batch-
 * invariant. */
constexpr int SMALL_ROWS = 64;
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
