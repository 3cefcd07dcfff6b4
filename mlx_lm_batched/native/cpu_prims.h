/* Our MLX primitives for the CPU backend (built into one extension module by
 * mlx_lm_batched/_cpu_prims.py; bindings in cpu_prims.cpp). */
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/mlx.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

#if defined(__AVX__) || defined(__F16C__)
#include <immintrin.h>
#endif

namespace mx = mlx::core;

namespace mlxlmb {

#if defined(__AVX__)
/* The 8 lanes of an accumulator added in one order: lane l with l + 4, then l with l + 2,
 * then 0 with 1 (the AVX2 decode kernels' last step: quantized_rows_avx2.cpp,
 * half_linear.cpp). */
inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_add_ps(a, _mm_movehl_ps(a, a));
  a = _mm_add_ss(a, _mm_movehdup_ps(a));
  return _mm_cvtss_f32(a);
}
#endif

/* Half-precision values to float32 and back, a span at a time. MLX's element types
 * convert one value per call (on x86 its float16 is software): a bfloat16 SwiGLU of
 * 1.6 M elements took 6x the float32 one in those conversions. Here bfloat16 is integer
 * operations the compiler vectorises (a bfloat16 is a float32's upper half; rounding to
 * nearest even and NaN as MLX's bfloat16_t does), float16 is F16C's conversions where the
 * build has them (IEEE round to nearest even, as MLX's), else MLX's own. The same values
 * as MLX's conversions. */
inline void bf16_to_float(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; i++) {
    const uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
    std::memcpy(dst + i, &bits, sizeof bits);
  }
}
inline void float_to_bf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint32_t bits;
    std::memcpy(&bits, src + i, sizeof bits);
    const uint32_t rounded = (bits + ((bits >> 16) & 1u) + 0x7FFFu) >> 16;
    dst[i] = (bits & 0x7FFFFFFFu) > 0x7F800000u ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
  }
}
inline void f16_to_float(const mx::float16_t* src, float* dst, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; i++) dst[i] = static_cast<float>(src[i]);
}
inline void float_to_f16(const float* src, mx::float16_t* dst, size_t n) {
  size_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; i++) dst[i] = src[i];
}

/* n values of type Src as float32 (Src: float, mx::float16_t or mx::bfloat16_t). */
template <typename Src>
inline void to_float(const Src* src, float* dst, size_t n) {
  if constexpr (std::is_same_v<Src, mx::bfloat16_t>)
    bf16_to_float(reinterpret_cast<const uint16_t*>(src), dst, n);
  else if constexpr (std::is_same_v<Src, mx::float16_t>)
    f16_to_float(src, dst, n);
  else
    for (size_t i = 0; i < n; i++) dst[i] = static_cast<float>(src[i]);
}

/* The stream every primitive here runs on: the CPU's default. */
inline mx::Stream cpu_stream() {
  return mx::default_stream(mx::Device(mx::Device::cpu));
}

/* The frame every primitive here shares: one output computed by a task on the CPU
 * stream, other devices refused (they use MLX's own ops), gradients from the same
 * function in MLX ops. */
class CpuPrimitive : public mx::Primitive {
 public:
  using mx::Primitive::Primitive;

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error(std::string(name()) +
                             " is a CPU kernel (other devices use MLX's own ops)");
  }

 protected:
  /* Registers the arrays with the CPU stream's encoder and runs `task` there (`out`
   * already allocated); the task holds the arrays so their buffers outlive it. */
  template <typename Task>
  void run_on_cpu(const std::vector<mx::array>& inputs, mx::array& out, Task task) {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    encoder.set_output_array(out);
    encoder.dispatch(std::move(task));
  }
  /* The same for a primitive of several outputs. */
  template <typename Task>
  void run_on_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outs, Task task) {
    auto& encoder = mx::cpu::get_command_encoder(stream());
    for (const auto& a : inputs) encoder.set_input_array(a);
    for (auto& out : outs) encoder.set_output_array(out);
    encoder.dispatch(std::move(task));
  }

  using Function = std::function<std::vector<mx::array>(const std::vector<mx::array>&)>;

  /* The gradients for `argnums` of `reference` (this primitive's function in MLX ops)
   * taken at the first `differentiable` primals; the others (masks, positions) get
   * zeros. */
  std::vector<mx::array> reference_vjp(const Function& reference,
                                       const std::vector<mx::array>& primals,
                                       const std::vector<mx::array>& cotangents,
                                       const std::vector<int>& argnums, size_t differentiable) {
    const std::vector<mx::array> at(primals.begin(), primals.begin() + differentiable);
    auto grads = mx::vjp(reference, at, cotangents).second;
    std::vector<mx::array> out;
    for (int a : argnums)
      out.push_back(static_cast<size_t>(a) < differentiable ? grads[a]
                                                            : mx::zeros_like(primals[a], stream()));
    return out;
  }
};

/* A primitive computing nn.Linear's x @ weight^T (+ bias) from inputs (x, weight[, bias]):
 * its output shape, and gradients those of nn.Linear's ops (training on the CPU). */
