// All-to-all of byte blocks of any size: rank r sends blocks[s] to rank s and
// receives one block from every rank. The data plane of the per-rank reading
// of Python inputs (tarantella/data/batch_exchange.py): each rank reads some
// global batches in full and gives every other rank its micro-batch of them,
// so a rank receives about 1/N of each global batch instead of all of it.
#pragma once

#include <string>
#include <vector>

#include "process_group.hpp"

namespace tnt {

// Collective over `group`: `blocks` (byte strings) holds group.size() blocks (block s goes to
// rank s, any size, empty allowed); returns the block every rank sent to this
// one, in rank order. One exchange of the sizes, then MPI_Ialltoallv, both
// under the group's deadline; refused on a failed group (Note [A failed group
// stays failed]). Each block and the sum of what a rank sends or receives stay
// below kMaxMessageBytes.
std::vector<std::string> alltoallv(ProcessGroup& group, const std::vector<std::string>& blocks);

}  // namespace tnt
