/* Our MLX primitives for the CPU backend (built into one extension module by
 * mlx_lm_batched/_cpu_prims.py; bindings in cpu_prims.cpp). */
#pragma once

#include <cstdint>
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

namespace mx = mlx::core;

namespace mlxlmb {

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
  for (int64_t offset : row_offsets(a)) {
    for (int64_t d = 0; d < D; d++) dst[d] = static_cast<T>(src[offset + d * step]);
    dst += D;
  }
  return scratch.data();
}

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

/* x @ dequantize(w, scales, biases)^T (+ bias) for MLX's affine quantization, 4 or 8 bits
 * (quantized_linear.cpp). */
mx::array quantized_linear(const mx::array& x, const mx::array& w, const mx::array& scales,
                           const mx::array& biases, std::optional<mx::array> bias,
                           int group_size, int bits);

}  // namespace mlxlmb
