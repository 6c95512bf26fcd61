// The engine's face for Python: numpy buffers in, numpy buffers out. Every
// call that may block releases the GIL, so other Python threads (and the
// TensorFlow runtime) keep running while a collective waits.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "allreduce.hpp"
#include "alltoall.hpp"
#include "c_api.h"
#include "engine.hpp"
#include "errors.hpp"
#include "exchange.hpp"
#include "fused_reducer.hpp"
#include "quarantine.hpp"

namespace py = pybind11;

void bind_peer_channels(py::module_& m);  // bind_peer_channels.cpp

namespace {

// Hot path: decided from kind and item size; only exotic dtypes pay for a name lookup.
tnt::DType dtype_of(const py::array& array) {
  const py::dtype dtype = array.dtype();
  const char kind = dtype.kind();
  const py::ssize_t size = dtype.itemsize();
  if (kind == 'f' && size == 4) return tnt::DType::float32;
  if (kind == 'f' && size == 8) return tnt::DType::float64;
  if (kind == 'f' && size == 2) return tnt::DType::float16;
  if (kind == 'i' && size == 4) return tnt::DType::int32;
  if (kind == 'i' && size == 8) return tnt::DType::int64;
  return tnt::dtype_from_name(py::str(dtype.attr("name")));  // bfloat16 (ml_dtypes), or an error
}

py::array contiguous(const py::array& array) {
  if (array.flags() & py::array::c_style) return array;
  return py::array::ensure(array, py::array::c_style);
}

void require_writable_like(const py::array& out, const py::array& in, const char* what) {
  if (!out.writeable()) throw tnt::UsageError(std::string(what) + ": `out` must be writable");
  if (!(out.flags() & py::array::c_style)) throw tnt::UsageError(std::string(what) + ": `out` must be C-contiguous");
  if (dtype_of(out) != dtype_of(in)) {
    throw tnt::UsageError(std::string(what) + ": `out` has dtype " + py::str(out.dtype()).cast<std::string>() +
                          " but the input has " + py::str(in.dtype()).cast<std::string>());
  }
  if (out.size() != in.size()) {
    throw tnt::UsageError(std::string(what) + ": `out` has " + std::to_string(out.size()) +
                          " elements but the input has " + std::to_string(in.size()));
  }
}

// Arrays a failed collective may still write into or send from live until
// the process ends (Note [Memory that a failed collective may still write]).
void keep_if_failed(tnt::ProcessGroup& group, std::initializer_list<py::object> arrays) {
  if (!group.failed()) return;
  static auto* kept = new std::vector<py::object>();  // never destroyed, on purpose
  for (const py::object& array : arrays) kept->push_back(array);
}

// The Python face's handle on a tnt::ProcessGroup and the Allreducer that runs
// its allreduces: borrowed from the engine for the world, owned for a sub-group.
// Python's public tnt.Group (tarantella/collectives.py) wraps one.
class GroupHandle {
 public:
  static std::shared_ptr<GroupHandle> world() {
    auto group = std::make_shared<GroupHandle>();
    tnt::Engine& engine = tnt::Engine::get();
    group->group_ = &engine.world();
    group->allreducer_ = &engine.world_allreducer();
    return group;
  }
  static std::shared_ptr<GroupHandle> adopt(std::unique_ptr<tnt::ProcessGroup> owned) {
    auto group = std::make_shared<GroupHandle>();
    group->owned_group_ = std::move(owned);
    group->owned_allreducer_ = std::make_unique<tnt::Allreducer>(*group->owned_group_);
    group->group_ = group->owned_group_.get();
    group->allreducer_ = group->owned_allreducer_.get();
    return group;
  }
  tnt::ProcessGroup& group() {
    if (!group_) throw tnt::UsageError("this process group is closed");
    return *group_;
  }
  tnt::Allreducer& allreducer() {
    group();
    return *allreducer_;
  }
  // Collective (Note [Closing is explicit]); the world closes at exit only.
  void close() {
    if (!group_) return;
    if (!owned_group_) throw tnt::UsageError("the world group closes with the engine at exit; close sub-groups only");
    {
      py::gil_scoped_release release;
      if (!owned_group_->failed()) owned_allreducer_->close();
    }
    owned_allreducer_.reset();
    owned_group_.reset();
    group_ = nullptr;
    allreducer_ = nullptr;
  }

