/* Matmuls with few rows for MLX's CPU backend: C = alpha * A * B^T + beta * C.
 *
 * MLX's CPU matmul calls cblas_sgemm once per matrix. A decode step multiplies a few
 * rows (one per sequence) by every weight matrix, stored (out, in) row-major, so MLX
 * asks for A * B^T with B the weights. BLAS libraries pack B into panels before
 * multiplying, which for a few rows costs as much as the product, and OpenBLAS runs a
 * one-row product on one core: a decode step then streams the weights at about half
 * the memory bandwidth. This file exports its own cblas_sgemm, loaded into the global
 * symbol scope before the BLAS (mlx_lm_batched/_small_gemm.py), that computes
 * row-major A * B^T with at most `max_rows` rows of A itself and hands every other
 * call to the BLAS's cblas_sgemm.
 *
 * Each output is a dot product of a row of A and a row of B, read straight from the
 * arrays (no packing), in 16 lanes (lane l sums the products k = l, l + 16, ... in
 * order, with fused multiply-adds) and then one fixed tree over the lanes. That chain
 * of operations is the same for every element whatever M, N, the block it falls in or
 * the number of threads: a row's result does not depend on the other rows of the call
 * (batch invariance), only on the build (compiler, -march).
 *
 * Blocks of 8 rows of A by 3 rows of B keep 24 accumulators in registers (AVX-512; on
 * AVX2, 4 by 1 in 8-float halves, below); A's rows stay in L1 while B's rows stream;
 * threads split the rows of B.
 */
#include <stddef.h>
#include <omp.h>
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "lanes.h"

static inline void store(float *c, float dot, float alpha, float beta) {
  /* One explicit fused multiply-add for beta (MLX's addmm passes the bias as C, beta 1):
   * left to contraction, the rounding depended on where the compiler inlined this. */
  float v = alpha * dot;
  *c = beta == 0.0f ? v : __builtin_fmaf(beta, *c, v);
}

#ifdef MLXLMB_AVX2_HALVES
/* AVX2: blocks in 8-float halves (lanes.h): a 16-row call ran at 10 GFLOP/s with the
 * 16-lane vectors, 7x slower than OpenBLAS. Each accumulator's halves get the same fused
 * multiply-adds, zeros past K included, and hsum1's order: the same bits. */
static inline __attribute__((always_inline)) void block(
    const int mr, const int nr, int K, const float *A, int lda, const float *B, int ldb,
    const float *next, float *C, int ldc, float alpha, float beta) {
  __m256 lo[8], hi[8];
  for (int q = 0; q < mr * nr; q++) lo[q] = hi[q] = _mm256_setzero_ps();
  int k = 0;
  for (; k + 16 <= K; k += 16) {
    __m256 bl[4], bh[4];
    for (int j = 0; j < nr; j++) __builtin_prefetch(next + (size_t)j * ldb + k, 0, 2);
    for (int j = 0; j < nr; j++) {
      bl[j] = _mm256_loadu_ps(B + (size_t)j * ldb + k);
      bh[j] = _mm256_loadu_ps(B + (size_t)j * ldb + k + 8);
    }
    for (int i = 0; i < mr; i++) {
      __m256 al = _mm256_loadu_ps(A + (size_t)i * lda + k);
      __m256 ah = _mm256_loadu_ps(A + (size_t)i * lda + k + 8);
      for (int j = 0; j < nr; j++) {
        lo[i * nr + j] = _mm256_fmadd_ps(al, bl[j], lo[i * nr + j]);
        hi[i * nr + j] = _mm256_fmadd_ps(ah, bh[j], hi[i * nr + j]);
      }
    }
  }
  if (k < K) {
    int n = K - k;
    __m256 bl[4], bh[4];
    for (int j = 0; j < nr; j++) {
      bl[j] = half_tail(B + (size_t)j * ldb + k, n);
      bh[j] = n > 8 ? half_tail(B + (size_t)j * ldb + k + 8, n - 8) : _mm256_setzero_ps();
    }
    for (int i = 0; i < mr; i++) {
      __m256 al = half_tail(A + (size_t)i * lda + k, n);
      __m256 ah = n > 8 ? half_tail(A + (size_t)i * lda + k + 8, n - 8) : _mm256_setzero_ps();
      for (int j = 0; j < nr; j++) {
        lo[i * nr + j] = _mm256_fmadd_ps(al, bl[j], lo[i * nr + j]);
        hi[i * nr + j] = _mm256_fmadd_ps(ah, bh[j], hi[i * nr + j]);
      }
    }
  }
  for (int q = 0; q < mr * nr; q++)
    store(C + (size_t)(q / nr) * ldc + q % nr, hsum_halves(lo[q], hi[q]), alpha, beta);
}
#else
#define MR 8 /* rows of A per block */
#define NR 3 /* rows of B per block */

