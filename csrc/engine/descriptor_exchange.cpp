#include "descriptor_exchange.hpp"

#include "errors.hpp"
#include "mpi_call.hpp"
#include "quarantine.hpp"

namespace tnt {

DescriptorExchange::DescriptorExchange(ProcessGroup& group, const char* what)
    : group_(group),
      what_(what),
      mine_(std::make_unique<Descriptor>()),
      all_(std::make_unique<std::vector<Descriptor>>(group.size())) {}

DescriptorExchange::~DescriptorExchange() {
  if (request_ != MPI_REQUEST_NULL && group_.failed()) {
    quarantine(std::move(mine_));
    quarantine(std::move(all_));
  }
}

void DescriptorExchange::start(const Descriptor& mine) {
  TNT_ASSERT(request_ == MPI_REQUEST_NULL, "a descriptor exchange started while the last one is pending");
  *mine_ = mine;
  complete_ = false;
  group_.guarded(what_, [&] {
    TNT_MPI(MPI_Iallgather(mine_->data(), static_cast<int>(sizeof(Descriptor)), MPI_BYTE, all_->data(),
                           static_cast<int>(sizeof(Descriptor)), MPI_BYTE, group_.comm(), &request_));
  });
}

bool DescriptorExchange::test() {
  if (complete_) return true;
  int flag = 0;
  TNT_MPI(MPI_Test(&request_, &flag, MPI_STATUS_IGNORE));
  complete_ = flag != 0;
  return complete_;
}

void DescriptorExchange::wait() {
  if (complete_) return;
  std::vector<MPI_Request> requests{request_};
  group_.guarded(what_, [&] { group_.wait_all(requests, {}, what_); });
  request_ = MPI_REQUEST_NULL;
  complete_ = true;
}

bool DescriptorExchange::all_same() const {
  TNT_ASSERT(complete_, "descriptors compared before they were all in");
  for (const Descriptor& theirs : *all_) {
    if (theirs != *mine_) return false;
  }
  return true;
}

}  // namespace tnt
