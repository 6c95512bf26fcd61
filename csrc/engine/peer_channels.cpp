#include "peer_channels.hpp"

#include <algorithm>
#include <chrono>
#include <map>

#include "deadline.hpp"
#include "errors.hpp"
#include "log.hpp"
#include "mpi_call.hpp"

namespace tnt {

namespace {

const char* kind_name(Transfer::Kind kind) { return kind == Transfer::Kind::send ? "send" : "receive"; }

// A receive whose size differs from the sender's is the user's mistake (the
// two sides disagree about a tensor's shape), not an MPI failure.
const char* const kSizeMismatch = "size mismatch: ";

// How often the progress thread looks for overdue transfers while nothing completes (Note [Transfers
// expire on the progress thread]): small against any timeout, rare against the polling.
constexpr std::chrono::milliseconds kExpiryCheckInterval{50};

// How long after the last queued or completed transfer an awaited receive is polled without sleeping (Note
// [Awaited receives are polled without sleeping]): longer than a pipeline's pass, short against the
// pauses between steps and epochs, after which the back-off sleeps again.
constexpr std::chrono::milliseconds kBriskPolling{50};

// Live channels by id, for the TensorFlow face (PeerChannels::with_channels).
std::mutex g_registry_mutex;
std::map<int, PeerChannels*> g_registry;
int g_next_id = 1;

}  // namespace

std::string Transfer::describe(const ProcessGroup& group) const {
  return std::string(kind_name(kind_)) + " of " + std::to_string(bytes_) + " bytes " +
         (kind_ == Kind::send ? "to " : "from ") + group.describe_ranks({peer_}) + " with tag " + std::to_string(tag_);
}

const char* const PeerChannels::kCancelled = "cancelled: the step that posted it failed on this rank";

int PeerChannels::max_tag() {
  void* value = nullptr;
  int flag = 0;
  TNT_MPI(MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &value, &flag));
  return flag ? *static_cast<int*>(value) : 32767;  // 32767: the least MPI guarantees
}

PeerChannels::PeerChannels(const ProcessGroup& group) : group_(group.duplicate()) {
  progress_thread_ = std::thread([this] { progress_loop(); });
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  id_ = g_next_id++;
  g_registry[id_] = this;
}

bool PeerChannels::with_channels(int id, const std::function<void(PeerChannels&)>& use) {
  std::lock_guard<std::mutex> lock(g_registry_mutex);
  auto found = g_registry.find(id);
  if (found == g_registry.end()) return false;
  use(*found->second);
  return true;
}

PeerChannels::~PeerChannels() {
  {
    std::lock_guard<std::mutex> lock(g_registry_mutex);
    g_registry.erase(id_);
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_.notify_all();
  if (progress_thread_.joinable()) progress_thread_.join();
}

TransferPtr PeerChannels::send(int peer, int tag, const void* data, std::size_t bytes) {
  return queue(Transfer::Kind::send, peer, tag, const_cast<void*>(data), bytes);
}

TransferPtr PeerChannels::receive(int peer, int tag, void* data, std::size_t bytes) {
  return queue(Transfer::Kind::receive, peer, tag, data, bytes);
}

TransferPtr PeerChannels::queue(Transfer::Kind kind, int peer, int tag, void* data, std::size_t bytes) {
  if (peer < 0 || peer >= group_->size() || peer == group_->rank()) {
    throw UsageError(std::string(kind_name(kind)) + ": peer " + std::to_string(peer) +
                     " is not another rank of this group of " + std::to_string(group_->size()) + " (this is rank " +
                     std::to_string(group_->rank()) + ")");
  }
  if (tag < 0 || tag > max_tag()) {
    throw UsageError(std::string(kind_name(kind)) + ": tag " + std::to_string(tag) + " is outside MPI's range 0.." +
                     std::to_string(max_tag()));
  }
  checked_count(bytes);
  auto transfer = std::make_shared<Transfer>();
  transfer->kind_ = kind;
  transfer->peer_ = peer;
  transfer->tag_ = tag;
  transfer->data_ = data;
  transfer->bytes_ = bytes;
  transfer->queued_at_ = std::chrono::steady_clock::now();
  {
    // Posted here, on the caller's thread (Note [Channels post on the caller's thread]), under the lock
    // so that transfers are posted in the order they are queued.
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_.empty()) throw Error("the peer channels failed earlier: " + error_);
    if (stopping_) throw UsageError("the peer channels are closed");
    post(*transfer);
    queued_.push_back(transfer);
  }
  work_.notify_one();
  return transfer;
}

