// An in-graph allreducer: small sums a framework op needs before it can go on
// (Note [In-graph allreduces] in engine.hpp), run one after another
// on a thread of their own.
//
// Note [An in-graph sum does not hold the framework's thread]
// The sum is collective: a rank waits in it until its peers reach it. If it
// waited on the framework's thread, that thread could not run the rest of
// the rank's step meanwhile, and a peer may need some of that rest first.
// With sharded training and `global_clipnorm`, a rank whose own gradient
// shard is reduced early starts the sum of the norms, while its peer's shard
// still waits for a bucket this rank has not handed in yet: with one
// framework thread per rank (TF_NUM_INTEROP_THREADS=1) both ranks waited for
// ever. So the op only queues the sum and finishes when the worker, which
// runs the queue in order, calls back. The order is still the framework's:
// these ops form one chain on every rank, and the next op of the chain starts
// only once the previous one finished.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "allreduce.hpp"

namespace tnt {

class GraphAllreducer {
 public:
  // `error` is empty on success.
  using Callback = std::function<void(const std::string& error)>;

  // Collective: duplicates the group's communicator.
  GraphAllreducer(const ProcessGroup& group, Algorithm algorithm);
  ~GraphAllreducer();  // stops the worker after the sum it runs, fails the queued ones

  // Queues the sum of `call`; `done` runs on the worker once call.out holds it (or the sum failed).
  void submit(const AllreduceCall& call, Callback done);
  // A step was cancelled partway on this rank: its ranks' sums no longer match, so every queued and
  // later sum fails at once (as Note [A cancelled step fails the reducer] in fused_reducer.hpp). A sum
  // already running goes on until its peers finish it or the deadline fails the group.
  void cancel_step();
  // Collective, once no step is in flight: stops the worker, frees the shared segments.
  void close();

 private:
  struct Queued {
    AllreduceCall call;
    Callback done;
  };
  void work();
  void stop_worker();

  Allreducer allreducer_;
  const Algorithm algorithm_;
  std::mutex mutex_;
  std::condition_variable queued_;
  std::deque<Queued> queue_;  // guarded by mutex_
  std::string failure_;       // guarded by mutex_; set by cancel_step
  bool stopping_ = false;     // guarded by mutex_
  bool closed_ = false;
  std::thread worker_;        // last member: starts after everything above exists
};

}  // namespace tnt
