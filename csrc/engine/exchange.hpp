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
// A message goes in pieces (Note [Messages in pieces]): each piece is probed
// and refused alike, so no piece is ever received into less than its size.
//
// Note [Messages in pieces]
// Open MPI sends a message up to its transport's eager limit at once; a longer
// one goes by rendezvous: a first fragment, then the receiver's
// acknowledgement, then the rest, each turn waiting for the other side to be
// scheduled and to poll. The TCP transport's limit is 64 KiB including its
// headers (`ompi_info --param btl tcp --level 9`: btl_tcp_eager_limit). So an
// exchange sends a message in pieces of at most kPieceBytes, posted ahead
// (up to kPiecesInFlight at once), and receives them in order (MPI keeps the order of messages with one
// source, tag and communicator): no rendezvous turn, and the pieces stream
// back to back. On the namespace hosts of the benchmark (4 hosts x 1 rank)
// this made Rabenseifner 1.5-2x faster from 256 KiB to 4 MiB and 1.1x at
// 64 MiB; pieces of 16 KiB were slower (more messages), 32 KiB less fast.
// Where a fabric's eager limit is smaller, pieces still go concurrently.
// A piece costs a probe and a request; the receiver may take pieces in as
// unexpected messages (buffered by MPI) when it polls late. At most
// kPiecesInFlight pieces of a message are under way at once, the next posted
// as the oldest completes: with all of a 32 MiB message's 520 pieces posted at
// once, 4 ranks on one node (Open MPI's shared-memory transport, whose eager
// limit is 4 KiB, so every piece a rendezvous) hung in the allreduce after
// one such call (tests/engine/programs/check_collectives.py, 64 MiB).
#pragma once

#include <cstddef>

#include "process_group.hpp"

namespace tnt {

// The tag of the engine's point-to-point messages unless a call says otherwise
// (Note [Calls checked by their message tags] gives each call its own).
constexpr int kExchangeTag = 7001;

// The largest message an exchange sends in one piece (Note [Messages in
// pieces]): 63 KiB, below the TCP eager limit with room for headers.
constexpr std::size_t kPieceBytes = 63 * 1024;
// The most pieces of one message under way at once (Note [Messages in pieces]).
constexpr std::size_t kPiecesInFlight = 16;

// Sends `send_bytes` to `destination` and receives exactly `receive_bytes`
// from `source` at once (either side may be 0 bytes or rank -1 to skip it),
// both with message tag `tag`.
void exchange(ProcessGroup& group, const void* send, std::size_t send_bytes, int destination, void* receive,
              std::size_t receive_bytes, int source, int tag, const char* what);

}  // namespace tnt
