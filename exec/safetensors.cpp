#include "exec/safetensors.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include <nlohmann/json.hpp>

#include "exec/atomic_file.hpp"
#include "exec/binary_io.hpp"
#include "model/error.hpp"
#include "model/json_util.hpp"

namespace hetflow::exec {

namespace {

namespace json_util = model::json_util;
using Json = nlohmann::json;

// Tensor bytes are read and converted this many at a time, so a large tensor never needs a
// second copy of its bytes beside its floats.
constexpr size_t kChunkBytes = size_t{1} << 20;

// The bytes of a file, read at offsets: a file on disk or bytes in memory.
class Source {
 public:
  virtual ~Source() = default;
  virtual std::uint64_t size_bytes() const = 0;
  // Reads [offset, offset + n), which the caller has checked lies within size_bytes().
  virtual void read(std::uint64_t offset, size_t n, unsigned char* out) const = 0;
};

class MemorySource : public Source {
 public:
  explicit MemorySource(std::string_view bytes) : bytes_(bytes) {}
  std::uint64_t size_bytes() const override { return bytes_.size(); }
  void read(std::uint64_t offset, size_t n, unsigned char* out) const override {
    std::memcpy(out, bytes_.data() + offset, n);
  }

 private:
  std::string_view bytes_;
};

class FileSource : public Source {
 public:
  explicit FileSource(const std::string& path) : file_(path) {}
  std::uint64_t size_bytes() const override { return file_.size_bytes(); }
  void read(std::uint64_t offset, size_t n, unsigned char* out) const override { file_.read(offset, n, out); }

 private:
  ReadOnlyFile file_;
};

// The dtypes of the format (so that a refusal can say "I64 is not read", not "unknown").
struct Dtype {
  std::string_view name;
  int size_bytes;
  bool readable;
};
constexpr std::array<Dtype, 17> kDtypes{{{"F32", 4, true},       {"F16", 2, true},      {"BF16", 2, true},
                                         {"F64", 8, false},      {"I64", 8, false},     {"U64", 8, false},
                                         {"I32", 4, false},      {"U32", 4, false},     {"I16", 2, false},
                                         {"U16", 2, false},      {"I8", 1, false},      {"U8", 1, false},
                                         {"BOOL", 1, false},     {"F8_E4M3", 1, false}, {"F8_E5M2", 1, false},
                                         {"F8_E8M0", 1, false},  {"C64", 8, false}}};

// A name as it appears in a field: whole unless huge (a hostile header may hold a name of
// megabytes, and a message must stay readable).
std::string field_of(const std::string& name) {
  constexpr size_t kMaxShown = 200;
  return "header." + (name.size() > kMaxShown ? name.substr(0, kMaxShown) + "..." : name);
}

std::string offsets_text(std::uint64_t begin, std::uint64_t end) {
  return "[" + std::to_string(begin) + ", " + std::to_string(end) + "]";
}

// A header entry, checked.
struct Entry {
  std::string name;
  const Dtype* dtype = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t elements = 1;
  std::uint64_t begin = 0, end = 0;
};

std::uint64_t unsigned_integer(const Json& v, const std::string& file, const std::string& field,
                               const std::string& what) {
  if (!v.is_number_integer()) {
    throw InputError(file, 0, field, what + ": expected a non-negative integer, not " + json_util::brief(v));
  }
  if (v.is_number_unsigned()) return v.get<std::uint64_t>();
  const auto value = v.get<std::int64_t>();
  if (value < 0) throw InputError(file, 0, field, what + ": " + std::to_string(value) + " is negative");
  return static_cast<std::uint64_t>(value);
}

Entry parse_entry(const std::string& name, const Json& value, std::uint64_t data_bytes, const std::string& file) {
  const std::string field = field_of(name);
  if (name.empty()) throw InputError(file, 0, "header", "a tensor has an empty name");
  if (!value.is_object()) {
    throw InputError(file, 0, field, "expected an object with dtype, shape and data_offsets, not " +
                                         json_util::brief(value));
  }
  for (const auto& [key, member] : value.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw InputError(file, 0, field + "." + key, "unknown key; a tensor has dtype, shape and data_offsets");
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!value.contains(key)) throw InputError(file, 0, field + "." + key, "missing");
  }
  Entry e;
  e.name = name;

  const Json& dtype = value["dtype"];
  if (!dtype.is_string()) {
    throw InputError(file, 0, field + ".dtype", "expected a string, not " + json_util::brief(dtype));
  }
  const auto& dtype_name = dtype.get_ref<const std::string&>();
  for (const Dtype& d : kDtypes) {
    if (d.name == dtype_name) e.dtype = &d;
  }
  if (e.dtype == nullptr) {
    throw InputError(file, 0, field + ".dtype", "unknown dtype " + json_util::brief(dtype) +
                                                    "; the ones read are F32, F16 and BF16");
  }
  if (!e.dtype->readable) {
    throw InputError(file, 0, field + ".dtype",
                     dtype_name + " is not read; the ones read are F32, F16 and BF16 (into fp32)");
  }

