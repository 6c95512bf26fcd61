#include "exchange.hpp"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "errors.hpp"
#include "mpi_call.hpp"
#include "quarantine.hpp"

namespace tnt {

namespace {
// The pieces of a message of `bytes` (Note [Messages in pieces]); an empty message is one piece.
std::size_t piece_count(std::size_t bytes) { return bytes == 0 ? 1 : (bytes + kPieceBytes - 1) / kPieceBytes; }

// The size of piece `index` of a message of `bytes`.
int piece_size(std::size_t bytes, std::size_t index) {
  return static_cast<int>(std::min(kPieceBytes, bytes - index * kPieceBytes));
}

// Note [A receive never truncates]: receives a message of the wrong size into
// a buffer of its own, kept until exit, and fails the exchange.
[[noreturn]] void refuse(ProcessGroup& group, MPI_Message& message, int bytes, int expected, std::size_t whole,
                         int source, const char* what) {
  auto sink = std::make_shared<std::vector<char>>(static_cast<std::size_t>(bytes));
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Imrecv(sink->data(), bytes, MPI_BYTE, &message, &request);
  if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
  keep_until_exit(sink);
  const std::string piece =
      static_cast<std::size_t>(expected) == whole ? "" : " (a piece of its " + std::to_string(whole) + ")";
  const std::string text = std::string(what) + ": " + group.describe_ranks({source}) + " sent " +
                           std::to_string(bytes) + " bytes where this rank expected " + std::to_string(expected) +
                           piece + " (the ranks called the collective differently)";
  group.mark_failed(text);
  throw MismatchError(text);
}
}  // namespace

void exchange(ProcessGroup& group, const void* send, std::size_t send_bytes, int destination, void* receive,
              std::size_t receive_bytes, int source, int tag, const char* what) {
  checked_count(send_bytes);
  checked_count(receive_bytes);
  const std::size_t sends = destination >= 0 ? piece_count(send_bytes) : 0;
  const std::size_t receives = source >= 0 ? piece_count(receive_bytes) : 0;
  // The sends' requests, then the receives', each in piece order.
  std::vector<MPI_Request> requests(sends + receives, MPI_REQUEST_NULL);
  const char* from = static_cast<const char*>(send);
  std::size_t posted = 0;  // sends under way or done, in order
  std::size_t sent = 0;    // sends done, in order
  // Keeps at most kPiecesInFlight sends under way (Note [Messages in pieces]).
  auto post_sends = [&] {
    while (sent < posted) {
      int done = 0;
      TNT_MPI(MPI_Test(&requests[sent], &done, MPI_STATUS_IGNORE));
      if (!done) break;
      ++sent;
    }
    for (; posted < sends && posted - sent < kPiecesInFlight; ++posted) {
      TNT_MPI(MPI_Isend(from + posted * kPieceBytes, piece_size(send_bytes, posted), MPI_BYTE, destination, tag,
                        group.comm(), &requests[posted]));
    }
  };
  post_sends();
  char* into = static_cast<char*>(receive);
  std::size_t matched = 0;  // pieces received into place or under way, in order
  group.wait_until(
      [&] {
        post_sends();
        while (matched < receives) {
          int found = 0;
          MPI_Message message = MPI_MESSAGE_NULL;
          MPI_Status status;
          TNT_MPI(MPI_Improbe(source, tag, group.comm(), &found, &message, &status));
          if (!found) break;
          const int expected = piece_size(receive_bytes, matched);
          int bytes = 0;
          TNT_MPI(MPI_Get_count(&status, MPI_BYTE, &bytes));
          if (bytes != expected) refuse(group, message, bytes, expected, receive_bytes, source, what);
          TNT_MPI(MPI_Imrecv(into + matched * kPieceBytes, expected, MPI_BYTE, &message, &requests[sends + matched]));
          ++matched;
        }
        if (posted < sends || matched < receives) return false;
        int done = 0;
        TNT_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE));
        return done != 0;
      },
      what,
      [&] {
        const bool sending = posted < sends || std::any_of(requests.begin(), requests.begin() + sends,
                                                           [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
        const bool receiving = matched < receives || std::any_of(requests.begin() + sends, requests.end(),
                                                                 [](MPI_Request r) { return r != MPI_REQUEST_NULL; });
        std::vector<int> missing;
        if (sending) missing.push_back(destination);
        if (receiving && source != destination) missing.push_back(source);
        if (missing.empty() && source >= 0) missing.push_back(source);
        return group.describe_ranks(missing);
      });
}

}  // namespace tnt
