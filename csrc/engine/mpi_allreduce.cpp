// The MPI library's own non-blocking allreduce, as a baseline. float16 and
// bfloat16 have no MPI type, so they travel as 16-bit words with a user-defined
// op that calls our kernels; so does floating-point min and max (needs_own_op).
#include <mpi.h>

#include "allreduce.hpp"
#include "errors.hpp"
#include "mpi_call.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

namespace {

template <DType D, ReduceOp O>
void own_op(void* in, void* inout, int* len, MPI_Datatype*) {
  reduce_into(inout, in, static_cast<std::size_t>(*len), D, O);
}

template <DType D>
MPI_User_function* own_op_for(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average: return own_op<D, ReduceOp::sum>;
    case ReduceOp::min: return own_op<D, ReduceOp::min>;
    case ReduceOp::max: return own_op<D, ReduceOp::max>;
  }
  TNT_ASSERT(false, "unknown op");
}

// float16 and bfloat16 have no MPI type; floating-point min and max must
// treat NaN and -0 alike on every rank (Note [Min and max of floating point]),
// which MPI_MIN and MPI_MAX do not promise.
bool needs_own_op(DType dtype, ReduceOp op) {
  if (dtype == DType::float16 || dtype == DType::bfloat16) return true;
  const bool floating = dtype == DType::float32 || dtype == DType::float64;
  return floating && (op == ReduceOp::min || op == ReduceOp::max);
}

MPI_Op make_own_op(DType dtype, ReduceOp op) {
  MPI_User_function* fn = nullptr;
  switch (dtype) {
    case DType::float16: fn = own_op_for<DType::float16>(op); break;
    case DType::bfloat16: fn = own_op_for<DType::bfloat16>(op); break;
    case DType::float32: fn = own_op_for<DType::float32>(op); break;
    case DType::float64: fn = own_op_for<DType::float64>(op); break;
    default: TNT_ASSERT(false, "integers use MPI's own ops");
  }
  MPI_Op handle = MPI_OP_NULL;
  TNT_MPI(MPI_Op_create(fn, 1, &handle));
  return handle;
}

MPI_Datatype mpi_type(DType dtype) {
  switch (dtype) {
    case DType::float32: return MPI_FLOAT;
    case DType::float64: return MPI_DOUBLE;
    case DType::int32: return MPI_INT32_T;
    case DType::int64: return MPI_INT64_T;
    case DType::float16:
    case DType::bfloat16: return MPI_UINT16_T;
  }
  TNT_ASSERT(false, "unknown dtype");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::average: return MPI_SUM;
    case ReduceOp::min: return MPI_MIN;
    case ReduceOp::max: return MPI_MAX;
  }
  TNT_ASSERT(false, "unknown op");
}

}  // namespace

void mpi_allreduce(ProcessGroup& group, const AllreduceCall& call) {
  const bool packed = needs_own_op(call.dtype, call.op);
  MPI_Op op = packed ? make_own_op(call.dtype, call.op) : mpi_op(call.op);
  const void* send = call.in == call.out ? MPI_IN_PLACE : call.in;
  std::vector<MPI_Request> request(1);
  const std::size_t bytes = call.count * element_size(call.dtype);
  checked_count(bytes);
  try {
    TNT_MPI(MPI_Iallreduce(send, call.out, static_cast<int>(call.count), mpi_type(call.dtype), op, group.comm(),
                           &request[0]));
    group.wait_all(request, {}, "MPI allreduce");
  } catch (...) {
    if (packed) MPI_Op_free(&op);
    throw;
  }
  if (packed) TNT_MPI(MPI_Op_free(&op));
}

}  // namespace tnt
