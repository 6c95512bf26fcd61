#include "engine.hpp"
#include "shared_segments.hpp"

#include <mpi.h>
#include <sched.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "errors.hpp"
#include "fnv1a.hpp"
#include "mpi_call.hpp"

namespace tnt {

namespace {
std::unique_ptr<Engine> g_engine;
std::mutex g_engine_mutex;
// Whether MPI_Init was ours, so stop() finalises only what it started.
bool g_owns_mpi = false;

// This machine's boot id: the same in every container and network namespace
// of one kernel, unlike the hostname MPI uses to tell nodes apart.
std::uint64_t machine_id() {
  std::ifstream file("/proc/sys/kernel/random/boot_id");
  std::string text;
  std::getline(file, text);
  Fnv1a hash;
  hash.add(text);
  return hash.value();
}

// More ranks on this machine than cores this rank may run on (see
// set_oversubscribed). Counted per kernel, not per MPI node: hosts emulated
// by network namespaces (tests, benchmarks) share one machine's cores.
bool node_is_oversubscribed() {
  int world_size = 1;
  TNT_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world_size));
  const std::uint64_t mine = machine_id();
  std::vector<std::uint64_t> all(world_size);
  TNT_MPI(MPI_Allgather(&mine, 1, MPI_UINT64_T, all.data(), 1, MPI_UINT64_T, MPI_COMM_WORLD));
  const int node_ranks = static_cast<int>(std::count(all.begin(), all.end(), mine));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const int usable = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return node_ranks > usable;
}
}  // namespace

Engine::Engine(const EngineConfig& config) : config_(config) {
  int initialized = 0;
  TNT_MPI(MPI_Initialized(&initialized));
  if (!initialized) {
    int provided = 0;
    TNT_MPI(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
    g_owns_mpi = true;
  }
  int provided = 0;
  TNT_MPI(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE) {
    throw UsageError("MPI was initialised without MPI_THREAD_MULTIPLE, which tarantella's progress thread needs; "
                     "import tarantella before initialising MPI, or initialise it with thread level MULTIPLE "
                     "(mpi4py: mpi4py.rc.thread_level = 'multiple')");
  }
  TNT_MPI(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int world_rank = 0;
  TNT_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &world_rank));
  set_log_identity(world_rank, config.log_level, config.log_on_all_devices);
  set_oversubscribed(node_is_oversubscribed());
  world_ = std::make_unique<ProcessGroup>(MPI_COMM_WORLD, config.limits);
  world_allreducer_ = std::make_unique<Allreducer>(*world_);
}

Engine& Engine::start(const EngineConfig& config) {
  std::lock_guard<std::mutex> lock(g_engine_mutex);
  if (!g_engine) g_engine.reset(new Engine(config));
  return *g_engine;
}

Engine& Engine::get() {
  std::lock_guard<std::mutex> lock(g_engine_mutex);
  if (!g_engine) throw UsageError("the tarantella engine is not started; call tnt.init() first");
  return *g_engine;
}

bool Engine::started() {
  std::lock_guard<std::mutex> lock(g_engine_mutex);
  return g_engine != nullptr;
}

void Engine::stop() {
  std::unique_ptr<Engine> engine;
  {
    std::lock_guard<std::mutex> lock(g_engine_mutex);
    engine.swap(g_engine);
  }
  if (!engine) return;
  // Reducers go locally: some ranks' garbage collectors may have removed a
  // reducer that others still hold (Note [Closing is explicit]).
  std::map<int, std::shared_ptr<FusedReducer>> reducers;
  {
    std::lock_guard<std::mutex> lock(engine->reducers_mutex_);
    reducers.swap(engine->reducers_);
  }
  reducers.clear();
  std::map<int, std::shared_ptr<GraphAllreducer>> graph_allreducers;
  {
    std::lock_guard<std::mutex> lock(engine->reducers_mutex_);
    graph_allreducers.swap(engine->graph_allreducers_);
  }
  const bool failed = engine->world_->failed();
  if (!failed) {
    try {
      for (auto& [id, allreducer] : graph_allreducers) allreducer->close();  // id order: the same on every rank
      engine->world_allreducer_->close();
    } catch (const Error& error) {
      log_warning(std::string("closing the engine: ") + error.what());
    }
  }
  graph_allreducers.clear();
  const bool healthy = !engine->world_->failed();
  if (!healthy) {
    log_warning("not finalising MPI, because a collective failed earlier (" + engine->world_->first_failure() +
                "); the launcher ends the job");
  }
  if (healthy) SharedSegments::free_all_at_exit();  // Note [Windows are freed in creation order]
  engine->world_allreducer_.reset();
  engine->world_.reset();
  engine.reset();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (g_owns_mpi && !finalized && healthy) MPI_Finalize();
}

void Engine::abort_job(int exit_code) {
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

int Engine::add_reducer(std::unique_ptr<FusedReducer> reducer) {
  std::lock_guard<std::mutex> lock(reducers_mutex_);
  const int id = next_reducer_id_++;
  reducers_[id] = std::move(reducer);
  return id;
}

std::shared_ptr<FusedReducer> Engine::reducer(int id) {
  std::lock_guard<std::mutex> lock(reducers_mutex_);
  auto found = reducers_.find(id);
  if (found == reducers_.end()) throw UsageError("no gradient reducer with id " + std::to_string(id));
  return found->second;
}

void Engine::close_reducer(int id) {
  std::shared_ptr<FusedReducer> reducer;
  {
    std::lock_guard<std::mutex> lock(reducers_mutex_);
    auto found = reducers_.find(id);
    if (found == reducers_.end()) return;
    reducer = found->second;
  }
  try {
    reducer->close();
  } catch (...) {
    remove_reducer(id);
    throw;
  }
  remove_reducer(id);
}

void Engine::remove_reducer(int id) {
  std::shared_ptr<FusedReducer> reducer;
  {
    std::lock_guard<std::mutex> lock(reducers_mutex_);
    auto found = reducers_.find(id);
    if (found == reducers_.end()) return;
    reducer = std::move(found->second);
    reducers_.erase(found);
  }
  reducer->abandon();
}

int Engine::add_graph_allreducer(const ProcessGroup& group) {
  auto allreducer = std::make_shared<GraphAllreducer>(group, config_.algorithm);  // collective
  std::lock_guard<std::mutex> lock(reducers_mutex_);
  const int id = next_graph_allreducer_id_++;
  graph_allreducers_[id] = std::move(allreducer);
  return id;
}

std::shared_ptr<GraphAllreducer> Engine::graph_allreducer(int id) {
  std::lock_guard<std::mutex> lock(reducers_mutex_);
  auto found = graph_allreducers_.find(id);
  if (found == graph_allreducers_.end()) throw UsageError("no in-graph allreducer with id " + std::to_string(id));
  return found->second;
}

}  // namespace tnt
