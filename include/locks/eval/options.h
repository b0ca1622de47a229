// Minimal "--name value" option parsing for the eval/synth CLI commands (a handful of flags
// does not justify a dependency). Unknown flags, missing values and bad numbers are
// locks::Error with the flag named.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace locks::eval {

class Options {
 public:
  // valued: flags that take a value; switches: flags that do not.
  Options(const std::vector<std::string>& args, const std::vector<std::string>& valued,
          const std::vector<std::string>& switches);
  bool has(const std::string& flag) const;
  std::string str(const std::string& flag, const std::string& def) const;
  std::string required(const std::string& flag) const;
  long long integer(const std::string& flag, long long def) const;
  double real(const std::string& flag, double def) const;
  std::vector<int> int_list(const std::string& flag, const std::vector<int>& def) const;
  std::vector<std::string> str_list(const std::string& flag) const;  // comma-separated

 private:
  std::map<std::string, std::string> values_;
};

}  // namespace locks::eval
