// Note [Memory that a failed collective may still write]
// A collective that timed out leaves MPI requests behind that cannot always be
// cancelled (a matched receive, a non-blocking collective): a peer that was
// merely frozen may wake up and complete them, writing into (or sending from)
// their buffers. Such buffers are therefore never freed once their group has
// failed: their owners hand them to quarantine(), which keeps them alive until
// the process ends. Only failed jobs pay for this, and they end soon.
#pragma once

#include <memory>
#include <utility>

namespace tnt {

void keep_until_exit(std::shared_ptr<void> object);

// Moves `object` (a std::vector, whose heap block moves with it) into the quarantine.
template <typename T>
void quarantine(T&& object) {
  keep_until_exit(std::make_shared<std::decay_t<T>>(std::forward<T>(object)));
}

}  // namespace tnt
