// File safety (include/locks/io/files.h): regular files only on input, checked writes on
// output, result folders staged under a temporary name and renamed into place.
#include "locks/io/files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

#include "locks/error.h"

namespace locks::io {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(const char* who, const std::string& path, const std::string& what) {
  throw Error(std::string(who) + ": " + path + ": " + what);
}

std::string errno_text(int err) { return std::strerror(err); }

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// mkdtemp's folders are 0700; results get the permissions any new folder would.
void set_default_dir_mode(const std::string& dir) {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  ::chmod(dir.c_str(), 0777 & ~mask);
}

// target with trailing separators removed ("out/" -> "out").
fs::path normalized(const std::string& target) {
  fs::path p(target);
  while (!p.empty() && !p.has_filename() && p.has_relative_path()) p = p.parent_path();
  return p;
}

}  // namespace

InputFile::InputFile(const std::string& path, const char* who) : path_(path), who_(who) {
  // O_NONBLOCK: opening a FIFO without a writer would otherwise block forever; fstat then
  // refuses everything that is not a regular file (on which O_NONBLOCK has no effect).
  do {
    fd_ = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) fail(who_, path_, "cannot open file (" + errno_text(errno) + ")");
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    fail(who_, path_, "cannot stat (" + errno_text(err) + ")");
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    fail(who_, path_, std::string("not a regular file (it is ") + kind_of(st.st_mode) + ")");
  }
  size_ = static_cast<int64_t>(st.st_size);
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

void InputFile::read_exact(void* buf, size_t n, const char* what) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    // Large reads in pieces: read(2) transfers at most about 2 GiB at a time.
    const size_t want = n < (size_t(1) << 30) ? n : (size_t(1) << 30);
    const ssize_t got = ::read(fd_, p, want);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      fail(who_, path_, std::string("cannot read ") + what + " (" + errno_text(errno) + ")");
    if (got == 0) fail(who_, path_, std::string("unexpected end of file while reading ") + what);
    p += got;
    n -= static_cast<size_t>(got);
  }
}

std::string read_text_file(const std::string& path, const char* who, int64_t max_bytes) {
  InputFile f(path, who);
  if (f.size() > max_bytes)
    fail(who, path,
         "file is " + std::to_string(f.size()) + " bytes, more than the limit of " +
             std::to_string(max_bytes));
  std::string text(static_cast<size_t>(f.size()), '\0');
  f.read_exact(text.data(), text.size(), "the file");
  return text;
}

OutputFile::OutputFile(const std::string& path, const char* who) : path_(path), who_(who) {
  // O_NONBLOCK for the open only: a FIFO without a reader fails (ENXIO) instead of blocking.
  do {
    fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_NONBLOCK | O_CLOEXEC, 0666);
  } while (fd_ < 0 && errno == EINTR);
  if (fd_ < 0) io::fail(who_, path_, "cannot open for writing (" + errno_text(errno) + ")");
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  struct stat st {};
  regular_ = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
}

OutputFile::~OutputFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  if (regular_) ::unlink(path_.c_str());  // not written whole: leave nothing
}

void OutputFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (regular_) ::unlink(path_.c_str());
  io::fail(who_, path_, what + " (" + errno_text(err) + ")");
}

void OutputFile::write(const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const size_t want = n < (size_t(1) << 30) ? n : (size_t(1) << 30);
    const ssize_t put = ::write(fd_, p, want);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) fail("write failed", errno);
    if (put == 0) fail("write failed", EIO);
    p += put;
    n -= static_cast<size_t>(put);
  }
}

void OutputFile::close() {
  // close(2) is where some file systems (NFS, quota) report a failed write.
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    if (regular_) ::unlink(path_.c_str());
    io::fail(who_, path_, "write failed on close (" + errno_text(err) + ")");
  }
}

void write_text_file(const std::string& path, const std::string& text, const char* who) {
  OutputFile f(path, who);
  f.write(text.data(), text.size());
  f.close();
}

std::string StagedDir::check_target(const std::string& target, bool force) {
  const fs::path p = normalized(target);
  if (p.empty()) return "the output folder name is empty";
  const std::string name = p.filename().string();
  if (name == "." || name == "..")
    return "the output folder must be named, not '" + target + "' (it cannot be replaced)";
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(p, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    return "cannot inspect the output path '" + target + "' (" + ec.message() + ")";
  if (!fs::exists(st)) return {};
  if (fs::is_symlink(st))
    return "the output path '" + target + "' is a symbolic link (give the folder it points to)";
  if (!fs::is_directory(st)) return "the output path '" + target + "' exists and is not a folder";
  const bool empty = fs::is_empty(p, ec);
  if (ec) return "cannot list the output folder '" + target + "' (" + ec.message() + ")";
  if (!empty && !force)
    return "the output folder '" + target +
           "' exists and is not empty (pass --force to replace it)";
  return {};
}

StagedDir::StagedDir(const std::string& target, bool force) {
  const std::string why = check_target(target, force);
  if (!why.empty()) throw Error("output: " + why);
  const fs::path p = normalized(target);
  target_ = p.string();
  const fs::path parent = p.parent_path();
  std::error_code ec;
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    if (ec) fail("output", parent.string(), "cannot create the folder (" + ec.message() + ")");
  }
  std::string tmpl = (parent / ("." + p.filename().string() + ".tmp-XXXXXX")).string();
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    fail("output", target_,
         "cannot create a temporary folder beside it (" + errno_text(errno) + ")");
  tmp_ = buf.data();
  set_default_dir_mode(tmp_);
}

StagedDir::~StagedDir() {
  if (committed_ || tmp_.empty()) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void StagedDir::commit() {
  std::error_code ec;
  const bool exists = fs::exists(fs::symlink_status(target_, ec));
  if (!exists) {
    if (::rename(tmp_.c_str(), target_.c_str()) != 0)
      fail("output", target_, "cannot move the results into place (" + errno_text(errno) + ")");
    committed_ = true;
    return;
  }
  // Swap the new folder with the old one in one step, then remove the old one.
  if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, target_.c_str(), RENAME_EXCHANGE) == 0) {
    committed_ = true;
    fs::remove_all(tmp_, ec);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS)
    fail("output", target_, "cannot move the results into place (" + errno_text(errno) + ")");
  // No exchange on this file system: move the old folder aside, the new one in, then drop
  // the old one (put back if the second rename fails).
  std::string tmpl = target_ + ".old-XXXXXX";
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  if (::mkdtemp(buf.data()) == nullptr)
    fail("output", target_,
         "cannot create a temporary folder beside it (" + errno_text(errno) + ")");
  const std::string old = buf.data();
  if (::rename(target_.c_str(), old.c_str()) != 0) {
    const int err = errno;
    ::rmdir(old.c_str());
    fail("output", target_, "cannot move the old folder aside (" + errno_text(err) + ")");
  }
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) {
    const int err = errno;
    ::rename(old.c_str(), target_.c_str());
    fail("output", target_, "cannot move the results into place (" + errno_text(err) + ")");
  }
  committed_ = true;
  fs::remove_all(old, ec);
}

}  // namespace locks::io
