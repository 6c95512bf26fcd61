// Point-to-point exchange between two ranks of a group, under the group's deadline.
#pragma once

#include <cstddef>

#include "process_group.hpp"

namespace tnt {

// Sends `send_bytes` to `destination` and receives `receive_bytes` from
// `source` at once (either side may be 0 bytes or rank -1 to skip it).
void exchange(ProcessGroup& group, const void* send, std::size_t send_bytes, int destination, void* receive,
              std::size_t receive_bytes, int source, const char* what);

}  // namespace tnt
