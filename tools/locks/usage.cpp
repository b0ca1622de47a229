#include "usage.h"

#include <charconv>
#include <sstream>

namespace locks::cli {

Args::Args(const std::vector<std::string>& args, const std::set<std::string>& valued,
           const std::set<std::string>& switches) {
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) != 0) throw UsageError("unexpected argument '" + a + "'");
    const size_t eq = a.find('=');
    const std::string flag = a.substr(0, eq);
    if (values_.count(flag)) throw UsageError("flag " + flag + " given twice");
    if (valued.count(flag)) {
      if (eq != std::string::npos) {
        values_[flag] = a.substr(eq + 1);
      } else if (i + 1 < args.size() && args[i + 1].rfind("--", 0) != 0) {
        values_[flag] = args[++i];
      } else {
        throw UsageError("missing value for " + flag);
      }
      if (values_[flag].empty()) throw UsageError("empty value for " + flag);
    } else if (switches.count(flag)) {
      if (eq != std::string::npos) throw UsageError(flag + " takes no value");
      values_[flag] = "";
    } else {
      throw UsageError("unknown flag '" + flag + "'");
    }
  }
}

std::string Args::str(const std::string& flag, const std::string& def) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? def : it->second;
}

std::string Args::required(const std::string& flag) const {
  const auto it = values_.find(flag);
  if (it == values_.end()) throw UsageError("missing required flag " + flag);
  return it->second;
}

long long Args::integer(const std::string& flag, long long def, long long lo, long long hi) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? def : parse_integer(flag, it->second, lo, hi);
}

double Args::real(const std::string& flag, double def, double lo, double hi) const {
  const auto it = values_.find(flag);
  return it == values_.end() ? def : parse_real(flag, it->second, lo, hi);
}

long long parse_integer(const std::string& flag, const std::string& s, long long lo, long long hi) {
  long long v = 0;
  // from_chars takes an optional '-' and digits only: no whitespace, '+', exponent or base.
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec == std::errc::result_out_of_range)
    throw UsageError(flag + " value '" + s + "' is out of range");
  if (s.empty() || ec != std::errc() || end != s.data() + s.size())
    throw UsageError(flag + " expects an integer, got '" + s + "'");
  if (v < lo || v > hi)
    throw UsageError(flag + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                     "], got " + s);
  return v;
}

double parse_real(const std::string& flag, const std::string& s, double lo, double hi) {
  double v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  const bool word = s.find_first_of("iInN") != std::string::npos;  // inf, nan
  if (s.empty() || word || ec != std::errc() || end != s.data() + s.size())
    throw UsageError(flag + " expects a number, got '" + s + "'");
  if (!(v >= lo && v <= hi)) {
    std::ostringstream os;
    os << flag << " must be in [" << lo << ", " << hi << "], got " << s;
    throw UsageError(os.str());
  }
  return v;
}

std::vector<std::string> split_list(const std::string& flag, const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? comma : comma - start);
    if (item.empty()) throw UsageError(flag + " needs a comma-separated list, got '" + text + "'");
    out.push_back(item);
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace locks::cli
