#include "reduce_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "errors.hpp"

namespace tnt {

float half_to_float(unsigned short h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t exponent = (h >> 10) & 0x1Fu;
  std::uint32_t mantissa = h & 0x3FFu;
  std::uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int shift = 0;
      while ((mantissa & 0x400u) == 0) {
        mantissa <<= 1;
        ++shift;
      }
      mantissa &= 0x3FFu;
      bits = sign | static_cast<std::uint32_t>(127 - 15 - shift + 1) << 23 | mantissa << 13;
    }
  } else if (exponent == 0x1F) {
    // NaNs come out quiet, as float_to_half stores them, so a value's order
    // under min/max does not change when it is narrowed between two steps.
    bits = sign | 0x7F800000u | mantissa << 13 | (mantissa ? 0x400000u : 0u);
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

unsigned short float_to_half(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  const std::uint32_t abs = bits & 0x7FFFFFFFu;
  if (abs >= 0x7F800000u) {  // inf or nan
    // A NaN stays quiet and keeps the top of its payload (Note [Min and max of floating point]).
    return static_cast<unsigned short>(sign | 0x7C00u | (abs > 0x7F800000u ? 0x200u | ((abs >> 13) & 0x3FFu) : 0u));
  }
  if (abs >= 0x477FF000u) return static_cast<unsigned short>(sign | 0x7C00u);  // rounds to inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<unsigned short>(sign);
    // value = mantissa * 2^(exponent - 150) and the subnormal unit is 2^-24.
    const std::uint32_t exponent = abs >> 23;
    const std::uint32_t mantissa = (abs & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14..24 in this range
    std::uint32_t half = mantissa >> shift;
    const std::uint32_t remainder = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1);
    if (remainder > halfway || (remainder == halfway && (half & 1u))) ++half;
    return static_cast<unsigned short>(sign | half);
  }
  std::uint32_t result = ((abs >> 13) - ((127 - 15) << 10));
  const std::uint32_t remainder = abs & 0x1FFFu;
  if (remainder > 0x1000u || (remainder == 0x1000u && (result & 1u))) ++result;
  return static_cast<unsigned short>(sign | result);
}

float bfloat16_to_float(unsigned short h) {
  if ((h & 0x7FFFu) > 0x7F80u) h |= 0x40u;  // quiet, as in half_to_float
  const std::uint32_t bits = static_cast<std::uint32_t>(h) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

unsigned short float_to_bfloat16(float value) {
  std::uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<unsigned short>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<unsigned short>((bits + rounding) >> 16);
}

namespace {

struct Sum {
  template <typename T>
  static T apply(T a, T b) { return a + b; }
};
// Note [Min and max of floating point]
// `b < a ? b : a` returns whichever operand comes first when they compare
// unordered (NaN) or equal (-0 and +0), so min(a, b) and min(b, a) can differ
// in their bits, and recursive doubling (where partners combine the same two
// operands in opposite roles) would give ranks different results. These
// select under a total order instead, which makes them commutative and
// associative bit for bit, so every algorithm and every rank gives the same
// bits: NaN propagates (like numpy's minimum and maximum) and, between NaNs,
// the larger bit pattern wins; -0 is below +0.
template <typename T>
bool is_nan(T value) {
  return value != value;
}
template <typename T>
bool first_nan_wins(T a, T b) {  // both NaN
  typename std::conditional<sizeof(T) == 8, std::uint64_t, std::uint32_t>::type x, y;
  std::memcpy(&x, &a, sizeof a);
  std::memcpy(&y, &b, sizeof b);
  return x >= y;
}

struct Min {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (is_nan(a) || is_nan(b)) return !is_nan(b) || (is_nan(a) && first_nan_wins(a, b)) ? a : b;
      if (a == b) return std::signbit(a) ? a : b;
    }
    return b < a ? b : a;
  }
};
struct Max {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>) {
      if (is_nan(a) || is_nan(b)) return !is_nan(b) || (is_nan(a) && first_nan_wins(a, b)) ? a : b;
      if (a == b) return std::signbit(a) ? b : a;
    }
    return a < b ? b : a;
  }
};

struct Half {
  static float load(unsigned short h) { return half_to_float(h); }
  static unsigned short store(float f) { return float_to_half(f); }
};
struct BFloat {
  static float load(unsigned short h) { return bfloat16_to_float(h); }
  static unsigned short store(float f) { return float_to_bfloat16(f); }
};

