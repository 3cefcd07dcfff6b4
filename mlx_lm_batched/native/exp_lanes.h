/* exp in 16 float32 lanes, by layers/cpu_ops.py's formula (C++: vector conditionals).
 * Shared by decode_attention.cpp (softmax) and swiglu.cpp (SiLU), so the CPU
 * primitives and cpu_ops' composed formulas compute the same values. */
#pragma once

#include <cstring>

#include "lanes.h"

namespace mlxlmb {

/* exp(x): 2^round(t) from the exponent bits times 2^f, f = t - round(t) in
 * [-1/2, 1/2], by Taylor's polynomial of degree 7; t = x log2 e clipped to
 * [-127, 127.49] (exp of less is 0, of more saturates at 2^127 * 1.4). */
constexpr float LOG2E = 1.4426950408889634f;
constexpr float POLY[8] = {1.0f,
                           0.6931471805599453f,
                           0.2402265069591007f,
                           0.05550410866482158f,
                           0.009618129107628477f,
                           0.0013333558146428443f,
                           0.00015403530393381606f,
                           1.525273380405984e-05f};

inline vf exp_lanes(vf x) {
  const vf lo = vf{} - 127.0f, hi = vf{} + 127.49f;
  vf t = x * LOG2E;
  t = t < lo ? lo : t;
  t = t > hi ? hi : t;
  vi m = __builtin_convertvector(t + 127.5f, vi); /* round(t) + 127, in [0, 254] */
  vf f = t - __builtin_convertvector(m - 127, vf);
  vf p = vf{} + POLY[7];
  for (int c = 6; c >= 0; c--) p = p * f + POLY[c];
  vi bits = m << 23; /* the float 2^(m - 127) */
  vf power;
  std::memcpy(&power, &bits, sizeof power);
  return p * power;
}

}  // namespace mlxlmb
