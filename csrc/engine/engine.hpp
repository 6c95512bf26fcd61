// The process-wide engine: MPI, the world group, and the reducers in use.
// Both faces (Python, TensorFlow) reach the same instance through this file,
// because they are loaded into one process and share libtnt_engine.so.
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>

#include "allreduce.hpp"
#include "deadline.hpp"
#include "fused_reducer.hpp"
#include "graph_allreducer.hpp"
#include "log.hpp"
#include "process_group.hpp"

namespace tnt {

// Resolved settings; the Python face fills them from tarantella/config.py,
// the one table of settings (the engine reads no environment variables).
struct EngineConfig {
  std::size_t fusion_threshold_bytes;
  WaitLimits limits;
  Algorithm algorithm;
  LogLevel log_level;
  bool log_on_all_devices;
};

class Engine {
 public:
  // Initialises MPI (MPI_THREAD_MULTIPLE) unless someone else did; later calls return the same engine.
  static Engine& start(const EngineConfig& config);
  // The started engine; throws UsageError if start() was not called.
  static Engine& get();
  static bool started();
  // At exit, on every rank: frees the world's shared segments (collective)
  // and every reducer (locally), and finalises MPI if the engine initialised
  // it. After a failure (Note [A failed group stays failed]) it frees nothing
  // collective and does not finalise: peers may be gone, and MPI_Finalize
  // could wait for them forever; the launcher ends the job.
  static void stop();
  // Ends the whole job from any rank (MPI_Abort on the world).
  [[noreturn]] static void abort_job(int exit_code);

  const EngineConfig& config() const { return config_; }
  ProcessGroup& world() { return *world_; }
  // For collectives called from the framework's main thread on the world group.
  Allreducer& world_allreducer() { return *world_allreducer_; }

  int add_reducer(std::unique_ptr<FusedReducer> reducer);
  // Shared, so that a reducer removed by another thread lives until its caller is done.
  std::shared_ptr<FusedReducer> reducer(int id);
  // Collective on the reducer's group: close it (Note [Closing is explicit]), then forget it.
  void close_reducer(int id);
  // Local: forget the reducer; its destructor fails results still awaited.
  void remove_reducer(int id);

  // Note [In-graph allreduces]
  // Small sums that a framework op needs before it can go on (BatchNormalization's
  // global statistics, tarantella/keras/global_batch_norm.py) run as one allreduce
  // each, on a GraphAllreducer of their own (its own communicator: they never meet
  // the gradient reducers' or the main thread's collectives). The op waits until
  // the sum is there, without holding the framework's thread (Note [An in-graph sum
  // does not hold the framework's thread] in graph_allreducer.hpp): the framework
  // orders these ops the same way on every rank (one chain, creation order), so a
  // rank waits only for its peers to reach the same op. Collective: every rank adds
  // them in one order.
  int add_graph_allreducer(const ProcessGroup& group);
  std::shared_ptr<GraphAllreducer> graph_allreducer(int id);

 private:
  explicit Engine(const EngineConfig& config);
  EngineConfig config_;
  std::unique_ptr<ProcessGroup> world_;
  std::unique_ptr<Allreducer> world_allreducer_;
  std::mutex reducers_mutex_;
  std::map<int, std::shared_ptr<FusedReducer>> reducers_;
  int next_reducer_id_ = 1;
  std::map<int, std::shared_ptr<GraphAllreducer>> graph_allreducers_;  // guarded by reducers_mutex_; closed by stop()
  int next_graph_allreducer_id_ = 1;
};

}  // namespace tnt
