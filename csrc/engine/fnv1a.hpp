// FNV-1a (64 bit): a stable hash, the same on every rank and machine for the
// same input, for comparing what ranks hold (a gradient layout) or naming a
// machine (its boot id) in one word.
#pragma once

#include <cstdint>
#include <string>

namespace tnt {

class Fnv1a {
 public:
  // The value's 8 bytes, lowest first (independent of the machine's byte order).
  void add(std::uint64_t value) {
    for (int i = 0; i < 8; ++i) add_byte(static_cast<unsigned char>(value >> (8 * i)));
  }
  void add(const std::string& text) {
    for (char c : text) add_byte(static_cast<unsigned char>(c));
  }
  std::uint64_t value() const { return hash_; }

 private:
  void add_byte(unsigned char byte) { hash_ = (hash_ ^ byte) * 1099511628211ull; }
  std::uint64_t hash_ = 1469598103934665603ull;
};

}  // namespace tnt
