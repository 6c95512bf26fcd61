#include "dtype.hpp"

#include "errors.hpp"

namespace tnt {

std::size_t element_size(DType dtype) {
  switch (dtype) {
    case DType::float32: return 4;
    case DType::float64: return 8;
    case DType::float16: return 2;
    case DType::bfloat16: return 2;
    case DType::int32: return 4;
    case DType::int64: return 8;
  }
  TNT_ASSERT(false, "unknown dtype");
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::float32: return "float32";
    case DType::float64: return "float64";
    case DType::float16: return "float16";
    case DType::bfloat16: return "bfloat16";
    case DType::int32: return "int32";
    case DType::int64: return "int64";
  }
  return "unknown";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::average: return "average";
    case ReduceOp::min: return "min";
    case ReduceOp::max: return "max";
  }
  return "unknown";
}

DType dtype_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(DType::int64); ++i) {
    if (name == dtype_name(static_cast<DType>(i))) return static_cast<DType>(i);
  }
  throw UsageError("unsupported dtype '" + name +
                   "': tarantella reduces float32, float64, float16, bfloat16, int32 and int64");
}

ReduceOp op_from_name(const std::string& name) {
  for (int i = 0; i <= static_cast<int>(ReduceOp::max); ++i) {
    if (name == op_name(static_cast<ReduceOp>(i))) return static_cast<ReduceOp>(i);
  }
  throw UsageError("unknown reduction op '" + name + "': use sum, average, min or max");
}

}  // namespace tnt
