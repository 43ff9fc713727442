#include "exec/atomic_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "model/error.hpp"

namespace hetflow::exec {

namespace {

// Process id and a counter: two writers of one target (threads or processes) never share a
// temporary file.
std::string temporary_name(const std::string& path) {
  static std::atomic<unsigned long long> counter{0};
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), temp_path_(temporary_name(path_)) {
  // O_EXCL: never truncate someone else's file that happens to have the temporary's name.
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    throw InputError(path_, 0, "file", std::string("cannot be written: ") + std::strerror(errno));
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::fail(const std::string& what) {
  const int error = errno;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_path_.c_str());
  throw InputError(path_, 0, "file", what + ": " + std::strerror(error));
}

void AtomicFile::write(const void* data, size_t size_bytes) {
  const char* at = static_cast<const char*>(data);
  while (size_bytes > 0) {
    const ssize_t written = ::write(fd_, at, size_bytes);
    if (written < 0) {
      if (errno == EINTR) continue;
      fail("cannot be written");
    }
    at += written;
    size_bytes -= static_cast<size_t>(written);
  }
}

void AtomicFile::commit() {
  // fsync before the rename: otherwise a crash soon after could leave the new name on an
  // empty file.
  if (::fsync(fd_) != 0) fail("cannot be written");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail("cannot be written");
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) fail("cannot be replaced");
  committed_ = true;
}

}  // namespace hetflow::exec
