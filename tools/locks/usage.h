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
  // A decimal integer in [lo, hi] (parse_integer); def when the flag is absent.
  long long integer(const std::string& flag, long long def, long long lo, long long hi) const;
  // A decimal number in [lo, hi] (parse_real); def when the flag is absent.
  double real(const std::string& flag, double def, double lo, double hi) const;

 private:
  std::map<std::string, std::string> values_;
};

// The one integer parser of the CLI: optional '-', then decimal digits, nothing else (no
// spaces, no '+', no "1e3", no "0x10"), within [lo, hi]; else a UsageError naming the flag.
long long parse_integer(const std::string& flag, const std::string& text, long long lo,
                        long long hi);
// The same for real numbers (decimal or scientific notation; no spaces, inf or nan).
double parse_real(const std::string& flag, const std::string& text, double lo, double hi);
// "a,b,c" -> items; an empty item (",," or a trailing comma) is a UsageError.
std::vector<std::string> split_list(const std::string& flag, const std::string& text);

}  // namespace locks::cli
