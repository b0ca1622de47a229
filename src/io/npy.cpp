// .npy reader/writer. Format:
// https://numpy.org/doc/stable/reference/generated/numpy.lib.format.html
//   magic "\x93NUMPY", major, minor, header length (u16 for 1.0, u32 for 2.0/3.0),
//   then an ASCII (3.0: UTF-8) Python dict literal {'descr': ..., 'fortran_order': ...,
//   'shape': (...), } padded with spaces and a newline, then the raw C-order payload.
// The dict is parsed by a tiny recursive-descent parser that accepts exactly the literals
// numpy writes (strings, True/False, tuples of non-negative integers).
#include "locks/npy.h"

#include <bit>
#include <cctype>
#include <cstring>
#include <limits>
#include <optional>
#include <sstream>

#include "locks/dtype.h"
#include "locks/error.h"
#include "locks/io/files.h"

namespace locks {

static_assert(std::endian::native == std::endian::little,
              "the .npy I/O assumes a little-endian host");

int64_t NpyArray::size() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

namespace {

[[noreturn]] void npy_fail(const char* fn, const std::string& path, const std::string& what) {
  throw Error(std::string(fn) + ": " + path + ": " + what);
}

// Parser of the header dict. Errors carry a short description; the caller adds the file.
class DictParser {
 public:
  explicit DictParser(std::string_view s) : s_(s) {}

  struct Header {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<int64_t>> shape;
    bool descr_structured = false;  // parsing stopped at a structured dtype (unsupported)
  };

  // Returns an error description, or empty on success.
  std::string parse(Header& h) {
    try {
      skip_ws();
      expect('{');
      skip_ws();
      while (peek() != '}') {
        const std::string key = parse_string();
        skip_ws();
        expect(':');
        skip_ws();
        if (key == "descr") {
          if (h.descr) throw std::string("duplicate key 'descr'");
          if (peek() == '[' || peek() == '{') {
            // A structured (record) dtype: a list of fields, or a dict of them.
            h.descr_structured = true;
            return {};
          }
          h.descr = parse_string();
        } else if (key == "fortran_order") {
          if (h.fortran_order) throw std::string("duplicate key 'fortran_order'");
          h.fortran_order = parse_bool();
        } else if (key == "shape") {
          if (h.shape) throw std::string("duplicate key 'shape'");
          h.shape = parse_tuple();
        } else {
          throw "unexpected key '" + key + "'";
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          skip_ws();
        } else if (peek() != '}') {
          throw std::string("expected ',' or '}' after the value of '") + key + "'";
        }
      }
      expect('}');
      skip_ws();
      if (pos_ != s_.size()) throw std::string("trailing characters after the dict");
      if (!h.descr) throw std::string("missing key 'descr'");
      if (!h.fortran_order) throw std::string("missing key 'fortran_order'");
      if (!h.shape) throw std::string("missing key 'shape'");
    } catch (const std::string& e) {
      return e;
    }
    return {};
  }

 private:
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  void expect(char c) {
    if (peek() != c) throw std::string("expected '") + c + "' at offset " + std::to_string(pos_);
    ++pos_;
  }
  std::string parse_string() {
    const char q = peek();
    if (q != '\'' && q != '"') throw "expected a string at offset " + std::to_string(pos_);
    ++pos_;
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != q) {
      if (s_[pos_] == '\\') throw std::string("escape sequences are not supported in strings");
      ++pos_;
    }
    if (pos_ >= s_.size()) throw std::string("unterminated string");
    std::string out(s_.substr(start, pos_ - start));
    ++pos_;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    throw "expected True or False at offset " + std::to_string(pos_);
  }
  std::vector<int64_t> parse_tuple() {
    expect('(');
    std::vector<int64_t> dims;
    skip_ws();
    while (peek() != ')') {
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        throw "expected a non-negative integer in 'shape' at offset " + std::to_string(pos_);
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        const int digit = peek() - '0';
        if (v > (std::numeric_limits<int64_t>::max() - digit) / 10)
          throw std::string("'shape' entry too large");
        v = v * 10 + digit;
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long suffix
      dims.push_back(v);
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        skip_ws();
      } else if (peek() != ')') {
        throw "expected ',' or ')' in 'shape' at offset " + std::to_string(pos_);
      }
    }
    expect(')');
    return dims;
  }

  std::string_view s_;
  size_t pos_ = 0;
};

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) os << ", ";
    os << shape[i];
  }
  if (shape.size() == 1) os << ',';
  os << ')';
  return os.str();
}

