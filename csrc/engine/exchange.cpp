#include "exchange.hpp"

#include <vector>

#include "mpi_call.hpp"

namespace tnt {

namespace {
constexpr int kExchangeTag = 7001;
}

void exchange(ProcessGroup& group, const void* send, std::size_t send_bytes, int destination, void* receive,
              std::size_t receive_bytes, int source, const char* what) {
  std::vector<MPI_Request> requests;
  std::vector<int> peers;
  requests.reserve(2);
  if (source >= 0) {
    requests.emplace_back();
    TNT_MPI(MPI_Irecv(receive, checked_count(receive_bytes), MPI_BYTE, source, kExchangeTag, group.comm(),
                      &requests.back()));
    peers.push_back(source);
  }
  if (destination >= 0) {
    requests.emplace_back();
    TNT_MPI(MPI_Isend(send, checked_count(send_bytes), MPI_BYTE, destination, kExchangeTag, group.comm(),
                      &requests.back()));
    peers.push_back(destination);
  }
  group.wait_all(requests, peers, what);
}

}  // namespace tnt
