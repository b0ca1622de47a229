// Errors raised at the API boundary. Every public entry point validates its arguments and
// throws a subclass of locks::Error with a message naming the function and the bad argument:
//   InvalidArgument  the call is wrong (shape, null pointer, value out of range)  -> Python
//   ValueError Unsupported      the call is valid but this backend does not implement it
//                    (head_dim, page size, GQA group, dtype, rank on CUDA ...)   ->
//                    NotImplementedError
//   CudaError        the CUDA runtime reported a failure                          -> RuntimeError
// Catch locks::Error to handle all three. An op that throws has written none of its outputs
// (checks run before any write) except CudaError, which can come after a launch.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace locks {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
class InvalidArgument : public Error {
 public:
  using Error::Error;
};
class Unsupported : public Error {
 public:
  using Error::Error;
};
class CudaError : public Error {
 public:
  using Error::Error;
};

namespace detail {
template <typename E = InvalidArgument, typename... Args>
[[noreturn]] inline void fail_as(const char* where, const Args&... args) {
  std::ostringstream os;
  os << where << ": ";
  (os << ... << args);
  throw E(os.str());
}
template <typename... Args>
[[noreturn]] inline void fail(const char* where, const Args&... args) {
  fail_as<InvalidArgument>(where, args...);
}
}  // namespace detail

}  // namespace locks

// LOCKS_REQUIRE(cond, "message parts", ...): throw locks::InvalidArgument naming the function.
#define LOCKS_REQUIRE(cond, ...)                               \
  do {                                                         \
    if (!(cond)) ::locks::detail::fail(__func__, __VA_ARGS__); \
  } while (0)
// LOCKS_SUPPORTED(cond, ...): throw locks::Unsupported (a valid request this backend lacks).
#define LOCKS_SUPPORTED(cond, ...)                                                      \
  do {                                                                                  \
    if (!(cond)) ::locks::detail::fail_as<::locks::Unsupported>(__func__, __VA_ARGS__); \
  } while (0)