 private:
  std::unique_ptr<tnt::ProcessGroup> owned_group_;
  std::unique_ptr<tnt::Allreducer> owned_allreducer_;
  tnt::ProcessGroup* group_ = nullptr;
  tnt::Allreducer* allreducer_ = nullptr;
};

py::array allreduce(const py::array& input, std::optional<py::array> out, const std::string& op,
                    const std::string& algorithm, GroupHandle& group) {
  const py::array in = contiguous(input);
  py::array result = out ? *out : py::array(in.dtype(), std::vector<py::ssize_t>(in.shape(), in.shape() + in.ndim()));
  require_writable_like(result, in, "allreduce");
  const tnt::AllreduceCall call{in.data(), result.mutable_data(), static_cast<std::size_t>(in.size()), dtype_of(in),
                                tnt::op_from_name(op)};
  const tnt::Algorithm chosen = tnt::algorithm_from_name(algorithm);
  tnt::Allreducer& allreducer = group.allreducer();
  try {
    py::gil_scoped_release release;
    allreducer.run(call, chosen);
  } catch (...) {
    keep_if_failed(allreducer.group(), {in, result});
    throw;
  }
  return result;
}

py::array broadcast(const py::array& input, int root, GroupHandle& group) {
  py::array buffer = py::array::ensure(input, py::array::c_style);
  if (!buffer.writeable()) throw tnt::UsageError("broadcast: the array must be writable");
  tnt::ProcessGroup& process_group = group.group();
  try {
    py::gil_scoped_release release;
    process_group.broadcast(buffer.mutable_data(), static_cast<std::size_t>(buffer.nbytes()), root);
  } catch (...) {
    keep_if_failed(process_group, {buffer});
    throw;
  }
  return buffer;
}

py::array allgather(const py::array& input, GroupHandle& group) {
  const py::array in = contiguous(input);
  std::vector<py::ssize_t> shape{group.group().size()};
  shape.insert(shape.end(), in.shape(), in.shape() + in.ndim());
  py::array result(in.dtype(), shape);
  tnt::ProcessGroup& process_group = group.group();
  try {
    py::gil_scoped_release release;
    process_group.allgather(in.data(), static_cast<std::size_t>(in.nbytes()), result.mutable_data());
  } catch (...) {
    keep_if_failed(process_group, {in, result});
    throw;
  }
  return result;
}

std::vector<py::bytes> allgather_bytes(const py::bytes& data, GroupHandle& group) {
  // Held by a shared pointer so that a failed call can keep it (Note [Memory that a failed collective may still write]).
  auto mine = std::make_shared<std::string>(data);
  std::vector<std::vector<char>> blocks;
  tnt::ProcessGroup& process_group = group.group();
  try {
    py::gil_scoped_release release;
    blocks = process_group.allgatherv(mine->data(), mine->size());
  } catch (...) {
    if (process_group.failed()) tnt::keep_until_exit(mine);
    throw;
  }
  std::vector<py::bytes> result;
  for (const auto& block : blocks) result.emplace_back(block.data(), block.size());
  return result;
}

// For tarantella/data/batch_exchange.py: block s goes to rank s; returns the block from each rank.
std::vector<py::bytes> alltoall_bytes(const std::vector<std::string>& blocks, GroupHandle& group) {
  std::vector<std::string> received;
  tnt::ProcessGroup& process_group = group.group();
  {
    py::gil_scoped_release release;
    received = tnt::alltoallv(process_group, blocks);  // keeps its own buffers if it fails
  }
  std::vector<py::bytes> result;
  for (const auto& block : received) result.emplace_back(block);
  return result;
}

class Reducer {
 public:
  Reducer(const std::vector<std::tuple<std::size_t, std::string>>& tensors, std::size_t fusion_threshold_bytes,
          const std::string& op, const std::string& algorithm, GroupHandle& group) {
    std::vector<tnt::TensorSpec> specs;
    for (const auto& [count, dtype] : tensors) specs.push_back({count, tnt::dtype_from_name(dtype)});
    std::unique_ptr<tnt::FusedReducer> reducer;
    {
      py::gil_scoped_release release;
      reducer = std::make_unique<tnt::FusedReducer>(group.group(), std::move(specs), fusion_threshold_bytes,
                                                    tnt::op_from_name(op), tnt::algorithm_from_name(algorithm));
    }
    id_ = tnt::Engine::get().add_reducer(std::move(reducer));
  }
  // The garbage collector's path: local only (Note [Closing is explicit]).
  ~Reducer() {
    if (id_ && tnt::Engine::started()) {
      py::gil_scoped_release release;
      tnt::Engine::get().remove_reducer(id_);
    }
  }
  // Collective: every rank closes its reducer at the same point.
  void close() {
    if (id_ && tnt::Engine::started()) {
      const int id = id_;
      id_ = 0;
      py::gil_scoped_release release;
      tnt::Engine::get().close_reducer(id);
    }
    id_ = 0;
  }
  int id() const { return id_; }
  std::shared_ptr<tnt::FusedReducer> get() {
    if (!id_) throw tnt::UsageError("this reducer is closed");
    return tnt::Engine::get().reducer(id_);
  }
  void ready(std::size_t tensor, const py::array& data) {
    const py::array in = contiguous(data);
    std::shared_ptr<tnt::FusedReducer> reducer = get();
    py::gil_scoped_release release;
    reducer->ready(tensor, in.data(), static_cast<std::size_t>(in.nbytes()));
  }
  void wait(std::size_t tensor, py::array& out) {
    if (!out.writeable() || !(out.flags() & py::array::c_style)) {
      throw tnt::UsageError("wait: `out` must be a writable C-contiguous array");
    }
    std::shared_ptr<tnt::FusedReducer> reducer = get();
    py::gil_scoped_release release;
    reducer->wait(tensor, out.mutable_data(), static_cast<std::size_t>(out.nbytes()));
  }

