#include "log.hpp"

#include <atomic>
#include <cstdio>

namespace tnt {

namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{static_cast<int>(LogLevel::warning)};
std::atomic<bool> g_all_ranks{false};

void emit(LogLevel level, const char* tag, const std::string& message) {
  if (static_cast<int>(level) < g_level.load()) return;
  const int rank = g_rank.load();
  // Warnings and errors come from every rank: they name what that rank saw.
  if (level < LogLevel::warning && !g_all_ranks.load() && rank > 0) return;
  std::fprintf(stderr, "[tarantella rank %d] %s: %s\n", rank, tag, message.c_str());
  std::fflush(stderr);
}
}  // namespace

void set_log_identity(int world_rank, LogLevel level, bool all_ranks) {
  g_rank = world_rank;
  g_level = static_cast<int>(level);
  g_all_ranks = all_ranks;
}

void log_debug(const std::string& message) { emit(LogLevel::debug, "DEBUG", message); }
void log_warning(const std::string& message) { emit(LogLevel::warning, "WARNING", message); }

}  // namespace tnt
