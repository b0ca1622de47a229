#include "locks/eval/options.h"

#include <algorithm>
#include <cstdint>
#include <sstream>

#include "locks/error.h"

namespace locks::eval {

Options::Options(const std::vector<std::string>& args, const std::vector<std::string>& valued,
                 const std::vector<std::string>& switches) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (std::find(switches.begin(), switches.end(), a) != switches.end()) {
      values_[a] = "1";
    } else if (std::find(valued.begin(), valued.end(), a) != valued.end()) {
      LOCKS_REQUIRE(i + 1 < args.size(), "option ", a, " needs a value");
      values_[a] = args[++i];
    } else {
      LOCKS_REQUIRE(false, "unknown option '", a, "'");
    }
  }
}

bool Options::has(const std::string& f) const { return values_.count(f) > 0; }

std::string Options::str(const std::string& f, const std::string& def) const {
  auto it = values_.find(f);
  return it == values_.end() ? def : it->second;
}

std::string Options::required(const std::string& f) const {
  LOCKS_REQUIRE(has(f), "option ", f, " is required");
  return values_.at(f);
}

long long Options::integer(const std::string& f, long long def) const {
  if (!has(f)) return def;
  const std::string& s = values_.at(f);
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    pos = std::string::npos;
  }
  LOCKS_REQUIRE(pos == s.size(), "option ", f, " needs an integer, got '", s, "'");
  return v;
}

double Options::real(const std::string& f, double def) const {
  if (!has(f)) return def;
  const std::string& s = values_.at(f);
  size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (const std::exception&) {
    pos = std::string::npos;
  }
  LOCKS_REQUIRE(pos == s.size(), "option ", f, " needs a number, got '", s, "'");
  return v;
}

std::vector<std::string> Options::str_list(const std::string& f) const {
  std::vector<std::string> out;
  if (!has(f)) return out;
  std::stringstream ss(values_.at(f));
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  LOCKS_REQUIRE(!out.empty(), "option ", f, " needs a comma-separated list");
  return out;
}

std::vector<int> Options::int_list(const std::string& f, const std::vector<int>& def) const {
  if (!has(f)) return def;
  std::vector<int> out;
  for (const std::string& s : str_list(f)) {
    size_t pos = 0;
    long long v = 0;
    try {
      v = std::stoll(s, &pos);
    } catch (const std::exception&) {
      pos = std::string::npos;
    }
    LOCKS_REQUIRE(pos == s.size() && v >= INT32_MIN && v <= INT32_MAX, "option ", f,
                  " needs integers, got '", s, "'");
    out.push_back(static_cast<int>(v));
  }
  return out;
}

}  // namespace locks::eval
