/* A prefill's GEMM split by output rows or columns over our threads, each part one
 * single-threaded BLAS call (cpu_prims.h: sgemm_split, for_blocks).
 *
 * OpenBLAS splits a GEMM statically over its own pthreads and waits for the slowest: on a
 * 2-core machine with one core busy (another process, the Python thread building the next
 * step) a 256 x 576 x 1536 product took the one-thread time, 4.5-4.8 ms against 2.2 ms idle,
 * and it keeps narrow products (N = 192, a key projection) on one thread even when idle.
 * Here the longer of the output's two sides is cut into 2 blocks a thread, handed out as
 * threads come free (OpenMP's dynamic schedule), the BLAS held to one thread meanwhile:
 * 2.3-2.6 ms busy, 0.9-1.0x OpenBLAS's time idle on SmolLM2's shapes, and 1.7x on the
 * narrow ones (2-core AMD EPYC, OpenBLAS 0.3.21). Each block packs the other operand again,
 * so blocks of columns for a 256-token prompt (the weight is the larger operand) and of rows
 * for 16 of them (4096 rows: cutting columns packed 9 MB of inputs per block, 0.77x
 * OpenBLAS idle). An output's result is the same BLAS computation along K whatever the
 * block it is in, so the bits are those of the single call (checked in the tests).
 *
 * Where the BLAS cannot be held to one thread from here (MKL, which runs on the calling
 * thread inside a parallel region; Accelerate; the bundled reference BLAS), each block
 * is still one call on one of our threads.
 */
#include <dlfcn.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "cpu_prims.h"

namespace mlxlmb {

namespace {

using get_threads_fn = int (*)();
using set_threads_fn = void (*)(int);

/* OpenBLAS's thread count held at one for the life of this object, then restored. Its
 * pthreads build would otherwise start its own threads from each of ours. */
class OneBlasThread {
 public:
  OneBlasThread() {
    static const auto get = reinterpret_cast<get_threads_fn>(
        dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
    static const auto set = reinterpret_cast<set_threads_fn>(
        dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
    if (get && set && (previous_ = get()) > 1) {
      set_ = set;
      set_(1);
    }
  }
  ~OneBlasThread() {
    if (set_) set_(previous_);
  }
  OneBlasThread(const OneBlasThread&) = delete;
  OneBlasThread& operator=(const OneBlasThread&) = delete;

 private:
  set_threads_fn set_ = nullptr;
  int previous_ = 1;
};

}  // namespace

int block_size(int length, int other, int K, int threads, int least) {
  // OpenBLAS multiplies products of at most about 100^3 by another kernel (its "small
  // matrix" path, other bits): every block stays above that, or the product is not split.
  constexpr double SMALLEST_BLOCK = 1 << 21;
  if (threads <= 1) return length;
  for (int blocks = 2 * threads; blocks > 1; blocks--) {
    const int width = ((length + blocks - 1) / blocks + 15) / 16 * 16;
    const int last = length - (length - 1) / width * width;
    if (last >= least && static_cast<double>(other) * K * last >= SMALLEST_BLOCK) return width;
  }
  return length;
}

void for_blocks(int length, int other, int K, int threads,
                const std::function<void(int, int)>& block, int least) {
  const int width = block_size(length, other, K, threads, least);
  const int blocks = (length + width - 1) / width;
  if (blocks <= 1) {
    block(0, length);
    return;
  }
  OneBlasThread one_thread;
#pragma omp parallel for num_threads(std::min(threads, blocks)) schedule(dynamic, 1)
  for (int b = 0; b < blocks; b++) {
    const int first = b * width;
    block(first, std::min(width, length - first));
  }
}

void sgemm_split(int M, int N, int K, const float* a, bool a_transposed, int lda,
                 const float* b, bool b_transposed, int ldb, float beta, float* c,
                 int threads) {
  if (M > N) {  // blocks of rows: each packs the smaller b again, not a
    // More than 64 rows a block: fewer may go to the small-row kernel (_small_gemm, up to
    // 32 rows by default), whose bits are not the BLAS's.
    constexpr int FEWEST_ROWS = 65;
    for_blocks(M, N, K, threads, [&](int m0, int m) {
      // op(a) is (M, K): stored transposed, row m is a's column m; else a's row m.
      const float* a_block = a_transposed ? a + m0 : a + static_cast<size_t>(m0) * lda;
      sgemm(a_transposed, b_transposed, m, N, K, a_block, lda, b, ldb, beta,
            c + static_cast<size_t>(m0) * N, N);
    }, FEWEST_ROWS);
    return;
  }
  for_blocks(N, M, K, threads, [&](int n0, int n) {
    // op(b) is (K, N): stored transposed, column n is b's row n; else b's column n.
    const float* b_block = b_transposed ? b + static_cast<size_t>(n0) * ldb : b + n0;
    sgemm(a_transposed, b_transposed, M, n, K, a, lda, b_block, ldb, beta, c + n0, N);
  });
}

void gemm_converted_rows(int M, int N, int K, const float* x, const float* bias, float* out,
                         int threads, const std::function<void(int, float*)>& weight_row) {
  constexpr int BLOCK_FLOATS = 1 << 18;  // 1 MB of converted weight rows: stays in cache
  const int most = std::max(64, BLOCK_FLOATS / std::max(K, 1));
  if (bias)
    for (int m = 0; m < M; m++) std::memcpy(out + static_cast<size_t>(m) * N, bias, sizeof(float) * N);
  for_blocks(N, M, K, threads, [&](int first, int count) {
    std::vector<float> weight(static_cast<size_t>(std::min(most, count)) * K);
    for (int n0 = first; n0 < first + count; n0 += most) {
      const int rows = std::min(most, first + count - n0);
      for (int r = 0; r < rows; r++) weight_row(n0 + r, weight.data() + static_cast<size_t>(r) * K);
      sgemm_nt(M, rows, K, x, weight.data(), out + n0, bias ? 1.0f : 0.0f, N);
    }
  });
}

}  // namespace mlxlmb
