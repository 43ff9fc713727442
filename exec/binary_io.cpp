#include "exec/binary_io.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "model/error.hpp"

namespace hetflow::exec {

ReadOnlyFile::ReadOnlyFile(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: opening a FIFO (or a device) must not wait for a writer before the check
  // below refuses it; on a regular file it changes nothing.
  fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd_ < 0) throw InputError(path_, 0, "file", std::string("cannot be read: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw InputError(path_, 0, "file", "cannot be read: not a regular file");
  }
  size_bytes_ = static_cast<std::uint64_t>(st.st_size);
  // Reads block as usual again (a network file system may honour the flag).
  if (const int flags = ::fcntl(fd_, F_GETFL); flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
}

ReadOnlyFile::~ReadOnlyFile() { ::close(fd_); }

void ReadOnlyFile::read(std::uint64_t offset, size_t n, void* out) const {
  auto* at = static_cast<unsigned char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd_, at, n, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      // The size was checked when the file was opened: it shrank since, or the disk failed.
      throw InputError(path_, 0, "data",
                       "cannot be read at byte " + std::to_string(offset) + ": " +
                           (got == 0 ? std::string("the file ended early") : std::strerror(errno)));
    }
    offset += static_cast<std::uint64_t>(got);
    at += got;
    n -= static_cast<size_t>(got);
  }
}

}  // namespace hetflow::exec
