#pragma once
// A file written whole or not at all, for the executor's writers (safetensors, token files).
// Bytes go to a temporary file beside the target (same folder, so the rename cannot cross
// file systems); commit() flushes it to disk and renames it onto the target. Destroyed
// without commit() (a write failed, an exception left the writer), the temporary file is
// removed and the target is as it was. Every failure is an InputError naming the target
// path, field "file", and the system's reason.
#include <cstddef>
#include <string>

namespace hetflow::exec {

class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t size_bytes);
  // Makes the written bytes the target's content; no write() may follow.
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what);

  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace hetflow::exec
