#include "exchange.hpp"

#include <memory>
#include <string>
#include <vector>

#include "errors.hpp"
#include "mpi_call.hpp"
#include "quarantine.hpp"

namespace tnt {

namespace {
// Note [A receive never truncates]: receives a message of the wrong size into
// a buffer of its own, kept until exit, and fails the exchange.
[[noreturn]] void refuse(ProcessGroup& group, MPI_Message& message, int bytes, std::size_t expected, int source,
                         const char* what) {
  auto sink = std::make_shared<std::vector<char>>(static_cast<std::size_t>(bytes));
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Imrecv(sink->data(), bytes, MPI_BYTE, &message, &request);
  if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  keep_until_exit(sink);
  const std::string text = std::string(what) + ": " + group.describe_ranks({source}) + " sent " +
                           std::to_string(bytes) + " bytes where this rank expected " + std::to_string(expected) +
                           " (the ranks called the collective differently)";
  group.mark_failed(text);
  throw MismatchError(text);
}
}  // namespace

void exchange(ProcessGroup& group, const void* send, std::size_t send_bytes, int destination, void* receive,
              std::size_t receive_bytes, int source, int tag, const char* what) {
  MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // send, receive
  const int expected = checked_count(receive_bytes);
  if (destination >= 0) {
    TNT_MPI(MPI_Isend(send, checked_count(send_bytes), MPI_BYTE, destination, tag, group.comm(),
                      &requests[0]));
  }
  bool matched = source < 0;
  group.wait_until(
      [&] {
        if (!matched) {
          int found = 0;
          MPI_Message message = MPI_MESSAGE_NULL;
          MPI_Status status;
          TNT_MPI(MPI_Improbe(source, tag, group.comm(), &found, &message, &status));
          if (found) {
            int bytes = 0;
            TNT_MPI(MPI_Get_count(&status, MPI_BYTE, &bytes));
            if (bytes != expected) refuse(group, message, bytes, receive_bytes, source, what);
            TNT_MPI(MPI_Imrecv(receive, expected, MPI_BYTE, &message, &requests[1]));
            matched = true;
          }
        }
        int done = 0;
        TNT_MPI(MPI_Testall(2, requests, &done, MPI_STATUSES_IGNORE));
        return matched && done != 0;
      },
      what,
      [&] {
        std::vector<int> missing;
        if (requests[0] != MPI_REQUEST_NULL) missing.push_back(destination);
        if ((!matched || requests[1] != MPI_REQUEST_NULL) && source != destination) missing.push_back(source);
        if (missing.empty() && source >= 0) missing.push_back(source);
        return group.describe_ranks(missing);
      });
}

}  // namespace tnt
