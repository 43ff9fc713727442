#pragma once
// HuggingFace's safetensors format: the weights the executor's training loads and saves.
//
// A file is an 8-byte little-endian u64 N, N bytes of JSON header, then the tensors' raw
// little-endian bytes. The header maps each tensor's name to {"dtype", "shape",
// "data_offsets": [begin, end]} (offsets in bytes from the first byte after the header) and
// may hold "__metadata__", an object of strings.
//
// What the reader promises:
//  - F32, F16 and BF16 tensors are read into fp32 exactly (every F16 and BF16 value, the
//    subnormals, infinities and NaN payloads included, is a float); any other dtype is
//    refused by name.
//  - Everything is checked before it is used, and nothing is allocated that the file's own
//    size does not bound: the header length (at most 100 MiB and within the file), the JSON
//    (syntax, nesting, a key given twice), each entry's dtype, shape (non-negative integers
//    whose product does not overflow) and data_offsets ([begin, end], begin <= end, end
//    within the data, end - begin = elements x dtype size), a non-empty name, and the layout:
//    as the reference reader demands, the tensors tile the data exactly, with no overlap, no
//    gap and nothing after the last.
//  - A refusal is an InputError naming the file and the field: "header_length", "header"
//    (the JSON itself; its line is the header's), "header.<name>.<dtype|shape|data_offsets>",
//    "header.__metadata__[.<key>]", "data" (the file could not be read).
//
// What the writer promises: every tensor as F32, in the order given, the header's keys
// sorted and padded with spaces to a multiple of 8 bytes as the reference writer pads it;
// the file is written whole or not at all (exec/atomic_file.hpp). It refuses (InputError
// naming the path) a tensor with an empty or repeated name, the name "__metadata__", a
// negative dimension, or data whose size is not the shape's element count.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace hetflow::exec {

struct NamedTensor {
  std::string name;
  std::vector<std::int64_t> shape;  // [] is a scalar: one element
  std::vector<float> data;          // row-major, product(shape) elements
};

struct SafetensorsFile {
  std::vector<NamedTensor> tensors;  // in file (offset) order; tensors of no bytes at one offset by name
  std::map<std::string, std::string> metadata;
};

// The header length above which a file is refused without reading further.
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100ull << 20;

SafetensorsFile read_safetensors(const std::string& path);

struct TensorInfo {
  std::string name;
  std::vector<std::int64_t> shape;
};

// One file opened for reading tensor by tensor: the header is read and checked as
// read_safetensors checks it (the layout included) when it opens, and a tensor's bytes are
// read and converted only when asked for, so what a reader holds is the header and the
// tensors its caller keeps. read() may be called from several threads at once.
class SafetensorsReader {
 public:
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::string& path() const;
  const std::vector<TensorInfo>& tensors() const;  // in file (offset) order
  const std::map<std::string, std::string>& metadata() const;
  std::vector<float> read(size_t index) const;  // tensors()[index], in fp32

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};
// The same reader over the bytes of a whole file held in memory; `file` names it in errors.
SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& file);

void write_safetensors(const std::string& path, const SafetensorsFile& file);
// The bytes write_safetensors writes (for tests and small files); `file` names the result
// in errors.
std::string encode_safetensors(const SafetensorsFile& contents, const std::string& file = "<safetensors>");

// Exact conversions of one half-precision value's bits to fp32.
float f16_bits_to_float(std::uint16_t bits);
float bf16_bits_to_float(std::uint16_t bits);

}  // namespace hetflow::exec