  const Json& shape = value["shape"];
  if (!shape.is_array()) {
    throw InputError(file, 0, field + ".shape", "expected an array of dimensions, not " + json_util::brief(shape));
  }
  bool overflow = false;
  for (size_t i = 0; i < shape.size(); ++i) {
    const std::string what = "dimension " + std::to_string(i);
    const std::uint64_t dim = unsigned_integer(shape[i], file, field + ".shape", what);
    if (dim > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw InputError(file, 0, field + ".shape", what + ": " + std::to_string(dim) + " is too large");
    }
    e.shape.push_back(static_cast<std::int64_t>(dim));
    // As the reference reader: an overflowing running product is refused, even where a later
    // dimension of 0 would bring it back.
    overflow = overflow || __builtin_mul_overflow(e.elements, dim, &e.elements);
  }
  if (overflow) throw InputError(file, 0, field + ".shape", "the element count overflows 64 bits");
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(e.elements, static_cast<std::uint64_t>(e.dtype->size_bytes), &bytes)) {
    throw InputError(file, 0, field + ".shape", "the size in bytes overflows 64 bits");
  }

  const Json& offsets = value["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2) {
    throw InputError(file, 0, field + ".data_offsets", "expected [begin, end], not " + json_util::brief(offsets));
  }
  e.begin = unsigned_integer(offsets[0], file, field + ".data_offsets", "begin");
  e.end = unsigned_integer(offsets[1], file, field + ".data_offsets", "end");
  if (e.begin > e.end) {
    throw InputError(file, 0, field + ".data_offsets", offsets_text(e.begin, e.end) + ": begin is after end");
  }
  if (e.end > data_bytes) {
    throw InputError(file, 0, field + ".data_offsets",
                     offsets_text(e.begin, e.end) + ": ends beyond the " + std::to_string(data_bytes) +
                         " bytes of data after the header");
  }
  if (e.end - e.begin != bytes) {
    throw InputError(file, 0, field + ".data_offsets",
                     offsets_text(e.begin, e.end) + " holds " + std::to_string(e.end - e.begin) + " bytes, but " +
                         std::to_string(e.elements) + " elements of " + dtype_name + " take " +
                         std::to_string(bytes));
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(const Json& value, const std::string& file) {
  std::map<std::string, std::string> metadata;
  if (value.is_null()) return metadata;  // the reference reads null as no metadata
  if (!value.is_object()) {
    throw InputError(file, 0, "header.__metadata__", "expected an object of strings, not " + json_util::brief(value));
  }
  for (const auto& [key, v] : value.items()) {
    if (!v.is_string()) {
      throw InputError(file, 0, "header.__metadata__." + key, "expected a string, not " + json_util::brief(v));
    }
    metadata.emplace(key, v.get<std::string>());
  }
  return metadata;
}

void decode(const Source& source, std::uint64_t data_start, const Entry& e, std::vector<float>& out) {
  out.resize(static_cast<size_t>(e.elements));
  if constexpr (std::endian::native == std::endian::little) {  // F32 is the host's own: read in place
    if (e.dtype->name == "F32") {
      if (e.end > e.begin) source.read(data_start + e.begin, static_cast<size_t>(e.end - e.begin), reinterpret_cast<unsigned char*>(out.data()));
      return;
    }
  }
  const size_t element_bytes = static_cast<size_t>(e.dtype->size_bytes);
  std::vector<unsigned char> chunk(static_cast<size_t>(std::min<std::uint64_t>(e.end - e.begin, kChunkBytes)));
  size_t done = 0;  // elements converted
  for (std::uint64_t at = e.begin; at < e.end;) {
    const size_t n = static_cast<size_t>(std::min<std::uint64_t>(e.end - at, chunk.size()));
    source.read(data_start + at, n, chunk.data());
    const unsigned char* p = chunk.data();
    float* to = out.data() + done;
    const size_t count = n / element_bytes;
    if (e.dtype->name == "F32") {
      for (size_t i = 0; i < count; ++i) to[i] = std::bit_cast<float>(load_le32(p + 4 * i));
    } else if (e.dtype->name == "F16") {
      for (size_t i = 0; i < count; ++i) to[i] = f16_bits_to_float(load_le16(p + 2 * i));
    } else {
      for (size_t i = 0; i < count; ++i) to[i] = bf16_bits_to_float(load_le16(p + 2 * i));
    }
    done += count;
    at += n;
  }
}

// A file's header, checked: its tensors in offset order, tiling the data.
struct Layout {
  std::vector<Entry> entries;
  std::map<std::string, std::string> metadata;
  std::uint64_t data_start = 0;
};

Layout read_layout(const Source& source, const std::string& file) {
  const std::uint64_t size = source.size_bytes();
  if (size < 8) {
    throw InputError(file, 0, "header_length",
                     "the file has " + std::to_string(size) +
                         " bytes; a safetensors file begins with an 8-byte header length");
  }
  unsigned char length_bytes[8];
  source.read(0, 8, length_bytes);
  const std::uint64_t header_bytes = load_le64(length_bytes);
  if (header_bytes > kMaxSafetensorsHeaderBytes) {
    throw InputError(file, 0, "header_length",
                     std::to_string(header_bytes) + " bytes: more than the 100 MiB a header may have");
  }
  if (header_bytes > size - 8) {
    throw InputError(file, 0, "header_length",
                     std::to_string(header_bytes) + " bytes, but only " + std::to_string(size - 8) +
                         " follow the length");
  }
  std::string header(static_cast<size_t>(header_bytes), '\0');
  source.read(8, header.size(), reinterpret_cast<unsigned char*>(header.data()));
  Json root;
  try {
    root = json_util::parse<Json>(header, file);
  } catch (const InputError& e) {  // the field within the header, as every other field is named
    throw InputError(e.file(), e.line(), e.field() == "json" ? "header" : "header." + e.field(), e.message());
  }
  if (!root.is_object()) {
    throw InputError(file, 0, "header", "expected a JSON object, not " + json_util::brief(root));
  }

  Layout layout;
  layout.data_start = 8 + header_bytes;
  const std::uint64_t data_bytes = size - layout.data_start;
  std::vector<Entry>& entries = layout.entries;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      layout.metadata = parse_metadata(value, file);
    } else {
      entries.push_back(parse_entry(key, value, data_bytes, file));
    }
  }
  root = Json();  // the tree may be large; the entries hold all that is needed from here

