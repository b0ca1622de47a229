// File safety for everything the library and the CLI read or write (docs/bad_input.md):
//  - reads open only regular files: a FIFO, a directory or a device is refused at once
//    (opened non-blocking, then checked with fstat), never waited on;
//  - writes check every write(2) and the final close(2), and name the file and the errno
//    text (e.g. "No space left on device"); a failed write removes the partial file;
//  - StagedDir writes a result folder under a temporary name next to the target and renames
//    it into place only when everything was written, so a folder is replaced whole or not
//    at all.
// Every failure is a locks::Error whose message names the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace locks::io {

// A regular file opened for reading.
class InputFile {
 public:
  // `who` prefixes error messages (e.g. "npy_load").
  InputFile(const std::string& path, const char* who);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int64_t size() const { return size_; }
  // Reads exactly n bytes from the current position; `what` names the part for the error.
  void read_exact(void* buf, size_t n, const char* what);

 private:
  std::string path_;
  const char* who_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// The whole of a regular file, refused when larger than max_bytes.
std::string read_text_file(const std::string& path, const char* who, int64_t max_bytes);

// A file opened for writing (created or truncated). close() must be called for the write to
// count: destroying an unclosed OutputFile (an exception on the way) removes the file when it
// is a regular file.
class OutputFile {
 public:
  OutputFile(const std::string& path, const char* who);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  void write(const void* data, size_t n);
  void close();

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_;
  const char* who_;
  int fd_ = -1;
  bool regular_ = false;
};

// Writes text to path whole (OutputFile), or throws.
void write_text_file(const std::string& path, const std::string& text, const char* who);

// A result folder written under a temporary name next to `target` and renamed into place by
// commit(). Without commit() (an exception on the way) the temporary folder is removed and
// the target is left as it was.
class StagedDir {
 public:
  // Throws unless `target` can be (re)placed: it must be absent, an empty folder, or, with
  // `force`, any folder (never a file, "." or ".."). Creates missing parent folders.
  StagedDir(const std::string& target, bool force);
  ~StagedDir();
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;

  // The temporary folder to write into.
  const std::string& path() const { return tmp_; }
  // Moves the temporary folder to the target (replacing an existing one atomically where the
  // file system allows, else by a rename aside and back).
  void commit();

  // The check of the constructor, alone: an empty string when target may be used, else why
  // not (for a usage error before any work is done).
  static std::string check_target(const std::string& target, bool force);

 private:
  std::string target_, tmp_;
  bool committed_ = false;
};

}  // namespace locks::io