class LinearPrimitive : public CpuPrimitive {
 public:
  using CpuPrimitive::CpuPrimitive;

  std::vector<mx::array> vjp(const std::vector<mx::array>& primals,
                             const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums,
                             const std::vector<mx::array>&) override {
    const auto s = stream();
    auto reference = [s](const std::vector<mx::array>& in) {
      auto wt = mx::transpose(in[1], s);
      if (in.size() > 2) return std::vector<mx::array>{mx::addmm(in[2], in[0], wt, 1.0f, 1.0f, s)};
      return std::vector<mx::array>{mx::matmul(in[0], wt, s)};
    };
    return reference_vjp(reference, primals, cotangents, argnums, primals.size());
  }
  bool is_equivalent(const mx::Primitive&) const override { return true; }
  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    auto shape = inputs[0].shape();
    shape.back() = inputs[1].shape(0);
    return {shape};
  }
};

/* Element offsets of each "row" of `a` (all axes but the last), in row-major order. */
inline std::vector<int64_t> row_offsets(const mx::array& a) {
  const int nd = a.ndim();
  const int64_t rows = a.size() / a.shape(nd - 1);
  std::vector<int64_t> out(rows);
  if (a.flags().row_contiguous) {
    for (int64_t r = 0; r < rows; r++) out[r] = r * a.shape(nd - 1);
    return out;
  }
  std::vector<int> index(nd - 1, 0);
  for (int64_t r = 0; r < rows; r++) {
    int64_t off = 0;
    for (int d = 0; d < nd - 1; d++) off += index[d] * a.strides()[d];
    out[r] = off;
    for (int d = nd - 2; d >= 0; d--) { /* next index, last axis fastest */
      if (++index[d] < a.shape(d)) break;
      index[d] = 0;
    }
  }
  return out;
}

/* `a`'s elements (stored as `Src`) in row-major order as `T`: its own memory when laid
 * out so and of that type, else a (converted) copy in `scratch` (for inputs whose layout
 * or dtype a kernel cannot read in place). */
template <typename T, typename Src = T>
inline const T* row_major(const mx::array& a, std::vector<T>& scratch) {
  if constexpr (std::is_same_v<T, Src>)
    if (a.flags().row_contiguous || a.size() == 0) return a.data<T>();
  const int64_t D = a.shape(-1), step = a.strides().back();
  const Src* src = a.data<Src>();
  scratch.resize(a.size());
  T* dst = scratch.data();
  if constexpr (std::is_same_v<T, float> && !std::is_same_v<Src, float>) {
    if (a.flags().row_contiguous) {  /* one span, converted a vector at a time */
      to_float(src, dst, a.size());
      return scratch.data();
    }
    if (step == 1) {
      for (int64_t offset : row_offsets(a)) {
        to_float(src + offset, dst, D);
        dst += D;
      }
      return scratch.data();
    }
  }
  for (int64_t offset : row_offsets(a)) {
    for (int64_t d = 0; d < D; d++) dst[d] = static_cast<T>(src[offset + d * step]);
    dst += D;
  }
  return scratch.data();
}

/* The float dtypes the primitives read: float32, and float16 and bfloat16 computed in
 * float32 (each half value converts exactly) with the results rounded once to the
 * output's dtype. */
inline bool float_dtype(mx::Dtype t) {
  return t == mx::float32 || t == mx::float16 || t == mx::bfloat16;
}

/* Which of those an array holds, for kernels that read its memory in its own dtype. */
enum class FloatType { float32, float16, bfloat16 };
inline FloatType float_type(mx::Dtype t) {
  return t == mx::float16 ? FloatType::float16
         : t == mx::bfloat16 ? FloatType::bfloat16 : FloatType::float32;
}

/* A float32, float16 or bfloat16 array as row-major float32 (`row_major`: in place for
 * row-contiguous float32, else converted into `scratch`). */
inline const float* float_rows(const mx::array& a, std::vector<float>& scratch) {
  if (a.dtype() == mx::float16) return row_major<float, mx::float16_t>(a, scratch);
  if (a.dtype() == mx::bfloat16) return row_major<float, mx::bfloat16_t>(a, scratch);
  return row_major(a, scratch);
}

/* Where a primitive writes its float32 results, row-major: `out`'s own memory when it is
 * float32, else a buffer that `finish` rounds into `out` (float16 or bfloat16) once. */
class FloatOut {
 public:
  explicit FloatOut(mx::array& out) : out_(out) {
    if (out.dtype() != mx::float32) buffer_.resize(out.size());
  }
  float* data() { return buffer_.empty() ? out_.data<float>() : buffer_.data(); }
  void finish() {  /* the float32 results rounded once into a half output */
    if (out_.dtype() == mx::float16)
      float_to_f16(buffer_.data(), out_.data<mx::float16_t>(), buffer_.size());
    else if (out_.dtype() == mx::bfloat16)
      float_to_bf16(buffer_.data(), reinterpret_cast<uint16_t*>(out_.data<mx::bfloat16_t>()),
                    buffer_.size());
  }