  // The reference reader demands that the tensors tile the data: sorted by offsets, each
  // begins where the one before ends, and the last ends at the end of the file.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  std::uint64_t covered = 0;
  const Entry* before = nullptr;
  for (const Entry& e : entries) {
    if (e.begin < covered) {
      throw InputError(file, 0, field_of(e.name) + ".data_offsets",
                       offsets_text(e.begin, e.end) + " overlaps '" + before->name + "' at " +
                           offsets_text(before->begin, before->end));
    }
    if (e.begin > covered) {
      throw InputError(file, 0, field_of(e.name) + ".data_offsets",
                       offsets_text(e.begin, e.end) + " leaves bytes [" + std::to_string(covered) + ", " +
                           std::to_string(e.begin) + ") of the data to no tensor; tensors must be packed");
    }
    covered = e.end;
    before = &e;
  }
  if (covered != data_bytes) {
    throw InputError(file, 0, "data",
                     "the tensors cover " + std::to_string(covered) + " of the " + std::to_string(data_bytes) +
                         " bytes after the header; nothing may follow the last tensor");
  }
  return layout;
}

SafetensorsFile read_from(const Source& source, const std::string& file) {
  Layout layout = read_layout(source, file);
  SafetensorsFile result;
  result.metadata = std::move(layout.metadata);
  result.tensors.reserve(layout.entries.size());
  for (Entry& e : layout.entries) {
    NamedTensor t;
    t.name = e.name;
    t.shape = std::move(e.shape);
    decode(source, layout.data_start, e, t.data);
    result.tensors.push_back(std::move(t));
  }
  return result;
}

// Checks what the writer is given; returns each tensor's data offsets.
std::vector<std::uint64_t> layout(const SafetensorsFile& contents, const std::string& file) {
  std::vector<std::uint64_t> ends;
  std::set<std::string_view> names;
  std::uint64_t at = 0;
  for (const NamedTensor& t : contents.tensors) {
    const std::string field = "tensors." + t.name;
    if (t.name.empty()) throw InputError(file, 0, "tensors", "a tensor has an empty name");
    if (t.name == "__metadata__") throw InputError(file, 0, field, "the name is reserved for the metadata");
    if (!names.insert(t.name).second) throw InputError(file, 0, field, "two tensors have this name");
    std::uint64_t elements = 1;
    for (const std::int64_t dim : t.shape) {
      if (dim < 0) throw InputError(file, 0, field + ".shape", "dimension " + std::to_string(dim) + " is negative");
      if (__builtin_mul_overflow(elements, static_cast<std::uint64_t>(dim), &elements)) {
        throw InputError(file, 0, field + ".shape", "the element count overflows 64 bits");
      }
    }
    if (elements != t.data.size()) {
      throw InputError(file, 0, field + ".data",
                       std::to_string(t.data.size()) + " values for a shape of " + std::to_string(elements) +
                           " elements");
    }
    at += elements * sizeof(float);  // elements are held in memory: no overflow
    ends.push_back(at);
  }
  return ends;
}