template <typename T, typename Op>
__attribute__((target_clones("avx2", "default")))
void native_many(T* out, const void* const* in, int n, std::size_t count) {
  const T* first = static_cast<const T*>(in[0]);
  const T* second = static_cast<const T*>(in[1]);
  for (std::size_t i = 0; i < count; ++i) out[i] = Op::apply(first[i], second[i]);
  for (int k = 2; k < n; ++k) {
    const T* next = static_cast<const T*>(in[k]);
    for (std::size_t i = 0; i < count; ++i) out[i] = Op::apply(out[i], next[i]);
  }
}

template <typename Conv, typename Op>
void packed_many(unsigned short* out, const void* const* in, int n, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    float acc = Conv::load(static_cast<const unsigned short*>(in[0])[i]);
    for (int k = 1; k < n; ++k) acc = Op::apply(acc, Conv::load(static_cast<const unsigned short*>(in[k])[i]));
    out[i] = Conv::store(acc);
  }
}

template <typename Op>
void dispatch_many(void* out, const void* const* in, int n, std::size_t count, DType dtype) {
  switch (dtype) {
    case DType::float32: return native_many<float, Op>(static_cast<float*>(out), in, n, count);
    case DType::float64: return native_many<double, Op>(static_cast<double*>(out), in, n, count);
    case DType::int32: return native_many<std::int32_t, Op>(static_cast<std::int32_t*>(out), in, n, count);
    case DType::int64: return native_many<std::int64_t, Op>(static_cast<std::int64_t*>(out), in, n, count);
    case DType::float16: return packed_many<Half, Op>(static_cast<unsigned short*>(out), in, n, count);
    case DType::bfloat16: return packed_many<BFloat, Op>(static_cast<unsigned short*>(out), in, n, count);
  }
  TNT_ASSERT(false, "unknown dtype");
}

template <typename T>
void divide_native(T* buf, std::size_t count, int divisor) {
  const T d = static_cast<T>(divisor);
  for (std::size_t i = 0; i < count; ++i) buf[i] = buf[i] / d;
}

template <typename Conv>
void divide_packed(unsigned short* buf, std::size_t count, int divisor) {
  const float d = static_cast<float>(divisor);
  for (std::size_t i = 0; i < count; ++i) buf[i] = Conv::store(Conv::load(buf[i]) / d);
}

}  // namespace

void reduce_many(void* out, const void* const* in, int n, std::size_t count, DType dtype, ReduceOp op) {
  TNT_ASSERT(n >= 1, "reduce_many needs at least one input");
  if (count == 0) return;
  if (n == 1) {
    if (out != in[0]) std::memcpy(out, in[0], count * element_size(dtype));
    return;
  }
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average: return dispatch_many<Sum>(out, in, n, count, dtype);
    case ReduceOp::min: return dispatch_many<Min>(out, in, n, count, dtype);
    case ReduceOp::max: return dispatch_many<Max>(out, in, n, count, dtype);
  }
  TNT_ASSERT(false, "unknown op");
}

void reduce_into(void* acc, const void* in, std::size_t count, DType dtype, ReduceOp op) {
  combine_into(acc, acc, in, count, dtype, op);
}

void combine_into(void* out, const void* mine, const void* received, std::size_t count, DType dtype, ReduceOp op) {
  const void* inputs[2] = {mine, received};
  reduce_many(out, inputs, 2, count, dtype, op);
}

void finish_average(void* buf, std::size_t count, DType dtype, ReduceOp op, int divisor) {
  if (op != ReduceOp::average || divisor == 1) return;
  switch (dtype) {
    case DType::float32: return divide_native(static_cast<float*>(buf), count, divisor);
    case DType::float64: return divide_native(static_cast<double*>(buf), count, divisor);
    case DType::int32: return divide_native(static_cast<std::int32_t*>(buf), count, divisor);
    case DType::int64: return divide_native(static_cast<std::int64_t*>(buf), count, divisor);
    case DType::float16: return divide_packed<Half>(static_cast<unsigned short*>(buf), count, divisor);
    case DType::bfloat16: return divide_packed<BFloat>(static_cast<unsigned short*>(buf), count, divisor);
  }
}

}  // namespace tnt
