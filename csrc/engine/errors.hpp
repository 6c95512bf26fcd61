// Note [Errors]
// Two tiers of errors:
//  - TNT_ASSERT: our own bugs; the message says it is an internal error.
//  - the exception types below: the user's or the environment's fault; their
//    messages say, in one line, what was expected, the likely cause and what
//    to change (a setting, with its TNT_ variable or launcher flag), and name
//    ranks by their world rank. Every MPI call is checked through TNT_MPI
//    (mpi_call.hpp), which raises MpiError with MPI's own text. The Python face
//    maps each type to an exception of tarantella.errors (csrc/python/module.cpp).
#pragma once

#include <stdexcept>
#include <string>

namespace tnt {

// Base of every error the engine raises on purpose.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An MPI call failed; carries MPI's own error text.
class MpiError : public Error {
 public:
  using Error::Error;
};

// Ranks disagree about a collective (size, dtype, op, layout).
class MismatchError : public Error {
 public:
  using Error::Error;
};

// A wait went beyond the configured timeout; names the ranks not heard from.
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// A collective of this process group (or of a group derived from the same
// parent) timed out or failed in MPI earlier: peers may be gone or out of
// step, so every later collective refuses to run (Note [A failed group stays failed]).
class GroupFailedError : public Error {
 public:
  using Error::Error;
};

// Bad arguments from the caller (wrong size, unknown name, wrong state).
class UsageError : public Error {
 public:
  using Error::Error;
};

[[noreturn]] void internal_error(const char* file, int line, const std::string& what);

}  // namespace tnt

#define TNT_ASSERT(cond, what)                                   \
  do {                                                           \
    if (!(cond)) ::tnt::internal_error(__FILE__, __LINE__, what); \
  } while (0)
