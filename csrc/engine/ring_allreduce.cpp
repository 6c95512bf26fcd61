// Ring allreduce: a reduce-scatter in p-1 steps around the ring, then an
// allgather in p-1 steps. Bandwidth-optimal for any rank count; each chunk is
// reduced along the ring by one path and then copied (Note [Bitwise identical results]).
#include <cstring>

#include "allreduce.hpp"
#include "exchange.hpp"
#include "reduce_kernels.hpp"

namespace tnt {

void ring_allreduce(ProcessGroup& group, const AllreduceCall& call, std::vector<char>& scratch) {
  const int p = group.size();
  const int r = group.rank();
  const std::size_t elem = element_size(call.dtype);
  char* out = static_cast<char*>(call.out);
  if (call.out != call.in) std::memmove(out, call.in, call.count * elem);
  const int right = (r + 1) % p;
  const int left = (r - 1 + p) % p;
  scratch.resize(part_of(call.count, p, 0).length * elem);
  auto chunk = [&](int index) { return part_of(call.count, p, ((index % p) + p) % p); };

  for (int step = 0; step < p - 1; ++step) {
    const Range send = chunk(r - step);
    const Range receive = chunk(r - step - 1);
    exchange(group, out + send.offset * elem, send.length * elem, right, scratch.data(), receive.length * elem, left,
             call.tag, "ring allreduce (reduce-scatter)");
    reduce_into(out + receive.offset * elem, scratch.data(), receive.length, call.dtype, call.op);
  }
  for (int step = 0; step < p - 1; ++step) {
    const Range send = chunk(r + 1 - step);
    const Range receive = chunk(r - step);
    exchange(group, out + send.offset * elem, send.length * elem, right, out + receive.offset * elem,
             receive.length * elem, left, call.tag, "ring allreduce (allgather)");
  }
}

}  // namespace tnt
