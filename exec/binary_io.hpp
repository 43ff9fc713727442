#pragma once
// What the executor's binary readers and writers share: a read-only file read at offsets,
// and little-endian loads and stores that hold whatever the host's byte order.
#include <cstddef>
#include <cstdint>
#include <string>

namespace hetflow::exec {

// A regular file opened for reading. Failures are InputError naming the path: field "file"
// when it cannot be opened or is not a regular file, "data" when a read fails.
class ReadOnlyFile {
 public:
  explicit ReadOnlyFile(std::string path);
  ~ReadOnlyFile();
  ReadOnlyFile(const ReadOnlyFile&) = delete;
  ReadOnlyFile& operator=(const ReadOnlyFile&) = delete;

  std::uint64_t size_bytes() const { return size_bytes_; }
  // Reads [offset, offset + n), which the caller has checked lies within size_bytes().
  // Safe to call from several threads at once (pread).
  void read(std::uint64_t offset, size_t n, void* out) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::uint64_t size_bytes_ = 0;
};

inline std::uint16_t load_le16(const unsigned char* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
inline std::uint32_t load_le32(const unsigned char* p) {
  return std::uint32_t{p[0]} | std::uint32_t{p[1]} << 8 | std::uint32_t{p[2]} << 16 | std::uint32_t{p[3]} << 24;
}
inline std::uint64_t load_le64(const unsigned char* p) {
  return std::uint64_t{load_le32(p)} | std::uint64_t{load_le32(p + 4)} << 32;
}
inline void store_le16(std::uint16_t v, unsigned char* p) {
  p[0] = static_cast<unsigned char>(v);
  p[1] = static_cast<unsigned char>(v >> 8);
}
inline void store_le32(std::uint32_t v, unsigned char* p) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
inline void store_le64(std::uint64_t v, unsigned char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

}  // namespace hetflow::exec
