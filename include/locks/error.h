// Errors raised at the API boundary. Every public entry point validates its
// arguments and throws locks::Error with a message naming the bad argument.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace locks {

class Error : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

namespace detail {
template <typename... Args>
[[noreturn]] inline void fail(const char* where, const Args&... args) {
  std::ostringstream os;
  os << where << ": ";
  (os << ... << args);
  throw Error(os.str());
}
}  // namespace detail

}  // namespace locks

// LOCKS_REQUIRE(cond, "message parts", ...): throw locks::Error naming the function.
#define LOCKS_REQUIRE(cond, ...)                               \
  do {                                                         \
    if (!(cond)) ::locks::detail::fail(__func__, __VA_ARGS__); \
  } while (0)
