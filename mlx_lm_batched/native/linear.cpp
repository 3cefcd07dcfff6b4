/* A linear layer's x @ W^T (+ bias) for MLX's CPU backend, as one MLX primitive.
 *
 * mlx.nn.Linear computes `x @ weight.T`: on a (B, L, K) input MLX builds four graph
 * nodes per call (the weight's transpose, a flatten of x to (B*L, K), the matmul and an
 * unflatten back), each built in Python, scheduled by mx.eval on the calling thread and
 * dispatched on the CPU stream. A decode step of a 30-layer model makes about 210 such
 * calls; at batch 1, where the step is one pass over the weights, the 630 nodes that
 * compute nothing were a sixth of the step's CPU time on a 2-core machine. Here the
 * call is one node.
 *
 * The product is the very call MLX's Matmul (or AddMM, with a bias) makes:
 * `cblas_sgemm(RowMajor, NoTrans, Trans, M, N, K, 1, x, K, W, K, beta, out, N)` on the
 * rows of x, resolved like MLX resolves it (the process's global symbol scope, where
 * mlx_lm_batched/_small_gemm.py's kernel serves few-row calls ahead of the BLAS), with
 * the bias first copied into every output row and beta = 1 as AddMM does, and each side
 * passed in place, transposed or copied exactly where MLX's matmul would: a row gets
 * the same bits as from nn.Linear.
 */
#include <dlfcn.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu_prims.h"
#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"

namespace mlxlmb {

namespace {

/* Rows above which the product is split in blocks over our threads (split_gemm.cpp):
 * a prefill's; decode steps' few rows go to the small-row kernel or one BLAS call. */
constexpr int SPLIT_ROWS = 64;

/* CBLAS's enum values (cblas.h). */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
using sgemm_fn = void (*)(int, int, int, int, int, int, float, const float*, int,
                          const float*, int, float, float*, int);

/* cblas_sgemm as MLX's own calls resolve it: the first definition in the global scope. */
sgemm_fn find_sgemm() {
  static sgemm_fn fn = reinterpret_cast<sgemm_fn>(dlsym(RTLD_DEFAULT, "cblas_sgemm"));
  return fn;
}

/* One side of the product as the BLAS gets it. */
struct Operand {
  const float* data;
  bool transposed;
  int ld;
};

/* MLX's own choice for a (rows, cols) matrix with strides (s0, s1) (its matmul's
 * check_transpose): rows in place, columns in place (transposed), or a row-major copy
 * made by `copy`. Mirroring it keeps the BLAS call, hence the bits, MLX's. */
template <typename Copy>
Operand as_blas_operand(const float* data, int rows, int cols, int64_t s0, int64_t s1,
                        Copy copy) {
  if (s0 == cols && s1 == 1) return {data, false, static_cast<int>(s0)};
  if (s0 == 1 && s1 == rows) return {data, true, static_cast<int>(s1)};
  return {copy(), false, cols};
}

class Linear : public LinearPrimitive {
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
      float* o = out.data<float>();
      const bool has_bias = inputs.size() > 2;
      if (has_bias) { /* every output row starts as the bias (AddMM's copy of c) */
        std::vector<float> scratch;
        const float* b = row_major(inputs[2], scratch);
        for (int m = 0; m < M; m++) std::memcpy(o + (size_t)m * N, b, sizeof(float) * N);
      }
      if (M == 0 || N == 0) return;
      if (K == 0) { /* an empty sum: zeros (plus the bias already there) */
        if (!has_bias) std::memset(o, 0, out.nbytes());
        return;
      }
      /* x as the (M, K) matrix MLX multiplies: a 2-D x as it is; more axes flattened,
       * which copies x to row-major order unless it already is. */
      std::vector<float> x_copy, w_copy;
      Operand a = x.ndim() == 2
          ? as_blas_operand(x.data<float>(), M, K, x.strides()[0], x.strides()[1],
                            [&] { return row_major(x, x_copy); })
          : Operand{row_major(x, x_copy), false, K};
      /* The right side is weight.T, a (K, N) view of the (N, K) weight. */
      const auto copy_wt = [&] {
        w_copy.resize(static_cast<size_t>(K) * N);
        const float* src = w.data<float>();
        for (int k = 0; k < K; k++)
          for (int n = 0; n < N; n++)
            w_copy[static_cast<size_t>(k) * N + n] = src[n * w.strides()[0] + k * w.strides()[1]];
        return static_cast<const float*>(w_copy.data());
      };
      Operand b = as_blas_operand(w.data<float>(), K, N, w.strides()[1], w.strides()[0], copy_wt);
      const float beta = has_bias ? 1.0f : 0.0f;
      if (M > SPLIT_ROWS)
        sgemm_split(M, N, K, a.data, a.transposed, a.ld, b.data, b.transposed, b.ld, beta, o,
                    primitive_threads());
      else
        sgemm(a.transposed, b.transposed, M, N, K, a.data, a.ld, b.data, b.ld, beta, o, N);
    });
  }

  const char* name() const override { return "MlxlmbLinear"; }
};

}  // namespace

bool linear_available() { return find_sgemm() != nullptr; }

void sgemm(bool a_transposed, bool b_transposed, int M, int N, int K, const float* a, int lda,
           const float* b, int ldb, float beta, float* c, int ldc) {
  find_sgemm()(ROW_MAJOR, a_transposed ? TRANS : NO_TRANS, b_transposed ? TRANS : NO_TRANS, M,
               N, K, 1.0f, a, lda, b, ldb, beta, c, ldc);
}

void sgemm_nt(int M, int N, int K, const float* a, const float* b, float* c, float beta,
              int ldc) {
  sgemm(false, true, M, N, K, a, K, b, K, beta, c, ldc ? ldc : N);
}

mx::array linear(const mx::array& x, const mx::array& weight, std::optional<mx::array> bias) {
  if (x.ndim() < 1 || x.dtype() != mx::float32 || weight.dtype() != mx::float32)
    throw std::invalid_argument("linear: float32 input and weight");
  if (weight.ndim() != 2 || weight.shape(1) != x.shape(-1))
    throw std::invalid_argument("linear: the weight must be (N, K) for an input (..., K)");
  std::vector<mx::array> inputs = {x, weight};
  if (bias) {
    if (bias->dtype() != mx::float32 || bias->ndim() != 1 || bias->shape(0) != weight.shape(0))
      throw std::invalid_argument("linear: the bias must be float32 of shape (N,)");
    inputs.push_back(*bias);
  }
  auto shape = x.shape();
  shape.back() = weight.shape(0);
  return mx::array(std::move(shape), mx::float32, std::make_shared<Linear>(cpu_stream()),
                   std::move(inputs));
}

}  // namespace mlxlmb