/* One block of mr rows of A by nr rows of B (compile-time constants once inlined). */
static inline __attribute__((always_inline)) void block(
    const int mr, const int nr, int K, const float *A, int lda, const float *B, int ldb,
    const float *next, float *C, int ldc, float alpha, float beta) {
  vf acc[32];
  for (int q = 0; q < mr * nr; q++) acc[q] = (vf){0};
  int k = 0;
  for (; k + VW <= K; k += VW) {
    vf b[8];
    /* The next block's rows of B, at the same offset, into L2: one block's compute
     * ahead of their use. The hardware prefetcher alone left a thread waiting on
     * DRAM (8 rows: all projections of SmolLM2-135M in 21 ms instead of 38). */
    for (int j = 0; j < nr; j++) __builtin_prefetch(next + (size_t)j * ldb + k, 0, 2);
    for (int j = 0; j < nr; j++) b[j] = load(B + (size_t)j * ldb + k);
    for (int i = 0; i < mr; i++) {
      vf a = load(A + (size_t)i * lda + k);
#if defined(__AVX512F__) || VW * 4 <= 32
      /* One load, nr uses (GCC would reload it per use). Only where the vector is one
       * register: without AVX-512 a 16-float vector is two, and the constraint cannot
       * be met (the build failed on AVX2-only CPUs). A hint, not a change of bits. */
      __asm__("" : "+v"(a));
#endif
      for (int j = 0; j < nr; j++) acc[i * nr + j] += a * b[j];
    }
  }
  if (k < K) {
    vf b[8];
    for (int j = 0; j < nr; j++) b[j] = load_tail(B + (size_t)j * ldb + k, K - k);
    for (int i = 0; i < mr; i++) {
      vf a = load_tail(A + (size_t)i * lda + k, K - k);
      for (int j = 0; j < nr; j++) acc[i * nr + j] += a * b[j];
    }
  }
  if (mr * nr >= 8) {
    for (int g = 0; g < mr * nr; g += 16) { /* zeros fill the last group of 16 */
      vf group[16];
      for (int q = 0; q < 16; q++) group[q] = g + q < mr * nr ? acc[g + q] : (vf){0};
      vf sums = hsum16(group);
      for (int q = 0; q < 16 && g + q < mr * nr; q++)
        store(C + (size_t)((g + q) / nr) * ldc + (g + q) % nr, sums[q], alpha, beta);
    }
  } else {
    for (int q = 0; q < mr * nr; q++)
      store(C + (size_t)(q / nr) * ldc + q % nr, hsum1(acc[q]), alpha, beta);
  }
}

#endif

static __attribute__((noinline)) void one_by_one(int mr, int nr, int K, const float *A,
    int lda, const float *B, int ldb, float *C, int ldc, float alpha, float beta) {
  for (int i = 0; i < mr; i++)
    for (int j = 0; j < nr; j++)
      block(1, 1, K, A + (size_t)i * lda, lda, B + (size_t)j * ldb, ldb,
            B + (size_t)j * ldb, C + (size_t)i * ldc + j, ldc, alpha, beta);
}

/* Rows [m, m + mr) of A against rows [n0, n1) of B, in blocks of mr x nr; each block
 * prefetches the next one's rows of B (its own, for the last, to stay inside B). */
