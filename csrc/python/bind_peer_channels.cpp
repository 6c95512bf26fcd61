// The peer channels' face for Python: numpy buffers in and out, a handle per
// transfer. Peers are world ranks (the channels run on a duplicate of the
// world communicator). Waiting releases the GIL.
//
// Note [A handle keeps its buffer alive]
// MPI reads (send) or writes (receive) the numpy buffer until the transfer is
// done, so the handle holds a reference to it. A handle dropped before its
// transfer is done (an exception unwinding a schedule) hands the reference to
// its channels, which keep it until they close; otherwise MPI could write into
// freed memory.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <vector>

#include "engine.hpp"
#include "errors.hpp"
#include "peer_channels.hpp"

namespace py = pybind11;

namespace {

struct ChannelsState {
  std::unique_ptr<tnt::PeerChannels> channels;
  std::vector<py::object> orphans;  // Note [A handle keeps its buffer alive]
};

class TransferHandle {
 public:
  TransferHandle(std::shared_ptr<ChannelsState> state, tnt::TransferPtr transfer, py::object buffer)
      : state_(state), transfer_(std::move(transfer)), buffer_(std::move(buffer)) {}
  ~TransferHandle() {
    auto state = state_.lock();
    if (!transfer_ || !state || !state->channels || done_) return;
    bool finished = true;
    try {
      finished = state->channels->test(transfer_);
    } catch (const std::exception&) {
    }
    if (!finished) state->orphans.push_back(std::move(buffer_));
  }

  void wait() {
    tnt::PeerChannels& channels = this->channels();
    {
      py::gil_scoped_release release;
      channels.wait(transfer_);
    }
    done_ = true;
  }
  bool done() {
    if (done_) return true;
    done_ = channels().test(transfer_);
    return done_;
  }
  void cancel() { channels().cancel(transfer_); }
  py::object buffer() const { return buffer_; }
  int peer() const { return transfer_->peer(); }
  int tag() const { return transfer_->tag(); }
  std::size_t bytes() const { return transfer_->bytes(); }

 private:
  tnt::PeerChannels& channels() {
    auto state = state_.lock();
    if (!state || !state->channels) throw tnt::UsageError("the peer channels of this transfer are closed");
    return *state->channels;
  }
  std::weak_ptr<ChannelsState> state_;
  tnt::TransferPtr transfer_;
  py::object buffer_;
  bool done_ = false;
};

class Channels {
 public:
  Channels() : state_(std::make_shared<ChannelsState>()) {
    tnt::ProcessGroup& world = tnt::Engine::get().world();
    py::gil_scoped_release release;
    state_->channels = std::make_unique<tnt::PeerChannels>(world);
  }
  ~Channels() { close(); }

  TransferHandle send(int peer, int tag, const py::array& array) {
    py::array buffer = array;
    if (!(buffer.flags() & py::array::c_style)) buffer = py::array::ensure(array, py::array::c_style);
    auto transfer = get().send(peer, tag, buffer.data(), static_cast<std::size_t>(buffer.nbytes()));
    return TransferHandle(state_, std::move(transfer), buffer);
  }
  TransferHandle receive(int peer, int tag, py::array& out) {
    if (!out.writeable() || !(out.flags() & py::array::c_style)) {
      throw tnt::UsageError("receive: `out` must be a writable C-contiguous array");
    }
    auto transfer = get().receive(peer, tag, out.mutable_data(), static_cast<std::size_t>(out.nbytes()));
    return TransferHandle(state_, std::move(transfer), out);
  }
  void close() {
    if (!state_->channels) return;
    {
      py::gil_scoped_release release;
      state_->channels.reset();
    }
    state_->orphans.clear();
  }
  tnt::PeerChannels& get() {
    if (!state_->channels) throw tnt::UsageError("these peer channels are closed");
    return *state_->channels;
  }

 private:
  std::shared_ptr<ChannelsState> state_;
};

}  // namespace

void bind_peer_channels(py::module_& m) {
  py::class_<TransferHandle>(m, "Transfer")
      .def("wait", &TransferHandle::wait, "Block (GIL released) until done; TimeoutError names the peer.")
      .def("cancel", &TransferHandle::cancel,
           "Withdraw the transfer (Note [Cancelled transfers are withdrawn]); wait() then raises unless MPI "
           "could not take it back.")
      .def_property_readonly("done", &TransferHandle::done)
      .def_property_readonly("buffer", &TransferHandle::buffer)
      .def_property_readonly("peer", &TransferHandle::peer)
      .def_property_readonly("tag", &TransferHandle::tag)
      .def_property_readonly("bytes", &TransferHandle::bytes);

  py::class_<Channels>(m, "PeerChannels")
      .def(py::init<>())
      .def("send", &Channels::send, py::arg("peer"), py::arg("tag"), py::arg("array"))
      .def("receive", &Channels::receive, py::arg("peer"), py::arg("tag"), py::arg("out"))
      .def("close", &Channels::close)
      .def_property_readonly("id", [](Channels& c) { return c.get().id(); })  // for the TensorFlow ops
      .def_property_readonly("rank", [](Channels& c) { return c.get().rank(); })
      .def_property_readonly("size", [](Channels& c) { return c.get().size(); })
      .def_property_readonly("in_flight", [](Channels& c) { return c.get().in_flight(); })
      .def_static("max_tag", &tnt::PeerChannels::max_tag);
}
