#include "errors.hpp"

namespace tnt {

void internal_error(const char* file, int line, const std::string& what) {
  throw Error("tarantella internal error at " + std::string(file) + ":" + std::to_string(line) +
              ": " + what + " (this is a bug in tarantella; please report it with TNT_LOG_LEVEL=DEBUG output)");
}

}  // namespace tnt
