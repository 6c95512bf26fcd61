// Element types and reduction operations the engine understands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace tnt {

enum class DType : int { float32 = 0, float64 = 1, float16 = 2, bfloat16 = 3, int32 = 4, int64 = 5 };

enum class ReduceOp : int { sum = 0, average = 1, min = 2, max = 3 };

std::size_t element_size(DType dtype);
const char* dtype_name(DType dtype);
const char* op_name(ReduceOp op);
DType dtype_from_name(const std::string& name);    // throws UsageError
ReduceOp op_from_name(const std::string& name);    // throws UsageError

}  // namespace tnt