// The length and the header, padded with spaces so that the data begins at a multiple of 8
// bytes (as the reference writer pads it, so that readers may map the data aligned).
std::string header_bytes(const SafetensorsFile& contents, const std::vector<std::uint64_t>& ends,
                         const std::string& file) {
  Json header = Json::object();
  for (size_t i = 0; i < contents.tensors.size(); ++i) {
    const NamedTensor& t = contents.tensors[i];
    header[t.name] = {{"dtype", "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {i == 0 ? 0 : ends[i - 1], ends[i]}}};
  }
  if (!contents.metadata.empty()) header["__metadata__"] = contents.metadata;
  std::string text;
  try {
    text = header.dump();
  } catch (const Json::type_error&) {  // nlohmann refuses to write a string that is not UTF-8
    throw InputError(file, 0, "tensors", "a tensor name or metadata string is not valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  store_le64(text.size(), reinterpret_cast<unsigned char*>(out.data()));
  return out + text;
}

// Calls `sink(bytes, n)` with the little-endian fp32 bytes of `data`, a chunk at a time.
template <typename Sink>
void encode_data(const std::vector<float>& data, Sink&& sink) {
  if constexpr (std::endian::native == std::endian::little) {  // the file's order already: no copy
    if (!data.empty()) sink(reinterpret_cast<const unsigned char*>(data.data()), data.size() * sizeof(float));
  } else {
    std::vector<unsigned char> chunk(std::min(data.size() * sizeof(float), kChunkBytes));
    for (size_t i = 0; i < data.size();) {
      const size_t n = std::min(data.size() - i, chunk.size() / sizeof(float));
      for (size_t k = 0; k < n; ++k) store_le32(std::bit_cast<std::uint32_t>(data[i + k]), chunk.data() + 4 * k);
      sink(chunk.data(), n * sizeof(float));
      i += n;
    }
  }
}

}  // namespace

float f16_bits_to_float(std::uint16_t bits) {
  const std::uint32_t sign = std::uint32_t{bits & 0x8000u} << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1f;
  const std::uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {
    // Zero or a subnormal, mantissa x 2^-24: exact in fp32, whose own range is far wider.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | mantissa << 13);  // inf, NaN (payload kept)
  return std::bit_cast<float>(sign | (exponent - 15 + 127) << 23 | mantissa << 13);
}

float bf16_bits_to_float(std::uint16_t bits) { return std::bit_cast<float>(std::uint32_t{bits} << 16); }

SafetensorsFile read_safetensors(const std::string& path) { return read_from(FileSource(path), path); }

struct SafetensorsReader::Impl {
  explicit Impl(const std::string& p) : path(p), source(p), layout(read_layout(source, p)) {
    for (const Entry& e : layout.entries) tensors.push_back({e.name, e.shape});
  }
  std::string path;
  FileSource source;
  Layout layout;
  std::vector<TensorInfo> tensors;
};

SafetensorsReader::SafetensorsReader(const std::string& path) : impl_(std::make_unique<Impl>(path)) {}
SafetensorsReader::~SafetensorsReader() = default;
SafetensorsReader::SafetensorsReader(SafetensorsReader&&) noexcept = default;
SafetensorsReader& SafetensorsReader::operator=(SafetensorsReader&&) noexcept = default;

const std::string& SafetensorsReader::path() const { return impl_->path; }
const std::vector<TensorInfo>& SafetensorsReader::tensors() const { return impl_->tensors; }
const std::map<std::string, std::string>& SafetensorsReader::metadata() const { return impl_->layout.metadata; }

std::vector<float> SafetensorsReader::read(size_t index) const {
  std::vector<float> out;
  decode(impl_->source, impl_->layout.data_start, impl_->layout.entries.at(index), out);
  return out;
}

SafetensorsFile parse_safetensors(std::string_view bytes, const std::string& file) {
  return read_from(MemorySource(bytes), file);
}

void write_safetensors(const std::string& path, const SafetensorsFile& contents) {
  const std::vector<std::uint64_t> ends = layout(contents, path);
  const std::string head = header_bytes(contents, ends, path);
  AtomicFile out(path);
  out.write(head.data(), head.size());
  for (const NamedTensor& t : contents.tensors) {
    encode_data(t.data, [&](const unsigned char* p, size_t n) { out.write(p, n); });
  }
  out.commit();
}

std::string encode_safetensors(const SafetensorsFile& contents, const std::string& file) {
  const std::vector<std::uint64_t> ends = layout(contents, file);
  std::string out = header_bytes(contents, ends, file);
  for (const NamedTensor& t : contents.tensors) {
    encode_data(t.data, [&](const unsigned char* p, size_t n) { out.append(reinterpret_cast<const char*>(p), n); });
  }
  return out;
}

}  // namespace hetflow::exec