#define SWEEP(mr, nr)                                                                   \
  do {                                                                                  \
    int n = n0;                                                                         \
    for (; n + (nr) <= n1; n += (nr))                                                   \
      block((mr), (nr), K, A + (size_t)m * lda, lda, B + (size_t)n * ldb, ldb,          \
            B + (size_t)(n + 2 * (nr) <= n1 ? n + (nr) : n) * ldb,                      \
            C + (size_t)m * ldc + n, ldc, alpha, beta);                                 \
    if (n < n1)                                                                         \
      one_by_one((mr), n1 - n, K, A + (size_t)m * lda, lda, B + (size_t)n * ldb, ldb,   \
                 C + (size_t)m * ldc + n, ldc, alpha, beta);                            \
  } while (0)

static void rows_of_b(int M, int n0, int n1, int K, float alpha, const float *A, int lda,
                      const float *B, int ldb, float beta, float *C, int ldc) {
  int m = 0;
#ifdef MLXLMB_AVX2_HALVES
  /* 8 accumulators + 2 of B + 2 of A: 12 of 16 registers (the fastest of 2x2, 3x2, 2x3
   * and 4x1); rows left over: smaller blocks, same values. */
  for (; m + 4 <= M; m += 4) SWEEP(4, 1);
  for (; m + 2 <= M; m += 2) SWEEP(2, 2);
  for (; m < M; m++) SWEEP(1, 3);
#else
  for (; m + MR <= M; m += MR) SWEEP(MR, NR);
  for (; m + 4 <= M; m += 4) SWEEP(4, 4); /* rows left over: smaller blocks, same values */
  for (; m + 2 <= M; m += 2) SWEEP(2, 8);
  for (; m < M; m++) SWEEP(1, 8);
#endif
}

/* Rows of B per pass: enough for the threads' memory streams, few enough for L2. */
#define PANEL_BYTES (128 * 1024)

/* The OS thread ids that computed products here: 0 is the caller (MLX's CPU stream
 * thread), the others the threads that helped (OpenMP's, by thread number, or the CPU
 * primitives' helpers, in the order they first helped). Profilers read
 * them (mlxlmb_team) to tell the threads' CPU time apart; a thread looks its id up once. */
#define MAX_TEAM 64
static long team_tids[MAX_TEAM];

/* This thread's OS id (0 off Linux). */
static long this_tid(void) {
#ifdef __linux__
  static __thread long tid;
  if (!tid) tid = syscall(SYS_gettid);
  return tid;
#else
  return 0;
#endif
}

static inline void note_thread(int number) {
  if (number < MAX_TEAM) __atomic_store_n(&team_tids[number], this_tid(), __ATOMIC_RELAXED);
}

/* Copies up to n recorded thread ids (0: none recorded for that number); returns the
 * count copied. */
int mlxlmb_team(long *out, int n) {
  int count = n < MAX_TEAM ? n : MAX_TEAM;
  for (int i = 0; i < count; i++) out[i] = __atomic_load_n(&team_tids[i], __ATOMIC_RELAXED);
  return count;
}

/* The CPU primitives' way of sharing chunks over threads (native/shared_work.cpp: the
 * caller starts at once, helpers join as they wake, nothing waits for a sleeping one),
 * handed over by mlx_lm_batched/_cpu_prims.py once that library is loaded; until then
 * (or without it) OpenMP's parallel for. */
typedef void (*share_fn)(int chunks, int threads, void (*fn)(void *, int), void *ctx);
static share_fn sharer;
static int helpers_seen; /* team slots handed to helper threads so far */

void mlxlmb_set_sharer(void *share) { __atomic_store_n(&sharer, (share_fn)share, __ATOMIC_RELEASE); }

struct panels {
  int M, N, K, panel;
  float alpha, beta;
  const float *A, *B;
  float *C;
  int lda, ldb, ldc;
  long caller; /* the calling thread's OS id (team slot 0) */
};

