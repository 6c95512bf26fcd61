// A process-wide count of the bytes the gradient data path copies with
// memcpy (the fused reducer and the shared-memory allreduce), so that tests
// can check Note [Two copies per gradient byte] (fused_reducer.hpp).
// Defined in fused_reducer.cpp; read as FusedReducer::copied_bytes_in_process().
#pragma once

#include <cstddef>

namespace tnt {

void count_copied(std::size_t bytes);

}  // namespace tnt
