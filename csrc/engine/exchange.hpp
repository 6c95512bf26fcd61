// Point-to-point exchange between two ranks of a group, under the group's deadline.
//
// Note [A receive never truncates]
// A receive posted for fewer bytes than its message is truncated, and Open
// MPI 5's TCP transport then writes past the receive buffer or crashes
// (checked with plain mpi4py between two namespace hosts). Ranks that call an
// allreduce differently do send such messages while the call check runs
// alongside the data (Note [Checking calls alongside the data]). So a receive
// first probes its message (MPI_Improbe) and receives it (MPI_Imrecv) only if
// it has the expected size; a message of another size is received into a
// buffer of its own size, kept until exit, and the exchange fails with a
// MismatchError (which the call check then explains). Probing costs no extra
// message: an eager message is already there, and a large one's transfer
// starts when its matching receive is found, as with a receive posted early.
#pragma once

#include <cstddef>

#include "process_group.hpp"

namespace tnt {

// The tag of the engine's point-to-point messages unless a call says otherwise
// (Note [Calls checked by their message tags] gives each call its own).
constexpr int kExchangeTag = 7001;

// Sends `send_bytes` to `destination` and receives exactly `receive_bytes`
// from `source` at once (either side may be 0 bytes or rank -1 to skip it),
// both with message tag `tag`.
void exchange(ProcessGroup& group, const void* send, std::size_t send_bytes, int destination, void* receive,
              std::size_t receive_bytes, int source, int tag, const char* what);

}  // namespace tnt
