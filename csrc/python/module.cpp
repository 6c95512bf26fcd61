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
#include "c_api.h"
#include "engine.hpp"
#include "errors.hpp"
#include "fused_reducer.hpp"

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

// A process group as Python sees it: the world (owned by the engine) or a sub-group.
class Group {
 public:
  static std::shared_ptr<Group> world() {
    auto group = std::make_shared<Group>();
    tnt::Engine& engine = tnt::Engine::get();
    group->group_ = &engine.world();
    group->allreducer_ = &engine.world_allreducer();
    return group;
  }
  static std::shared_ptr<Group> adopt(std::unique_ptr<tnt::ProcessGroup> owned) {
    auto group = std::make_shared<Group>();
    group->owned_group_ = std::move(owned);
    group->owned_allreducer_ = std::make_unique<tnt::Allreducer>(*group->owned_group_);
    group->group_ = group->owned_group_.get();
    group->allreducer_ = group->owned_allreducer_.get();
    return group;
  }
  tnt::ProcessGroup& group() { return *group_; }
  tnt::Allreducer& allreducer() { return *allreducer_; }

 private:
  std::unique_ptr<tnt::ProcessGroup> owned_group_;
  std::unique_ptr<tnt::Allreducer> owned_allreducer_;
  tnt::ProcessGroup* group_ = nullptr;
  tnt::Allreducer* allreducer_ = nullptr;
};

py::array allreduce(const py::array& input, std::optional<py::array> out, const std::string& op,
                    const std::string& algorithm, Group& group) {
  const py::array in = contiguous(input);
  py::array result = out ? *out : py::array(in.dtype(), std::vector<py::ssize_t>(in.shape(), in.shape() + in.ndim()));
  require_writable_like(result, in, "allreduce");
  const tnt::AllreduceCall call{in.data(), result.mutable_data(), static_cast<std::size_t>(in.size()), dtype_of(in),
                                tnt::op_from_name(op)};
  const tnt::Algorithm chosen = tnt::algorithm_from_name(algorithm);
  {
    py::gil_scoped_release release;
    group.allreducer().run(call, chosen);
  }
  return result;
}

py::array broadcast(const py::array& input, int root, Group& group) {
  py::array buffer = py::array::ensure(input, py::array::c_style);
  if (!buffer.writeable()) throw tnt::UsageError("broadcast: the array must be writable");
  {
    py::gil_scoped_release release;
    group.group().broadcast(buffer.mutable_data(), static_cast<std::size_t>(buffer.nbytes()), root);
  }
  return buffer;
}

py::array allgather(const py::array& input, Group& group) {
  const py::array in = contiguous(input);
  std::vector<py::ssize_t> shape{group.group().size()};
  shape.insert(shape.end(), in.shape(), in.shape() + in.ndim());
  py::array result(in.dtype(), shape);
  {
    py::gil_scoped_release release;
    group.group().allgather(in.data(), static_cast<std::size_t>(in.nbytes()), result.mutable_data());
  }
  return result;
}

std::vector<py::bytes> allgather_bytes(const py::bytes& data, Group& group) {
  const std::string mine = data;
  std::vector<std::vector<char>> blocks;
  {
    py::gil_scoped_release release;
    blocks = group.group().allgatherv(mine.data(), mine.size());
  }
  std::vector<py::bytes> result;
  for (const auto& block : blocks) result.emplace_back(block.data(), block.size());
  return result;
}

class Reducer {
 public:
  Reducer(const std::vector<std::tuple<std::size_t, std::string>>& tensors, std::size_t fusion_threshold_bytes,
          const std::string& op, const std::string& algorithm, Group& group) {
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
  ~Reducer() { close(); }
  void close() {
    if (id_ && tnt::Engine::started()) {
      py::gil_scoped_release release;
      tnt::Engine::get().remove_reducer(id_);
    }
    id_ = 0;
  }
  int id() const { return id_; }
  tnt::FusedReducer& get() {
    if (!id_) throw tnt::UsageError("this reducer is closed");
    return tnt::Engine::get().reducer(id_);
  }
  void ready(std::size_t tensor, const py::array& data) {
    const py::array in = contiguous(data);
    tnt::FusedReducer& reducer = get();
    py::gil_scoped_release release;
    reducer.ready(tensor, in.data(), static_cast<std::size_t>(in.nbytes()));
  }
  void wait(std::size_t tensor, py::array& out) {
    if (!out.writeable() || !(out.flags() & py::array::c_style)) {
      throw tnt::UsageError("wait: `out` must be a writable C-contiguous array");
    }
    tnt::FusedReducer& reducer = get();
    py::gil_scoped_release release;
    reducer.wait(tensor, out.mutable_data(), static_cast<std::size_t>(out.nbytes()));
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
  m.def("choose_algorithm", [](std::size_t bytes) {
    return std::string(tnt::algorithm_name(tnt::Engine::get().world_allreducer().choose(bytes)));
  });

  py::class_<Group, std::shared_ptr<Group>>(m, "Group")
      .def_static("world", &Group::world)
      .def_property_readonly("rank", [](Group& g) { return g.group().rank(); })
      .def_property_readonly("size", [](Group& g) { return g.group().size(); })
      .def_property_readonly("on_one_node", [](Group& g) { return g.group().on_one_node(); })
      .def("world_rank_of", [](Group& g, int rank) { return g.group().world_rank_of(rank); })
      .def("split",
           [](Group& g, int color, int key) {
             std::unique_ptr<tnt::ProcessGroup> sub;
             {
               py::gil_scoped_release release;
               sub = g.group().split(color, key);
             }
             return Group::adopt(std::move(sub));
           })
      .def("barrier", [](Group& g) {
        py::gil_scoped_release release;
        g.group().barrier();
      });

  m.def("allreduce", &allreduce, py::arg("array"), py::arg("out"), py::arg("op"), py::arg("algorithm"),
        py::arg("group"));
  m.def("broadcast", &broadcast, py::arg("array"), py::arg("root"), py::arg("group"));
  m.def("allgather", &allgather, py::arg("array"), py::arg("group"));
  m.def("allgather_bytes", &allgather_bytes, py::arg("data"), py::arg("group"));

  py::class_<Reducer>(m, "Reducer")
      .def(py::init<const std::vector<std::tuple<std::size_t, std::string>>&, std::size_t, const std::string&,
                    const std::string&, Group&>(),
           py::arg("tensors"), py::arg("fusion_threshold_bytes"), py::arg("op"), py::arg("algorithm"),
           py::arg("group"))
      .def_property_readonly("id", &Reducer::id)
      .def("ready", &Reducer::ready)
      .def("wait", &Reducer::wait)
      .def("close", &Reducer::close)
      .def_property_readonly("bucket_count", [](Reducer& r) { return r.get().bucket_count(); })
      .def("bucket_of", [](Reducer& r, std::size_t tensor) { return r.get().bucket_of(tensor); })
      .def("bucket_bytes", [](Reducer& r, std::size_t bucket) { return r.get().bucket_bytes(bucket); })
      .def("last_step_times", [](Reducer& r) {
        std::vector<std::tuple<double, double, double>> times;
        for (const auto& t : r.get().last_step_times()) times.emplace_back(t.queued, t.started, t.finished);
        return times;
      });
}