 private:
  int id_ = 0;
};

}  // namespace

PYBIND11_MODULE(_engine, m) {
  m.doc() = "tarantella's C++ communication engine (private; use the tarantella package)";

  auto error = py::register_exception<tnt::Error>(m, "EngineError", PyExc_RuntimeError);
  py::register_exception<tnt::MpiError>(m, "MpiError", error.ptr());
  py::register_exception<tnt::MismatchError>(m, "MismatchError", error.ptr());
  py::register_exception<tnt::TimeoutError>(m, "CollectiveTimeoutError", PyExc_TimeoutError);
  py::register_exception<tnt::UsageError>(m, "UsageError", PyExc_ValueError);
  py::register_exception<tnt::GroupFailedError>(m, "GroupFailedError", error.ptr());

  m.def(
      "start",
      [](std::size_t fusion_threshold_bytes, double timeout_seconds, double stall_warning_seconds,
         const std::string& algorithm, int log_level, bool log_on_all_devices) {
        tnt::EngineConfig config{fusion_threshold_bytes, tnt::WaitLimits{timeout_seconds, stall_warning_seconds},
                                 tnt::algorithm_from_name(algorithm), static_cast<tnt::LogLevel>(log_level),
                                 log_on_all_devices};
        py::gil_scoped_release release;
        tnt::Engine::start(config);
      },
      py::arg("fusion_threshold_bytes"), py::arg("timeout_seconds"), py::arg("stall_warning_seconds"),
      py::arg("algorithm"), py::arg("log_level"), py::arg("log_on_all_devices"));
  m.def("started", &tnt::Engine::started);
  m.def("stop", [] {
    py::gil_scoped_release release;
    tnt::Engine::stop();
  });
  m.def("abort_job", [](int code) {
    py::gil_scoped_release release;
    tnt::Engine::abort_job(code);
  });
  m.def("abi_version", &tnt_engine_abi_version);
  bind_peer_channels(m);
  // For tests that check messages just below and above a piece's size (Note [Messages in pieces]).
  m.attr("exchange_piece_bytes") = tnt::kPieceBytes;
  m.def("choose_algorithm", [](std::size_t bytes) {
    return std::string(tnt::algorithm_name(tnt::Engine::get().world_allreducer().choose(bytes)));
  });

  m.def("reductions_performed", &tnt::FusedReducer::reductions_completed_in_process,
        "bucket allreduces completed by every gradient reducer of this process, closed ones included");
  m.def("copied_bytes", &tnt::FusedReducer::copied_bytes_in_process,
        "bytes the gradient data path copied in this process (Note [Two copies per gradient byte])");

  // Note [In-graph allreduces]: collective; the id goes into TntAllreduceSum's `allreducer` attribute.
  m.def("add_graph_allreducer", [](GroupHandle& group) {
    py::gil_scoped_release release;
    return tnt::Engine::get().add_graph_allreducer(group.group());
  });

  py::class_<GroupHandle, std::shared_ptr<GroupHandle>>(m, "GroupHandle")
      .def_static("world", &GroupHandle::world)
      .def_property_readonly("rank", [](GroupHandle& g) { return g.group().rank(); })
      .def_property_readonly("size", [](GroupHandle& g) { return g.group().size(); })
      .def_property_readonly("on_one_node", [](GroupHandle& g) { return g.group().on_one_node(); })
      .def_property_readonly("local_rank", [](GroupHandle& g) { return g.group().local_rank(); })
      .def_property_readonly("local_size", [](GroupHandle& g) { return g.group().local_size(); })
      .def_property_readonly("node_count", [](GroupHandle& g) { return g.group().node_count(); })
      .def_property_readonly("equal_ranks_per_node", [](GroupHandle& g) { return g.group().equal_ranks_per_node(); })
      .def_property_readonly("failed", [](GroupHandle& g) { return g.group().failed(); })
      .def_property_readonly("first_failure", [](GroupHandle& g) { return g.group().first_failure(); })
      .def("choose_algorithm",
           [](GroupHandle& g, std::size_t bytes) { return std::string(tnt::algorithm_name(g.allreducer().choose(bytes))); })
      .def("close", &GroupHandle::close)
      .def("world_rank_of", [](GroupHandle& g, int rank) { return g.group().world_rank_of(rank); })
      .def("split",
           [](GroupHandle& g, int color, int key) {
             std::unique_ptr<tnt::ProcessGroup> sub;
             {
               py::gil_scoped_release release;
               sub = g.group().split(color, key);
             }
             return GroupHandle::adopt(std::move(sub));
           })
      .def("barrier", [](GroupHandle& g) {
        py::gil_scoped_release release;
        g.group().barrier();
      });

  m.def("allreduce", &allreduce, py::arg("array"), py::arg("out"), py::arg("op"), py::arg("algorithm"),
        py::arg("group"));
  m.def("broadcast", &broadcast, py::arg("array"), py::arg("root"), py::arg("group"));
  m.def("allgather", &allgather, py::arg("array"), py::arg("group"));
  m.def("allgather_bytes", &allgather_bytes, py::arg("data"), py::arg("group"));
  m.def("alltoall_bytes", &alltoall_bytes, py::arg("blocks"), py::arg("group"));

  py::class_<Reducer>(m, "Reducer")
      .def(py::init<const std::vector<std::tuple<std::size_t, std::string>>&, std::size_t, const std::string&,
                    const std::string&, GroupHandle&>(),
           py::arg("tensors"), py::arg("fusion_threshold_bytes"), py::arg("op"), py::arg("algorithm"),
           py::arg("group"))
      .def_property_readonly("id", &Reducer::id)
      .def("ready", &Reducer::ready)
      .def("wait", &Reducer::wait)
      .def("close", &Reducer::close)
      .def_property_readonly("bucket_count", [](Reducer& r) { return r.get()->bucket_count(); })
      .def_property_readonly("reductions_completed", [](Reducer& r) { return r.get()->reductions_completed(); })
      .def_property_readonly("buckets_in_shared_memory", [](Reducer& r) { return r.get()->buckets_in_shared_memory(); })
      .def("bucket_of", [](Reducer& r, std::size_t tensor) { return r.get()->bucket_of(tensor); })
      .def("bucket_bytes", [](Reducer& r, std::size_t bucket) { return r.get()->bucket_bytes(bucket); })
      .def_property_readonly("clock_origin", [](Reducer& r) { return r.get()->clock_origin(); })
      .def("last_step_times", [](Reducer& r) {
        std::vector<std::tuple<double, double, double>> times;
        for (const auto& t : r.get()->last_step_times()) times.emplace_back(t.queued, t.started, t.finished);
        return times;
      });
}
