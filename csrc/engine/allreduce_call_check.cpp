#include "allreduce_call_check.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include "errors.hpp"
#include "fnv1a.hpp"
#include "mpi_call.hpp"

namespace tnt {

namespace {
// How long a failed data exchange waits for the descriptors that may explain it.
constexpr double kExplainSeconds = 5.0;
// Tags of the notice "some ranks call differently", for calls of even and odd
// sequence number (below every checked tag, Note [Calls checked by their message tags]).
constexpr int kNoticeTag = 7002;
// Wait rounds between two looks at the other ranks' pending messages.
constexpr unsigned kWatchEvery = 4;

Descriptor describe(const AllreduceCall& call, Algorithm asked) {
  return Descriptor{call.count, static_cast<std::uint64_t>(call.dtype), static_cast<std::uint64_t>(call.op),
                    static_cast<std::uint64_t>(asked), 0, 0};
}

std::string describe_asked(const AllreduceCall& call, Algorithm asked) {
  return describe_call(call.count, call.dtype, call.op) + " via " + algorithm_name(asked);
}

// The bits a tag may use: the largest b with 2^b - 1 <= MPI_TAG_UB (at least
// 15 by the standard, which promises the attribute on MPI_COMM_WORLD).
int tag_bits() {
  void* value = nullptr;
  int flag = 0;
  TNT_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag));
  const long long bound = flag ? *static_cast<int*>(value) : 32767;
  int bits = 15;
  while (bits < 31 && (1LL << (bits + 1)) - 1 <= bound) ++bits;
  return bits;
}
}  // namespace

AllreduceCallCheck::AllreduceCallCheck(ProcessGroup& group)
    : group_(group),
      exchange_(group, "allreduce (checking that all ranks call it alike)"),
      hash_bits_(tag_bits() - 2) {}

void AllreduceCallCheck::run(const AllreduceCall& call, Algorithm asked, bool check_first,
                             const std::function<void()>& data_exchange) {
  exchange_.start(describe(call, asked));
  if (check_first) {
    exchange_.wait();
    if (!exchange_.all_same()) throw_mismatch(false);
    data_exchange();
    return;
  }
  try {
    WaitHook hook([this] {
      if (exchange_.test() && !exchange_.all_same()) throw_mismatch(true);
    });
    data_exchange();
  } catch (const TimeoutError&) {
    explain_failure(0.0);  // the descriptors had the whole timeout to arrive
    throw;
  } catch (...) {
    explain_failure(kExplainSeconds);
    throw;
  }
  exchange_.wait();
  if (!exchange_.all_same()) throw_mismatch(true);
}

int AllreduceCallCheck::next_tag(const Descriptor& d) {
  Fnv1a hash;
  for (std::uint64_t word : d) hash.add(word);
  const int parity = static_cast<int>(calls_++ & 1u);
  const int low = static_cast<int>(hash.value() & ((1ull << hash_bits_) - 1));
  return (1 << (hash_bits_ + 1)) | (parity << hash_bits_) | low;
}

void AllreduceCallCheck::run_tagged(const AllreduceCall& call, Algorithm asked, bool check_first,
                                    const std::function<void(int tag)>& data_exchange) {
  const Descriptor mine = describe(call, asked);
  const int tag = next_tag(mine);
  found_other_call_ = false;
  exchange_started_ = false;
  watch_round_ = 0;
  try {
    WaitHook hook([&] { watch_for_other_calls(tag, call, asked); });
    if (check_first) {
      exchange_.start(mine);
      exchange_started_ = true;
      exchange_.wait();
      if (!exchange_.all_same()) throw_mismatch(false);
    }
    data_exchange(tag);
  } catch (const MismatchError& error) {
    if (!found_other_call_) throw;  // found before any data moved, or a receive refused
    // Every rank learns of it (the notice): all exchange their descriptors to name each call.
    if (!exchange_started_) exchange_.start(mine);
    exchange_started_ = true;
    explain_failure(kExplainSeconds);
    group_.mark_failed(error.what());
    throw;
  }
}

void AllreduceCallCheck::watch_for_other_calls(int tag, const AllreduceCall& call, Algorithm asked) {
  // One other rank per look, in turn: a look costs two probes however many ranks the group has.
  if (watch_round_++ % kWatchEvery != 0) return;
  const int parity = (tag >> hash_bits_) & 1;
  int flag = 0;
  MPI_Status status;
  TNT_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag + parity, group_.comm(), &flag, &status));
  if (flag) {
    found_other_call(group_.describe_ranks({status.MPI_SOURCE}) + " found ranks calling differently", call, asked);
  }
  const int other = static_cast<int>((group_.rank() + 1 + (watch_round_ / kWatchEvery) % (group_.size() - 1)) %
                                     group_.size());
  TNT_MPI(MPI_Iprobe(other, MPI_ANY_TAG, group_.comm(), &flag, &status));
  // Only a checked call's message (high bit set) of this call's parity can differ from this call.
  const int theirs = flag ? status.MPI_TAG : tag;
  if (theirs == tag || (theirs >> (hash_bits_ + 1)) != 1 || ((theirs >> hash_bits_) & 1) != parity) return;
  found_other_call(group_.describe_ranks({other}) + " sent data of a different call", call, asked);
}

void AllreduceCallCheck::found_other_call(const std::string& what, const AllreduceCall& call, Algorithm asked) {
  found_other_call_ = true;
  if (!noticed_) {
    noticed_ = true;
    const int parity = static_cast<int>((calls_ - 1) & 1u);
    static const char nothing = 0;
    for (int r = 0; r < group_.size(); ++r) {
      if (r == group_.rank()) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      TNT_MPI(MPI_Isend(&nothing, 0, MPI_BYTE, r, kNoticeTag + parity, group_.comm(), &request));
      TNT_MPI(MPI_Request_free(&request));
    }
  }
  throw MismatchError("allreduce called differently on different ranks: " + what + " while rank " +
                      std::to_string(group_.world_rank_of(group_.rank())) + " had " + describe_asked(call, asked) +
                      " (found while the data moved, so this process group is unusable from now on)");
}

void AllreduceCallCheck::explain_failure(double seconds) {
  try {
    Deadline deadline(WaitLimits{seconds, seconds + 1.0});
    deadline.wait([this] { return exchange_.test(); }, "allreduce (checking that all ranks call it alike)",
                  [] { return std::string("the other ranks' call descriptors"); });
  } catch (const Error&) {
    return;  // nothing to add: the data exchange's own failure stands
  }
  if (!exchange_.all_same()) throw_mismatch(true);
}

void AllreduceCallCheck::throw_mismatch(bool data_moved) {
  std::vector<std::string> calls;
  for (int r = 0; r < group_.size(); ++r) {
    const Descriptor& d = exchange_.of(r);
    AllreduceCall theirs{nullptr, nullptr, static_cast<std::size_t>(d[0]), static_cast<DType>(d[1]),
                         static_cast<ReduceOp>(d[2])};
    calls.push_back(describe_asked(theirs, static_cast<Algorithm>(d[3])));
  }
  std::string text = mismatched_calls_message(group_, calls);
  if (data_moved) {
    text += " (found while the data moved, so this process group is unusable from now on)";
    group_.mark_failed(text);
  }
  throw MismatchError(text);
}

}  // namespace tnt