// See Note [Channels post on the caller's thread].
void PeerChannels::progress_loop() {
  std::vector<int> indices;
  std::vector<MPI_Status> statuses;
  unsigned round = 0;
  auto last_expiry_check = std::chrono::steady_clock::now();
  auto last_news = last_expiry_check;   // a transfer queued or completed (Note [Awaited receives are polled
                                        // without sleeping])
  for (;;) {
    std::deque<TransferPtr> fresh;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (active_.empty()) work_.wait(lock, [&] { return stopping_ || !queued_.empty(); });
      if (stopping_) break;
      fresh.swap(queued_);
      active_count_ = active_.size() + fresh.size();
    }
    try {
      // New transfers restart the back-off: a receive just posted is usually awaited soon.
      if (!fresh.empty()) {
        round = 0;
        last_news = std::chrono::steady_clock::now();
      }
      for (TransferPtr& transfer : fresh) {
        active_.push_back(std::move(transfer));
        requests_.push_back(active_.back()->request_);
      }
      withdraw_cancelled();
      if (active_.empty()) continue;
      int count = 0;
      indices.resize(requests_.size());
      statuses.resize(requests_.size());
      const int rc = MPI_Testsome(static_cast<int>(requests_.size()), requests_.data(), &count, indices.data(),
                                  statuses.data());
      if (rc != MPI_SUCCESS && rc != MPI_ERR_IN_STATUS) raise_mpi_error(rc, "MPI_Testsome", __FILE__, __LINE__);
      if (count == MPI_UNDEFINED || count == 0) {
        const auto now = std::chrono::steady_clock::now();
        if (now - last_news < kBriskPolling && awaits_receive()) {
          back_off_briefly(round++);
        } else {
          back_off(round++);
        }
        // By the clock, not by rounds: new transfers restart the rounds.
        if (now - last_expiry_check >= kExpiryCheckInterval) {
          last_expiry_check = now;
          expire_overdue();
        }
        continue;
      }
      round = 0;
      last_news = std::chrono::steady_clock::now();
      for (int i = 0; i < count; ++i) {
        MPI_Status& status = statuses[i];
        if (rc != MPI_ERR_IN_STATUS) status.MPI_ERROR = MPI_SUCCESS;
        complete(static_cast<std::size_t>(indices[i]), status);
      }
      // Completed requests were set to MPI_REQUEST_NULL: drop them, keeping the rest aligned.
      std::size_t kept = 0;
      for (std::size_t i = 0; i < requests_.size(); ++i) {
        if (requests_[i] == MPI_REQUEST_NULL) continue;
        requests_[kept] = requests_[i];
        active_[kept] = std::move(active_[i]);
        ++kept;
      }
      requests_.resize(kept);
      active_.resize(kept);
      std::lock_guard<std::mutex> lock(mutex_);
      active_count_ = active_.size();
    } catch (const TimeoutError& error) {
      fail_all(error.what(), true);
      return;
    } catch (const std::exception& error) {
      fail_all(error.what());
      return;
    }
  }
  // Stopping: nobody will wait for what is left (posted, polled or not yet); let MPI forget it.
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (TransferPtr& transfer : queued_) {
      active_.push_back(std::move(transfer));
      requests_.push_back(active_.back()->request_);
    }
    queued_.clear();
  }
  int finalized = 0;
  MPI_Finalized(&finalized);
  for (std::size_t i = 0; i < active_.size(); ++i) {
    if (!finalized && requests_[i] != MPI_REQUEST_NULL) {
      if (active_[i]->kind_ == Transfer::Kind::receive) MPI_Cancel(&requests_[i]);
      MPI_Request_free(&requests_[i]);
    }
  }
  fail_all("the peer channels were closed before this transfer completed");
}

bool PeerChannels::awaits_receive() const {
  return std::any_of(active_.begin(), active_.end(),
                     [](const TransferPtr& transfer) { return transfer->kind_ == Transfer::Kind::receive; });
}

void PeerChannels::post(Transfer& transfer) {
  const int count = checked_count(transfer.bytes_);
  if (transfer.kind_ == Transfer::Kind::send) {
    TNT_MPI(MPI_Isend(transfer.data_, count, MPI_BYTE, transfer.peer_, transfer.tag_, group_->comm(),
                      &transfer.request_));
  } else {
    TNT_MPI(MPI_Irecv(transfer.data_, count, MPI_BYTE, transfer.peer_, transfer.tag_, group_->comm(),
                      &transfer.request_));
  }
  transfer.state_ = Transfer::State::active;
}

