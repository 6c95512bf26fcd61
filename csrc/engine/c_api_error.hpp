// How the C API's functions hand an error to their caller: the message copied,
// truncated and NUL-terminated, into the caller's buffer, and 1 returned.
// Shared by c_api.cpp and c_api_channels.cpp; not part of the C ABI.
#pragma once

#include <cstddef>
#include <cstring>
#include <string>

namespace tnt {

inline int report_c_api_error(const std::string& message, char* out, std::size_t size) {
  if (out && size) {
    std::strncpy(out, message.c_str(), size - 1);
    out[size - 1] = '\0';
  }
  return 1;
}

}  // namespace tnt
