// Command-line parsing for the `locks` sub-commands: "--flag value", "--flag=value" and
// boolean switches. A usage mistake throws UsageError, which main() turns into exit code 2
// (locks::Error, a problem with the data, is exit code 1).
#pragma once

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace locks::cli {

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Args {
 public:
  // valued: flags that take a value; switches: flags that do not.
  Args(const std::vector<std::string>& args, const std::set<std::string>& valued,
       const std::set<std::string>& switches);
  bool has(const std::string& flag) const { return values_.count(flag) > 0; }
  std::string str(const std::string& flag, const std::string& def) const;
  std::string required(const std::string& flag) const;
  // A decimal integer in [lo, hi]; anything else (including "12abc" or "1e3") is a UsageError.
  long long integer(const std::string& flag, long long def, long long lo, long long hi) const;

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace locks::cli
