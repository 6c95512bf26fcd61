#include "c_api.h"

#include <cstring>
#include <exception>
#include <string>

#include "c_api_error.hpp"
#include "engine.hpp"

namespace {

int report(const std::exception& error, char* out, size_t size) {
  return tnt::report_c_api_error(error.what(), out, size);
}

}  // namespace

extern "C" {

int tnt_engine_abi_version(void) { return TNT_ENGINE_ABI_VERSION; }

int tnt_reducer_ready(int reducer, size_t tensor, const void* data, size_t bytes, char* error, size_t error_size) {
  try {
    tnt::Engine::get().reducer(reducer)->ready(tensor, data, bytes);
    return 0;
  } catch (const std::exception& e) {
    return report(e, error, error_size);
  }
}

int tnt_reducer_deliver(int reducer, size_t tensor, void* out, size_t bytes, tnt_done_fn done, void* context,
                        char* error, size_t error_size) {
  try {
    // Held for this call; the callback runs on the progress thread (while the
    // reducer exists), at once, or from its destructor with a failure.
    const std::shared_ptr<tnt::FusedReducer> held = tnt::Engine::get().reducer(reducer);
    tnt::FusedReducer& target = *held;
    target.when_reduced(tensor, [&target, tensor, out, bytes, done, context](const std::string& failure) {
      if (!failure.empty()) {
        done(context, failure.c_str());
        return;
      }
      try {
        target.copy_result(tensor, out, bytes);
      } catch (const std::exception& e) {
        done(context, e.what());
        return;
      }
      done(context, nullptr);
    });
    return 0;
  } catch (const std::exception& e) {
    return report(e, error, error_size);
  }
}

void tnt_reducer_cancel_step(int reducer) {
  try {
    tnt::Engine::get().reducer(reducer)->cancel_step();
  } catch (const std::exception&) {
    // A reducer already removed has nothing left to cancel.
  }
}

int tnt_reducer_reductions_completed(int reducer, unsigned long long* count, char* error, size_t error_size) {
  try {
    *count = tnt::Engine::get().reducer(reducer)->reductions_completed();
    return 0;
  } catch (const std::exception& e) {
    return report(e, error, error_size);
  }
}

int tnt_graph_allreduce_sum(int allreducer, const void* in, void* out, size_t count, const char* dtype_name,
                            tnt_done_fn done, void* context, char* error, size_t error_size) {
  try {
    const tnt::AllreduceCall call{in, out, count, tnt::dtype_from_name(dtype_name), tnt::ReduceOp::sum};
    tnt::Engine::get().graph_allreducer(allreducer)->submit(call, [done, context](const std::string& failure) {
      done(context, failure.empty() ? nullptr : failure.c_str());
    });
    return 0;
  } catch (const std::exception& e) {
    return report(e, error, error_size);
  }
}

void tnt_graph_allreduce_cancel_step(int allreducer) {
  try {
    tnt::Engine::get().graph_allreducer(allreducer)->cancel_step();
  } catch (const std::exception&) {
    // An allreducer already gone has nothing left to cancel.
  }
}

}  // extern "C"