 private:
  mx::array& out_;
  std::vector<float> buffer_;
};

/* softmax(q k^T * scale) v for one query per row (decode_attention.cpp). */
mx::array decode_attention(const mx::array& q, const mx::array& k, const mx::array& v,
                           float scale, std::optional<mx::array> mask);
/* The same over keys and values held in segments of consecutive slots (a shared prefix's
 * blocks, then a row's own slots): the same bits as over the segments joined. */
mx::array decode_attention_segments(const mx::array& q, const std::vector<mx::array>& ks,
                                    const std::vector<mx::array>& vs, float scale,
                                    std::optional<mx::array> mask);
/* Threads decode_attention's tasks (and quantized_linear's weight rows) are split over. */
void set_attention_threads(int threads);
int primitive_threads();

/* x * rsqrt(mean(x^2) + eps) * weight over the last axis (norm_rope.cpp). */
mx::array rms_norm(const mx::array& x, std::optional<mx::array> weight, float eps);
/* Rotary embedding of the first `dims` features of x (B, ..., L, D), position of column l
 * of row b: offset[b] + l, times `scale` (norm_rope.cpp). */
mx::array rope(const mx::array& x, int dims, bool traditional, const mx::array& inv_freq,
               float scale, const mx::array& offset);

/* x @ weight^T (+ bias) as MLX's Matmul/AddMM compute it, one node (linear.cpp). */
mx::array linear(const mx::array& x, const mx::array& weight, std::optional<mx::array> bias);
/* x @ weight^T (+ bias) for a float16 or bfloat16 weight, computed in float32, one node
 * (half_linear.cpp). */
mx::array half_linear(const mx::array& x, const mx::array& weight, std::optional<mx::array> bias);
/* silu(gate) * up, elementwise, with layers/cpu_ops.py's exp (swiglu.cpp). */
mx::array swiglu(const mx::array& gate, const mx::array& up);

/* Whether cblas_sgemm is in the process's global symbol scope (linear.cpp). */
bool linear_available();
/* c = a @ b^T (+ beta * c) for row-major a (M, K), b (N, K), c (M, N) with rows `ldc`
 * apart (0: N), by the BLAS call MLX's matmul makes (linear.cpp). */
void sgemm_nt(int M, int N, int K, const float* a, const float* b, float* c, float beta,
              int ldc = 0);
/* c (M, N, rows ldc apart) = op(a) @ op(b) + beta * c, row-major, op a transpose where
 * asked: cblas_sgemm as MLX resolves it (linear.cpp). */
void sgemm(bool a_transposed, bool b_transposed, int M, int N, int K, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc);

/* The block size when `length` rows (or columns) of an output `other` wide, from products
 * along K, are split over `threads`, each block at least `least` long (`length`: not
 * split) (split_gemm.cpp). */
int block_size(int length, int other, int K, int threads, int least = 1);
/* block(first, count) for consecutive blocks covering [0, length), on up to `threads`
 * threads as they come free, with OpenBLAS held to one thread meanwhile (split_gemm.cpp). */
void for_blocks(int length, int other, int K, int threads,
                const std::function<void(int, int)>& block, int least = 1);
/* sgemm(...) with c's rows N apart, its longer side split over `threads` threads, each block
 * one single-threaded BLAS call: the same bits as one call (split_gemm.cpp). */
void sgemm_split(int M, int N, int K, const float* a, bool a_transposed, int lda,
                 const float* b, bool b_transposed, int ldb, float beta, float* c,
                 int threads);

/* out (M, N) = x (M, K) @ W^T (+ bias) where `weight_row(n, row)` writes W's row n as K
 * float32 values (a quantized or half-precision weight): rows converted 1 MB at a time
 * into a buffer that stays in cache, each block one sgemm_nt, the output's columns split
 * over `threads` by for_blocks (split_gemm.cpp). A prefill's product for weights the BLAS
 * cannot read. */
void gemm_converted_rows(int M, int N, int K, const float* x, const float* bias, float* out,
                         int threads, const std::function<void(int, float*)>& weight_row);

/* x @ dequantize(w, scales, biases)^T (+ bias) for MLX's affine quantization, 4 or 8 bits
 * (quantized_linear.cpp). */
mx::array quantized_linear(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, std::optional<mx::array> bias,
                           int group_size, int bits);
/* The same for several layers of one input (each its weight, scales, biases and optional
 * bias), one output each, computed in one node (a decode step's query, key and value
 * projections): each output the bits quantized_linear gives it. */
std::vector<mx::array> quantized_linears(const mx::array& x, const std::vector<mx::array>& ws,
                                         const std::vector<mx::array>& scales,
                                         const std::vector<mx::array>& biases,
                                         const std::vector<std::optional<mx::array>>& bias,
                                         int group_size, int bits);

}  // namespace mlxlmb
