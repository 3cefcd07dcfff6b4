/* 16-lane float vectors (GCC vector extensions) and the one order in which this
 * package's native kernels add a dot product's lane partials: small_gemm.c's matmuls
 * and decode_attention.cpp's scores follow it, so a value never depends on which
 * kernel, block or thread computed it. */
#ifndef MLXLMB_LANES_H
#define MLXLMB_LANES_H

#define VW 16
typedef float vf __attribute__((vector_size(VW * 4), aligned(4)));
typedef int vi __attribute__((vector_size(VW * 4)));

/* An unaligned load of 16 floats as one vector instruction. Not memcpy: where GCC's
 * tuning prefers 256-bit moves (Intel Sapphire Rapids) it copied the 64 bytes through the
 * stack in two halves and reloaded them whole, a failed store-to-load forward per load
 * that made the small-row kernels several times slower. may_alias: floats read as a
 * vector. */
typedef float vf_unaligned __attribute__((vector_size(VW * 4), aligned(4), may_alias));
static inline vf load(const float *p) { return *(const vf_unaligned *)p; }
/* The matching store, one instruction too (memcpy made two 32-byte stores: no stall, as
 * nothing reloads them at once, but two instructions). */
static inline void store_vector(float *p, vf v) { *(vf_unaligned *)p = v; }
static inline vf load_tail(const float *p, int n) {
  vf v = {0};
  for (int i = 0; i < n; i++) v[i] = p[i];
  return v;
}

/* The one order in which a dot product's 16 lane partials are added: lane l with
 * l + 8, then l + 4, l + 2, l + 1. hsum1 and hsum16 both follow it. */
static inline float hsum1(vf v) {
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = v[i] + v[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}
static inline vf pairsum(vf x, vf y, vi lo, vi hi) {
  return __builtin_shuffle(x, y, lo) + __builtin_shuffle(x, y, hi);
}
/* 16 accumulators at once: lane q of the result is hsum1(acc[q]). */
static inline vf hsum16(const vf *acc) {
  const vi l1 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, h1 = l1 + 8;
  const vi l2 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27}, h2 = l2 + 4;
  const vi l3 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29}, h3 = l3 + 2;
  const vi l4 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}, h4 = l4 + 1;
  vf s1[8], s2[4], s3[2];
  for (int i = 0; i < 8; i++) s1[i] = pairsum(acc[2 * i], acc[2 * i + 1], l1, h1);
  for (int i = 0; i < 4; i++) s2[i] = pairsum(s1[2 * i], s1[2 * i + 1], l2, h2);
  for (int i = 0; i < 2; i++) s3[i] = pairsum(s2[2 * i], s2[2 * i + 1], l3, h3);
  return pairsum(s3[0], s3[1], l4, h4);
}

#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__)
/* AVX2 (16 registers of 8 floats): a 16-lane vector is two registers, and GCC lowers
 * blocks of them (many accumulators, hsum16's shuffles) into copies through the stack.
 * The kernels' AVX2 paths hold each 16-lane value as a low and a high half (lanes 0-7,
 * 8-15), do the same operations on both, and sum them in the order above: the same
 * bits, in registers. */
#include <immintrin.h>
#define MLXLMB_AVX2_HALVES 1
/* Floats p[0 .. n) of 8 (n < 8: zeros after, as load_tail). */
static inline __m256 half_tail(const float *p, int n) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_maskload_ps(p, _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lanes));
}
/* hsum1 of the 16-lane value (lo, hi): l + (l + 8), then + 4, + 2, + 1. */
static inline float hsum_halves(__m256 lo, __m256 hi) {
  __m256 s8 = _mm256_add_ps(lo, hi);
  __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4)); /* s4[0] + s4[2], s4[1] + s4[3] */
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}
#endif

#endif
