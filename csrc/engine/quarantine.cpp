#include "quarantine.hpp"

#include <mutex>
#include <vector>

namespace tnt {

void keep_until_exit(std::shared_ptr<void> object) {
  // Never destroyed, on purpose: static destructors at exit must not free
  // what a late peer may still write.
  static auto* kept = new std::vector<std::shared_ptr<void>>();
  static auto* mutex = new std::mutex();
  std::lock_guard<std::mutex> lock(*mutex);
  kept->push_back(std::move(object));
}

}  // namespace tnt
