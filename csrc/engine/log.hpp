// Minimal logging from the engine to stderr, tagged with the world rank.
#pragma once

#include <string>

namespace tnt {

enum class LogLevel : int { debug = 10, info = 20, warning = 30, error = 40 };

void set_log_identity(int world_rank, LogLevel level, bool all_ranks);
void log_debug(const std::string& message);
void log_warning(const std::string& message);

}  // namespace tnt
