#include "alltoall.hpp"

#include <memory>
#include <string>

#include "errors.hpp"
#include "mpi_call.hpp"
#include "quarantine.hpp"

namespace tnt {

namespace {

// Counts and displacements of blocks laid out one after the other.
std::size_t lay_out(const std::vector<long long>& sizes, std::vector<int>& counts, std::vector<int>& displacements) {
  std::size_t total = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    counts[r] = checked_count(static_cast<std::size_t>(sizes[r]));
    displacements[r] = checked_count(total);
    total += static_cast<std::size_t>(sizes[r]);
  }
  checked_count(total);
  return total;
}

}  // namespace

// Everything MPI reads or writes during the exchange (the count arrays of a non-blocking
// collective too, until it completes): one object, so a failed call keeps all of it.
struct Exchange {
  std::vector<long long> send_sizes, receive_sizes;
  std::vector<int> send_counts, send_displacements, receive_counts, receive_displacements;
  std::vector<char> send, receive;
  explicit Exchange(int size)
      : send_sizes(size), receive_sizes(size), send_counts(size), send_displacements(size), receive_counts(size),
        receive_displacements(size) {}
};

std::vector<std::string> alltoallv(ProcessGroup& group, const std::vector<std::string>& blocks) {
  const int size = group.size();
  if (static_cast<int>(blocks.size()) != size) {
    throw UsageError("alltoallv: got " + std::to_string(blocks.size()) + " blocks for a group of " +
                     std::to_string(size) + " ranks; give one block (possibly empty) per rank");
  }
  // Note [Memory that a failed collective may still write]: kept until exit if the call fails.
  auto state = std::make_shared<Exchange>(size);
  Exchange& x = *state;
  for (int r = 0; r < size; ++r) x.send_sizes[r] = static_cast<long long>(blocks[r].size());
  x.send.reserve(lay_out(x.send_sizes, x.send_counts, x.send_displacements));
  for (const auto& block : blocks) x.send.insert(x.send.end(), block.begin(), block.end());
  try {
    group.guarded("alltoallv", [&] {
      std::vector<MPI_Request> request(1);
      TNT_MPI(MPI_Ialltoall(x.send_sizes.data(), 1, MPI_LONG_LONG, x.receive_sizes.data(), 1, MPI_LONG_LONG,
                            group.comm(), &request[0]));
      group.wait_all(request, {}, "alltoallv (sizes)");
      x.receive.resize(lay_out(x.receive_sizes, x.receive_counts, x.receive_displacements));
      TNT_MPI(MPI_Ialltoallv(x.send.data(), x.send_counts.data(), x.send_displacements.data(), MPI_BYTE,
                             x.receive.data(), x.receive_counts.data(), x.receive_displacements.data(), MPI_BYTE,
                             group.comm(), &request[0]));
      group.wait_all(request, {}, "alltoallv");
    });
  } catch (...) {
    if (group.failed()) keep_until_exit(state);
    throw;
  }
  std::vector<std::string> received(size);
  for (int r = 0; r < size; ++r) {
    received[r].assign(x.receive.begin() + x.receive_displacements[r],
                       x.receive.begin() + x.receive_displacements[r] + x.receive_counts[r]);
  }
  return received;
}

}  // namespace tnt