/* Panel p of B's rows, on whichever thread takes it; a helper notes its team slot once. */
static void panel_of_b(void *context, int p) {
  const struct panels *x = context;
  static __thread int slot;
  if (this_tid() != x->caller && !slot) {
    slot = 1 + __atomic_fetch_add(&helpers_seen, 1, __ATOMIC_RELAXED);
    note_thread(slot);
  }
  int n0 = p * x->panel, n1 = n0 + x->panel < x->N ? n0 + x->panel : x->N;
  rows_of_b(x->M, n0, n1, x->K, x->alpha, x->A, x->lda, x->B, x->ldb, x->beta, x->C, x->ldc);
}

void mlxlmb_gemm_nt(int M, int N, int K, float alpha, const float *A, int lda,
                    const float *B, int ldb, float beta, float *C, int ldc, int threads) {
  int panel = PANEL_BYTES / (4 * (K > 0 ? K : 1));
  if (panel < 24) panel = 24;
  long work = (long)M * N * K;
  if (threads > 1 && work >= (1L << 17) && N >= 8 * threads) {
    /* Threads take panels of B's rows as they come free (a thread the OS descheduled
     * takes fewer); no value depends on who computes it. */
    int per_thread = (N + 4 * threads - 1) / (4 * threads);
    if (panel > per_thread) panel = (per_thread + 7) / 8 * 8;
    int panels = (N + panel - 1) / panel;
    share_fn share = __atomic_load_n(&sharer, __ATOMIC_ACQUIRE);
    if (share) {
      note_thread(0);
      struct panels x = {M, N, K, panel, alpha, beta, A, B, C, lda, ldb, ldc, this_tid()};
      share(panels, threads, panel_of_b, &x);
      return;
    }
#pragma omp parallel num_threads(threads)
    {
      /* Every member of the team, whether or not it gets a panel (the first to start
       * may take them all). */
      note_thread(omp_get_thread_num());
#pragma omp for schedule(dynamic, 1) nowait
      for (int p = 0; p < panels; p++) {
        int n0 = p * panel, n1 = n0 + panel < N ? n0 + panel : N;
        rows_of_b(M, n0, n1, K, alpha, A, lda, B, ldb, beta, C, ldc);
      }
    }
  } else {
    note_thread(0);
    for (int n0 = 0; n0 < N; n0 += panel)
      rows_of_b(M, n0, n0 + panel < N ? n0 + panel : N, K, alpha, A, lda, B, ldb, beta, C, ldc);
  }
}

/* CBLAS's enum values (cblas.h). */
enum { ROW_MAJOR = 101, NO_TRANS = 111, TRANS = 112 };
typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int,
                         const float *, int, float, float *, int);
static sgemm_fn blas_sgemm;
static int max_rows, threads = 1;
static long served, passed; /* calls computed here / handed to the BLAS (for tests) */

void mlxlmb_counts(long *out) {
  out[0] = __atomic_load_n(&served, __ATOMIC_RELAXED);
  out[1] = __atomic_load_n(&passed, __ATOMIC_RELAXED);
}

/* Set by mlx_lm_batched/_small_gemm.py right after the BLAS is loaded; max_rows 0
 * sends every call to the BLAS. Returns the previous max_rows. */
int mlxlmb_configure(void *sgemm, int rows, int nthreads) {
  int previous = max_rows;
  if (sgemm) blas_sgemm = (sgemm_fn)sgemm;
  max_rows = blas_sgemm ? rows : 0;
  threads = nthreads > 0 ? nthreads : 1;
  return previous;
}

void cblas_sgemm(int order, int trans_a, int trans_b, int M, int N, int K, float alpha,
                 const float *A, int lda, const float *B, int ldb, float beta, float *C,
                 int ldc) {
  if (order == ROW_MAJOR && trans_a == NO_TRANS && trans_b == TRANS && M <= max_rows) {
    __atomic_fetch_add(&served, 1, __ATOMIC_RELAXED);
    mlxlmb_gemm_nt(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, threads);
    return;
  }
  __atomic_fetch_add(&passed, 1, __ATOMIC_RELAXED);
  blas_sgemm(order, trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}