void save_raw(const char* fn, const std::string& path, const void* data, const char* descr,
              int itemsize, const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t s : shape) {
    if (s < 0) npy_fail(fn, path, "negative dimension in shape " + shape_str(shape));
    if (s != 0 && n > std::numeric_limits<int64_t>::max() / itemsize / s)
      npy_fail(fn, path, "shape " + shape_str(shape) + " is too large");
    n *= s;
  }
  if (n > 0 && data == nullptr) npy_fail(fn, path, "null data pointer");
  std::string dict = std::string("{'descr': '") + descr +
                     "', 'fortran_order': False, 'shape': " + shape_str(shape) + ", }";
  // Pad with spaces so that magic + version + length + dict + '\n' is a multiple of 64.
  int version = 1;
  size_t prefix = 10;
  size_t total = prefix + dict.size() + 1;
  size_t padded = (total + 63) / 64 * 64;
  if (padded - prefix > 65535) {
    version = 2;
    prefix = 12;
    total = prefix + dict.size() + 1;
    padded = (total + 63) / 64 * 64;
  }
  dict.append(padded - total, ' ');
  dict.push_back('\n');

  io::OutputFile f(path, fn);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', static_cast<char>(version), 0};
  f.write(magic, 8);
  const uint32_t hlen = static_cast<uint32_t>(dict.size());
  if (version == 1) {
    const uint16_t h16 = static_cast<uint16_t>(hlen);
    f.write(&h16, 2);
  } else {
    f.write(&hlen, 4);
  }
  f.write(dict.data(), dict.size());
  if (n > 0) f.write(data, static_cast<size_t>(n) * itemsize);
  f.close();
}

}  // namespace

NpyArray npy_load(const std::string& path) {
  constexpr const char* fn = "npy_load";
  io::InputFile f(path, fn);  // regular files only: a FIFO or a directory is an error
  const int64_t file_size = f.size();

  char pre[8];
  if (file_size < 10)
    npy_fail(fn, path,
             "file too short to be a .npy file (" + std::to_string(file_size) + " bytes)");
  f.read_exact(pre, 8, "the header");
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) npy_fail(fn, path, "bad magic: not a .npy file");
  const int major = static_cast<unsigned char>(pre[6]);
  const int minor = static_cast<unsigned char>(pre[7]);
  if (major < 1 || major > 3 || minor != 0)
    npy_fail(fn, path,
             "unsupported .npy format version " + std::to_string(major) + "." +
                 std::to_string(minor) + " (supported: 1.0, 2.0, 3.0)");
  uint32_t hlen = 0;
  int64_t prefix = 0;
  if (major == 1) {
    uint16_t h16 = 0;
    f.read_exact(&h16, 2, "the header length");
    hlen = h16;
    prefix = 10;
  } else {
    if (file_size < 12) npy_fail(fn, path, "file too short for a version 2/3 header");
    f.read_exact(&hlen, 4, "the header length");
    prefix = 12;
  }
  if (prefix + static_cast<int64_t>(hlen) > file_size)
    npy_fail(fn, path,
             "truncated header (header length " + std::to_string(hlen) + " exceeds the file size " +
                 std::to_string(file_size) + ")");
  std::string header(hlen, '\0');
  if (hlen > 0) f.read_exact(header.data(), hlen, "the header");

  DictParser::Header h;
  const std::string err = DictParser(header).parse(h);
  if (h.descr_structured)
    npy_fail(fn, path,
             "unsupported dtype: a structured (record) dtype (supported: '<f4' float32, '<f2' "
             "float16)");
  if (!err.empty()) npy_fail(fn, path, "bad header dict: " + err);
  if (*h.fortran_order)
    npy_fail(fn, path, "fortran_order is True: only C-order arrays are supported");

  const std::string& descr = *h.descr;
  int itemsize = 0;
  NpyArray a;
  if (descr == "<f4") {
    itemsize = 4;
    a.source_dtype = "float32";
  } else if (descr == "<f2" || descr == "|f2") {
    itemsize = 2;
    a.source_dtype = "float16";
  } else {
    npy_fail(fn, path,
             "unsupported dtype '" + descr + "' (supported: '<f4' float32, '<f2' float16)");
  }

  a.shape = *h.shape;
  int64_t n = 1;
  for (int64_t s : a.shape) {
    if (s != 0 && n > std::numeric_limits<int64_t>::max() / itemsize / s)
      npy_fail(fn, path, "shape " + shape_str(a.shape) + " is too large");
    n *= s;
  }
  const int64_t payload = file_size - prefix - hlen;
  if (payload != n * itemsize)
    npy_fail(fn, path,
             "payload size mismatch: shape " + shape_str(a.shape) + " of " + descr + " needs " +
                 std::to_string(n * itemsize) + " bytes but the file holds " +
                 std::to_string(payload) +
                 (payload < n * itemsize ? " (truncated)" : " (too long)"));

  a.data.resize(static_cast<size_t>(n));
  if (itemsize == 4) {
    if (n > 0) f.read_exact(a.data.data(), static_cast<size_t>(n) * 4, "the payload");
  } else {
    std::vector<uint16_t> raw(static_cast<size_t>(n));
    if (n > 0) f.read_exact(raw.data(), static_cast<size_t>(n) * 2, "the payload");
    for (int64_t i = 0; i < n; ++i) a.data[i] = half_to_float(raw[i]);
  }
  return a;
}

void npy_save(const std::string& path, const float* data, const std::vector<int64_t>& shape) {
  save_raw("npy_save", path, data, "<f4", 4, shape);
}

void npy_save_i32(const std::string& path, const int32_t* data, const std::vector<int64_t>& shape) {
  save_raw("npy_save_i32", path, data, "<i4", 4, shape);
}

}  // namespace locks
