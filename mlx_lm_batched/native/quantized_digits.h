/* Input rows as integers for quantized_rows_avx2.cpp's exact byte dot products: per group of
 * `group` values, x ~ d * a with d = the group's largest |x| / UNITS and an integer
 * |a| <= UNITS (about 2^23: a float32's own 24-bit precision at the group's largest value),
 * written as signed digits (DigitScheme), 32 values at a time in the order the kernel takes a
 * weight's 32 values apart in. Each row's digits depend on that row alone (batch
 * invariance). */
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace mlxlmb {

/* Digit i of a 32-value block holds value order[i] of the block: the order in which
 * weight_bytes<BITS> leaves a weight's bytes (4-bit: the 16 low nibbles, the even values,
 * then the 16 high ones; 5-bit: 8-value packs, 4 values of each in each 128-bit half;
 * 8-bit: as stored). */
template <int BITS>
const std::array<int, 32>& digit_order() {
  static const std::array<int, 32> order = [] {
    std::array<int, 32> o{};
    for (int i = 0; i < 32; i++) {
      if constexpr (BITS == 4)
        o[i] = i < 16 ? 2 * i : 2 * (i - 16) + 1;
      else if constexpr (BITS == 5)
        o[i] = 8 * ((i % 16) / 4) + (i % 4) + (i < 16 ? 0 : 4);
      else
        o[i] = i;
    }
    return o;
  }();
  return order;
}

/* How a width's weights meet the digits. 4- and 5-bit weights take three 8-bit digits
 * (|a| <= 127 * 2^16, 23 bits and a sign), combined by Horner's rule in int32 (4 products
 * of 31 * 2^23 stay below 2^31). 8-bit weights take four 7-bit digits (|a| <= 2^23) in two
 * int32 halves of two digits each, joined in float: 8 bits times 23 would overflow int32,
 * and AVX2's vpmaddubsw adds two u8 x s8 products in int16, which 255 * 64 * 2 = 32640
 * keeps below its limit only for 7-bit digits.
 *
 * The weights are centred, q - 2^(BITS-1), by subtracting 2^(BITS-1) times the sum of a over
 * each int32 lane's 4 values (stored with the digits, one per half): sum(q * a) and the
 * group's bias times sum(x) nearly cancel where the bias is about -2^(BITS-1) * scale (an
 * affine quantization's usual bias), and the product would keep only their difference's
 * bits. Centred, each term is about the size of the result. */
template <int BITS>
struct DigitScheme {
  static constexpr int COUNT = BITS == 8 ? 4 : 3;     // digits per value
  static constexpr int BITS_EACH = BITS == 8 ? 7 : 8;
  static constexpr int HALVES = BITS == 8 ? 2 : 1;    // int32 sums joined in float
  static constexpr float UNITS = BITS == 8 ? float(1 << 23) : float(127 << 16);
  static constexpr int CENTRE = 1 << (BITS - 1);
  /* Bytes per 32 values: the digit vectors, then one 8 x int32 vector a half. */
  static constexpr int BLOCK_BYTES = 32 * (COUNT + HALVES);
};

template <int BITS>
class RowDigits {
  using Scheme = DigitScheme<BITS>;

 public:
  /* x (M, K) float32 row-major, K a multiple of `group`, `group` a multiple of 32. */
  RowDigits(const float* x, int M, int K, int group)
      : blocks_(K / 32), groups_(K / group),
        bytes_(static_cast<size_t>(M) * blocks_ * Scheme::BLOCK_BYTES),
        steps_(static_cast<size_t>(M) * groups_), sums_(static_cast<size_t>(M) * groups_) {
    for (int m = 0; m < M; m++)
      for (int g = 0; g < groups_; g++)
        split_group(x + static_cast<size_t>(m) * K + static_cast<size_t>(g) * group, group,
                    m, g);
  }

  /* Row m's block of the 32 values from column k: Scheme::COUNT digit vectors (32 bytes
   * each, the most significant first), then the centring vectors (8 int32 each). */
  const int8_t* block(int m, int k) const {
    return bytes_.data() + (static_cast<size_t>(m) * blocks_ + k / 32) * Scheme::BLOCK_BYTES;
  }
  /* d of row m's group g: x ~ d * a. */
  float step(int m, int g) const { return steps_[static_cast<size_t>(m) * groups_ + g]; }
  /* The float sum of row m's group g, in column order. */
  float sum(int m, int g) const { return sums_[static_cast<size_t>(m) * groups_ + g]; }

 private:
  void split_group(const float* x, int group, int m, int g) {
    float largest = 0.0f, total = 0.0f;
    for (int k = 0; k < group; k++) {
      largest = std::max(largest, std::fabs(x[k]));
      total += x[k];
    }
    const size_t at = static_cast<size_t>(m) * groups_ + g;
    sums_[at] = total;
    // A non-finite input makes the outputs NaN (its d), as a float product would not hide it.
    const bool finite = std::isfinite(largest) && std::isfinite(total);
    steps_[at] = finite ? largest / Scheme::UNITS : std::numeric_limits<float>::quiet_NaN();
    const float per_unit = finite && largest > 0.0f ? Scheme::UNITS / largest : 0.0f;
    const long base = 1L << Scheme::BITS_EACH, half = base / 2;
    const long most = static_cast<long>(Scheme::UNITS);
    const auto& order = digit_order<BITS>();
    for (int k0 = 0; k0 < group; k0 += 32) {
      int8_t* out = bytes_.data() + (static_cast<size_t>(m) * blocks_ +
                                     (static_cast<size_t>(g) * group + k0) / 32) *
                                        Scheme::BLOCK_BYTES;
      int32_t centre[Scheme::HALVES][8] = {};
      for (int i = 0; i < 32; i++) {
        long a = std::clamp<long>(std::lrint(x[k0 + order[i]] * per_unit), -most, most);
        long value[Scheme::COUNT];  // balanced digits, the least significant found first
        for (int j = Scheme::COUNT - 1; j > 0; j--) {
          value[j] = ((a + half) & (base - 1)) - half;
          a = (a - value[j]) / base;  // exact: a - digit is a multiple of base
        }
        value[0] = a;
        const int per_half = Scheme::COUNT / Scheme::HALVES;
        for (int h = 0; h < Scheme::HALVES; h++) {
          long part = 0;  // this half's digits as one number
          for (int j = h * per_half; j < (h + 1) * per_half; j++) part = part * base + value[j];
          centre[h][i / 4] += static_cast<int32_t>(part * Scheme::CENTRE);
        }
        for (int j = 0; j < Scheme::COUNT; j++) out[32 * j + i] = static_cast<int8_t>(value[j]);
      }
      std::memcpy(out + 32 * Scheme::COUNT, centre, sizeof centre);
    }
  }

  int blocks_, groups_;
  std::vector<int8_t> bytes_;
  std::vector<float> steps_, sums_;
};

}  // namespace mlxlmb
