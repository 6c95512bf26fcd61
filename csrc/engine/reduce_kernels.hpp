// Element-wise reduction kernels. Every kernel combines its inputs in the
// order given, so the same inputs in the same order give the same bits.
// float16 and bfloat16 are widened to float32, combined, and rounded back
// to nearest-even once per call.
#pragma once

#include <cstddef>

#include "dtype.hpp"

namespace tnt {

// acc[i] = acc[i] (op) in[i]; `average` combines like `sum`.
void reduce_into(void* acc, const void* in, std::size_t count, DType dtype, ReduceOp op);

// Note [Reading the input in place]
// An allreduce with `out` apart from `in` need not copy `in` to `out` first:
// its first step reads `in` and writes mine (op) received into `out`, with the
// same bits as copying and then reduce_into. The flat algorithms whose first
// step reads the whole input (recursive doubling, Rabenseifner without a fold)
// save that copy, a memory pass over the message on every call.
// out[i] = mine[i] (op) received[i]; `out` may alias `mine`.
void combine_into(void* out, const void* mine, const void* received, std::size_t count, DType dtype, ReduceOp op);

// out[i] = in[0][i] (op) in[1][i] (op) ... (op) in[n-1][i], left to right.
// `out` may alias in[0].
void reduce_many(void* out, const void* const* in, int n, std::size_t count, DType dtype, ReduceOp op);

// For `average`: buf[i] /= divisor (integers truncate toward zero). No-op for other ops.
void finish_average(void* buf, std::size_t count, DType dtype, ReduceOp op, int divisor);

float half_to_float(unsigned short bits);
unsigned short float_to_half(float value);
float bfloat16_to_float(unsigned short bits);
unsigned short float_to_bfloat16(float value);

}  // namespace tnt