void PeerChannels::complete(std::size_t index, const MPI_Status& status) {
  Transfer& transfer = *active_[index];
  int cancelled = 0;
  MPI_Test_cancelled(&status, &cancelled);
  if (cancelled) {
    finish(transfer, Transfer::State::failed, transfer.describe(*group_) + ": " + kCancelled);
    return;
  }
  if (status.MPI_ERROR != MPI_SUCCESS) {
    int error_class = 0;
    MPI_Error_class(status.MPI_ERROR, &error_class);
    if (error_class == MPI_ERR_TRUNCATE) {
      finish(transfer, Transfer::State::failed,
             std::string(kSizeMismatch) + transfer.describe(*group_) +
                 ": the sender sent more bytes; both sides must agree on the tensor's shape and dtype");
    } else {
      finish(transfer, Transfer::State::failed, transfer.describe(*group_) + ": " + mpi_error_text(status.MPI_ERROR));
    }
    return;
  }
  if (transfer.kind_ == Transfer::Kind::receive) {
    int received = 0;
    MPI_Get_count(&status, MPI_BYTE, &received);
    if (static_cast<std::size_t>(received) != transfer.bytes_) {
      finish(transfer, Transfer::State::failed,
             std::string(kSizeMismatch) + transfer.describe(*group_) + " got only " + std::to_string(received) +
                 " bytes; both sides must agree on the tensor's shape and dtype");
      return;
    }
  }
  finish(transfer, Transfer::State::done, std::string());
}

void PeerChannels::finish(Transfer& transfer, Transfer::State state, const std::string& error) {
  std::vector<Callback> callbacks;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    transfer.state_ = state;
    transfer.error_ = error;
    transfer.data_ = nullptr;
    callbacks.swap(transfer.callbacks_);
  }
  finished_.notify_all();
  for (Callback& callback : callbacks) callback(error);
}

// See Note [Cancelled transfers are withdrawn].
void PeerChannels::cancel(const TransferPtr& transfer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (transfer->cancelled_ ||
        (transfer->state_ != Transfer::State::queued && transfer->state_ != Transfer::State::active)) {
      return;
    }
    transfer->cancelled_ = true;
    cancelling_.push_back(transfer);
  }
  work_.notify_one();
}

void PeerChannels::withdraw_cancelled() {
  std::vector<TransferPtr> cancelling;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    cancelling.swap(cancelling_);
  }
  for (const TransferPtr& transfer : cancelling) {
    for (std::size_t i = 0; i < active_.size(); ++i) {
      // Its request is completed (cancelled or not) by the next MPI_Testsome.
      if (active_[i] == transfer && requests_[i] != MPI_REQUEST_NULL) TNT_MPI(MPI_Cancel(&requests_[i]));
    }
  }
}

// See Note [Transfers expire on the progress thread].
void PeerChannels::expire_overdue() {
  for (const TransferPtr& transfer : active_) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (transfer->cancelled_) continue;  // Note [Cancelled transfers are withdrawn]
    }
    const Deadline deadline = deadline_of(*transfer);
    if (deadline.passed()) throw deadline.timeout_error(transfer->describe(*group_), group_->describe_ranks({transfer->peer_}));
  }
}

Deadline PeerChannels::deadline_of(const Transfer& transfer) const {
  return Deadline(group_->limits(), transfer.queued_at_,
                  transfer.kind_ == Transfer::Kind::send
                      ? "that rank did not post the matching receive (crashed, hung, or running a different schedule)"
                      : "that rank did not post the matching send (crashed, hung, or running a different schedule)");
}

void PeerChannels::fail_all(const std::string& error, bool timed_out) {
  std::vector<TransferPtr> left(active_.begin(), active_.end());
  bool stopping = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping = stopping_;
    if (error_.empty() && !stopping) error_ = error;
    left.insert(left.end(), queued_.begin(), queued_.end());
    queued_.clear();
    active_count_ = 0;
  }
  if (!stopping) log_warning("peer channels: " + error);
  for (TransferPtr& transfer : left) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      transfer->timed_out_ = timed_out;
    }
    finish(*transfer, Transfer::State::failed, error);
  }
  active_.clear();
  requests_.clear();
}

void PeerChannels::rethrow(const Transfer& transfer) const {
  if (transfer.timed_out_) throw TimeoutError(transfer.error_);
  if (transfer.error_.rfind(kSizeMismatch, 0) == 0) throw MismatchError(transfer.error_);
  throw Error(transfer.error_);
}

bool PeerChannels::test(const TransferPtr& transfer) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (transfer->state_ == Transfer::State::failed) rethrow(*transfer);
  return transfer->state_ == Transfer::State::done;
}

void PeerChannels::when_done(const TransferPtr& transfer, Callback callback) {
  std::string error;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (transfer->state_ == Transfer::State::queued || transfer->state_ == Transfer::State::active) {
      transfer->callbacks_.push_back(std::move(callback));
      return;
    }
    error = transfer->error_;
  }
  callback(error);
}

void PeerChannels::wait(const TransferPtr& transfer) {
  Deadline deadline = deadline_of(*transfer);
  std::unique_lock<std::mutex> lock(mutex_);
  deadline.wait(
      lock, finished_,
      [&] { return transfer->state_ == Transfer::State::done || transfer->state_ == Transfer::State::failed; },
      transfer->describe(*group_), [&] { return group_->describe_ranks({transfer->peer_}); });
  if (transfer->state_ == Transfer::State::failed) rethrow(*transfer);
}

std::size_t PeerChannels::in_flight() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_count_ + queued_.size();
}

}  // namespace tnt
