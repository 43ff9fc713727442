// The safetensors reader and writer: a bitwise round trip, exact F16/BF16 decoding against
// the formats' definitions, and one test per refusal, each naming the file and the field.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>

#include "exec/safetensors.hpp"
#include "model/error.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using exec::NamedTensor;
using exec::SafetensorsFile;

namespace {

namespace fs = std::filesystem;

std::string le64(std::uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>(v >> (8 * i));
  return s;
}

std::string le16s(std::initializer_list<std::uint16_t> values) {
  std::string s;
  for (const std::uint16_t v : values) {
    s += static_cast<char>(v & 0xff);
    s += static_cast<char>(v >> 8);
  }
  return s;
}

std::string le32f(std::initializer_list<float> values) {
  std::string s;
  for (const float f : values) {
    const auto v = std::bit_cast<std::uint32_t>(f);
    for (int i = 0; i < 4; ++i) s += static_cast<char>(v >> (8 * i));
  }
  return s;
}

// A file made by hand: the length of `header`, `header`, then `data`.
std::string raw_file(const std::string& name, const std::string& header, const std::string& data) {
  return test_support::write_file(name, le64(header.size()) + header + data);
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The InputError that reading `path` throws; fails the test when it reads.
InputError refusal(const std::string& path) {
  try {
    exec::read_safetensors(path);
  } catch (const InputError& e) {
    return e;
  }
  ADD_FAILURE() << path << " was read";
  return InputError("", 0, "", "");
}

// Reading `header` + `data` is refused with `field`, a message holding `words`, and the file.
void expect_refused(const std::string& header, const std::string& data, const std::string& field,
                    const std::string& words) {
  const std::string path = raw_file("refused.safetensors", header, data);
  const InputError e = refusal(path);
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.field(), field) << e.what();
  EXPECT_NE(e.message().find(words), std::string::npos) << e.what();
}

float from_bits(std::uint32_t bits) { return std::bit_cast<float>(bits); }

SafetensorsFile sample() {
  SafetensorsFile f;
  const float nan_payload = from_bits(0x7fc01234u);
  f.tensors.push_back({"transformer.wte.weight", {2, 3}, {1, -2.5f, 3e-38f, 1e-45f, -0.0f, 7}});
  f.tensors.push_back({"scalar", {}, {42}});
  f.tensors.push_back({"empty", {0, 5}, {}});
  f.tensors.push_back({"specials", {4},
                       {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                        nan_payload, std::numeric_limits<float>::max()}});
  f.metadata = {{"format", "pt"}, {"step", "1200"}, {"note", "ünïcode \"quoted\""}};
  return f;
}

}  // namespace

TEST(SafetensorsTest, RoundTripIsBitwiseInOrderAndKeepsMetadata) {
  const SafetensorsFile written = sample();
  const std::string path = (test_support::scratch_dir() / "round.safetensors").string();
  exec::write_safetensors(path, written);
  const SafetensorsFile read = exec::read_safetensors(path);
  ASSERT_EQ(read.tensors.size(), written.tensors.size());
  for (size_t i = 0; i < read.tensors.size(); ++i) {
    EXPECT_EQ(read.tensors[i].name, written.tensors[i].name);
    EXPECT_EQ(read.tensors[i].shape, written.tensors[i].shape);
    EXPECT_TRUE(same_bits(read.tensors[i].data, written.tensors[i].data)) << read.tensors[i].name;
  }
  EXPECT_EQ(read.metadata, written.metadata);
  EXPECT_EQ(test_support::slurp(path), exec::encode_safetensors(written));  // one writer
}

TEST(SafetensorsTest, WriterPadsHeaderWithSpacesToAMultipleOf8) {
  for (const char* name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    SafetensorsFile f;
    f.tensors.push_back({name, {1}, {1.0f}});
    const std::string bytes = exec::encode_safetensors(f);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(bytes[static_cast<size_t>(i)]);
    EXPECT_EQ(n % 8, 0u) << name;
    ASSERT_EQ(bytes.size(), 8 + n + 4);
    const std::string header = bytes.substr(8, n);
    EXPECT_EQ(header.find_last_not_of(' '), header.find_last_of('}'));
    EXPECT_EQ(bytes.substr(8 + n), le32f({1.0f}));
  }
}

TEST(SafetensorsTest, ReadsAFileOfTheReferenceLayout) {
  // As the reference writer lays it out: "__metadata__" first, data sorted by offset.
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[1,1],"data_offsets":[8,12]}})";
  const std::string path = raw_file("reference.safetensors", header + "    ", le32f({1, 2, 3}));
  const SafetensorsFile f = exec::read_safetensors(path);
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "b");  // offset order, not name order
  EXPECT_EQ(f.tensors[0].data, (std::vector<float>{1, 2}));
  EXPECT_EQ(f.tensors[1].name, "a");
  EXPECT_EQ(f.tensors[1].shape, (std::vector<std::int64_t>{1, 1}));
  EXPECT_EQ(f.tensors[1].data, (std::vector<float>{3}));
  EXPECT_EQ(f.metadata.at("format"), "pt");
  EXPECT_EQ(exec::parse_safetensors(test_support::slurp(path), "in memory").tensors.size(), 2u);
}

TEST(SafetensorsTest, F16DecodesKnownBitPatterns) {
  EXPECT_EQ(exec::f16_bits_to_float(0x3c00), 1.0f);
  EXPECT_EQ(exec::f16_bits_to_float(0xc000), -2.0f);
  EXPECT_EQ(exec::f16_bits_to_float(0x3555), 0.333251953125f);
  EXPECT_EQ(exec::f16_bits_to_float(0x7bff), 65504.0f);              // the largest finite
  EXPECT_EQ(exec::f16_bits_to_float(0x0400), std::ldexp(1.0f, -14));  // the smallest normal
  EXPECT_EQ(exec::f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));  // the smallest subnormal
  EXPECT_EQ(exec::f16_bits_to_float(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(exec::f16_bits_to_float(0x8001), -std::ldexp(1.0f, -24));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exec::f16_bits_to_float(0x0000)), 0u);
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exec::f16_bits_to_float(0x8000)), 0x80000000u);  // -0
  EXPECT_EQ(exec::f16_bits_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exec::f16_bits_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exec::f16_bits_to_float(0x7e00)));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exec::f16_bits_to_float(0x7c01)), 0x7f802000u);  // payload kept
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exec::f16_bits_to_float(0xfe00)), 0xffc00000u);
}

TEST(SafetensorsTest, F16DecodesEveryFiniteValueByItsDefinition) {
  for (std::uint32_t bits = 0; bits < 0x10000; ++bits) {
    const std::uint32_t exponent = bits >> 10 & 0x1f, mantissa = bits & 0x3ff;
    if (exponent == 0x1f) continue;
    const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
                                           : std::ldexp(1.0 + mantissa / 1024.0, static_cast<int>(exponent) - 15);
    const double expected = (bits & 0x8000) ? -magnitude : magnitude;
    ASSERT_EQ(static_cast<double>(exec::f16_bits_to_float(static_cast<std::uint16_t>(bits))), expected) << bits;
  }
}

TEST(SafetensorsTest, Bf16DecodesKnownBitPatterns) {
  EXPECT_EQ(exec::bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(exec::bf16_bits_to_float(0xc040), -3.0f);
  EXPECT_EQ(exec::bf16_bits_to_float(0x3eab), 0.333984375f);
  EXPECT_EQ(exec::bf16_bits_to_float(0x7f7f), from_bits(0x7f7f0000u));  // the largest finite
  EXPECT_EQ(exec::bf16_bits_to_float(0x0001), std::ldexp(1.0f, -133));   // the smallest subnormal
  EXPECT_EQ(exec::bf16_bits_to_float(0x0080), std::ldexp(1.0f, -126));   // the smallest normal
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exec::bf16_bits_to_float(0x8000)), 0x80000000u);
  EXPECT_EQ(exec::bf16_bits_to_float(0x7f80), std::numeric_limits<float>::infinity());
  EXPECT_EQ(exec::bf16_bits_to_float(0xff80), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(exec::bf16_bits_to_float(0x7fc0)));
  EXPECT_EQ(std::bit_cast<std::uint32_t>(exec::bf16_bits_to_float(0x7f81)), 0x7f810000u);
}

TEST(SafetensorsTest, ReadsF16AndBf16TensorsIntoFp32) {
  const std::string header =
      R"({"h":{"dtype":"F16","shape":[2,2],"data_offsets":[0,8]},)"
      R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
      R"("f":{"dtype":"F32","shape":[1],"data_offsets":[14,18]}})";
  const std::string data = le16s({0x3c00, 0x0001, 0xfc00, 0xc000}) + le16s({0x3f80, 0x0001, 0xff80}) + le32f({0.5f});
  const SafetensorsFile f = exec::read_safetensors(raw_file("halves.safetensors", header, data));
  ASSERT_EQ(f.tensors.size(), 3u);
  EXPECT_EQ(f.tensors[0].name, "h");
  EXPECT_EQ(f.tensors[0].data,
            (std::vector<float>{1.0f, std::ldexp(1.0f, -24), -std::numeric_limits<float>::infinity(), -2.0f}));
  EXPECT_EQ(f.tensors[1].data,
            (std::vector<float>{1.0f, std::ldexp(1.0f, -133), -std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(f.tensors[2].data, (std::vector<float>{0.5f}));
}

TEST(SafetensorsTest, ReadsATensorLargerThanOneReadChunk) {
  SafetensorsFile f;
  NamedTensor big{"big", {3, 200'000}, {}};
  for (int i = 0; i < 600'000; ++i) big.data.push_back(static_cast<float>(i) * 0.25f - 7);
  f.tensors.push_back(std::move(big));
  f.tensors.push_back({"after", {1}, {9}});
  const std::string path = (test_support::scratch_dir() / "big.safetensors").string();
  exec::write_safetensors(path, f);
  const SafetensorsFile read = exec::read_safetensors(path);
  ASSERT_EQ(read.tensors.size(), 2u);
  EXPECT_TRUE(same_bits(read.tensors[0].data, f.tensors[0].data));
  EXPECT_EQ(read.tensors[1].data, (std::vector<float>{9}));
}

TEST(SafetensorsTest, ReadsEveryHalfPrecisionPatternAcrossReadChunks) {
  // Every 16-bit pattern ten times over (1.3 MB per tensor, more than one read chunk), as F16
  // and as BF16: each element decodes as the scalar conversion says, bit for bit.
  std::string bits;
  std::vector<std::uint16_t> patterns;
  for (int r = 0; r < 10; ++r) {
    for (std::uint32_t b = 0; b < 0x10000; ++b) patterns.push_back(static_cast<std::uint16_t>(b));
  }
  for (const std::uint16_t b : patterns) {
    bits += static_cast<char>(b & 0xff);
    bits += static_cast<char>(b >> 8);
  }
  const std::string n = std::to_string(patterns.size()), bytes = std::to_string(bits.size());
  const std::string header = R"({"h":{"dtype":"F16","shape":[)" + n + R"(],"data_offsets":[0,)" + bytes + "]}," +
                             R"("b":{"dtype":"BF16","shape":[)" + n + R"(],"data_offsets":[)" + bytes + "," +
                             std::to_string(2 * bits.size()) + "]}}";
  const SafetensorsFile f = exec::read_safetensors(raw_file("patterns.safetensors", header, bits + bits));
  ASSERT_EQ(f.tensors.size(), 2u);
  ASSERT_EQ(f.tensors[0].data.size(), patterns.size());
  ASSERT_EQ(f.tensors[1].data.size(), patterns.size());
  for (size_t i = 0; i < patterns.size(); ++i) {
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f.tensors[0].data[i]),
              std::bit_cast<std::uint32_t>(exec::f16_bits_to_float(patterns[i])))
        << i;
    ASSERT_EQ(std::bit_cast<std::uint32_t>(f.tensors[1].data[i]), std::uint32_t{patterns[i]} << 16) << i;
  }
}

// ---- refusals ------------------------------------------------------------------------------

TEST(SafetensorsTest, RefusesAFileShorterThanTheLength) {
  const std::string path = test_support::write_file("short.safetensors", "abc");
  const InputError e = refusal(path);
  EXPECT_EQ(e.file(), path);
  EXPECT_EQ(e.field(), "header_length");
}

TEST(SafetensorsTest, RefusesAHeaderLengthBeyondTheFile) {
  const std::string path = test_support::write_file("long.safetensors", le64(1000) + "{}");
  const InputError e = refusal(path);
  EXPECT_EQ(e.field(), "header_length");
  EXPECT_NE(e.message().find("1000 bytes, but only 2"), std::string::npos) << e.what();
}

TEST(SafetensorsTest, RefusesAHeaderLengthOver100MiB) {
  // The length alone is absurd: refused before anything of that size is read or allocated.
  for (const std::uint64_t n : {(100ull << 20) + 1, ~0ull}) {
    const std::string path = test_support::write_file("huge.safetensors", le64(n) + "{}");
    const InputError e = refusal(path);
    EXPECT_EQ(e.field(), "header_length");
    EXPECT_NE(e.message().find("100 MiB"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsTest, RefusesAHeaderThatIsNotJson) { expect_refused("{\"a\": ", "", "header", "not valid JSON"); }

TEST(SafetensorsTest, RefusesAHeaderThatIsNotAnObject) {
  expect_refused("[1, 2]", "", "header", "expected a JSON object");
}

TEST(SafetensorsTest, RefusesAKeyGivenTwice) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"w":{}})", le32f({1}), "header.w",
                 "given twice");
  expect_refused(R"({"w":{"dtype":"F32","dtype":"F32","shape":[1],"data_offsets":[0,4]}})", le32f({1}),
                 "header.w.dtype", "given twice");
}

TEST(SafetensorsTest, RefusesAMissingDtypeShapeOrOffsets) {
  expect_refused(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", le32f({1}), "header.w.dtype", "missing");
  expect_refused(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", le32f({1}), "header.w.shape", "missing");
  expect_refused(R"({"w":{"dtype":"F32","shape":[1]}})", le32f({1}), "header.w.data_offsets", "missing");
  expect_refused(R"({"w":[1]})", le32f({1}), "header.w", "expected an object");
}

TEST(SafetensorsTest, RefusesAnUnknownKeyInATensor) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"stride":[1]}})", le32f({1}),
                 "header.w.stride", "unknown key");
}

TEST(SafetensorsTest, RefusesOtherDtypesByName) {
  expect_refused(R"({"w":{"dtype":"I64","shape":[1],"data_offsets":[0,8]}})", le32f({1, 2}), "header.w.dtype",
                 "I64 is not read");
  expect_refused(R"({"w":{"dtype":"F8_E4M3","shape":[1],"data_offsets":[0,1]}})", "x", "header.w.dtype",
                 "F8_E4M3 is not read");
  expect_refused(R"({"w":{"dtype":"f32","shape":[1],"data_offsets":[0,4]}})", le32f({1}), "header.w.dtype",
                 "unknown dtype \"f32\"");
  expect_refused(R"({"w":{"dtype":32,"shape":[1],"data_offsets":[0,4]}})", le32f({1}), "header.w.dtype",
                 "expected a string");
}

TEST(SafetensorsTest, RefusesANegativeOrNonIntegerShape) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "", "header.w.shape",
                 "dimension 0: -1 is negative");
  expect_refused(R"({"w":{"dtype":"F32","shape":[1,1.5],"data_offsets":[0,4]}})", le32f({1}), "header.w.shape",
                 "dimension 1: expected a non-negative integer");
  expect_refused(R"({"w":{"dtype":"F32","shape":["1"],"data_offsets":[0,4]}})", le32f({1}), "header.w.shape",
                 "expected a non-negative integer");
  expect_refused(R"({"w":{"dtype":"F32","shape":3,"data_offsets":[0,12]}})", le32f({1, 2, 3}), "header.w.shape",
                 "expected an array");
  expect_refused(R"({"w":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", le32f({1}),
                 "header.w.shape", "too large");
}

TEST(SafetensorsTest, RefusesAShapeWhoseElementCountOverflows) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,0],"data_offsets":[0,0]}})", "",
                 "header.w.shape", "overflows");
  // Fits 64 bits as elements, not as bytes.
  expect_refused(R"({"w":{"dtype":"F32","shape":[4611686018427387904],"data_offsets":[0,4]}})", le32f({1}),
                 "header.w.shape", "overflows");
}

TEST(SafetensorsTest, RefusesOffsetsThatAreNotBeginAtMostEnd) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[4,0]}})", le32f({1}), "header.w.data_offsets",
                 "begin is after end");
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", le32f({1}),
                 "header.w.data_offsets", "expected [begin, end]");
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", le32f({1}),
                 "header.w.data_offsets", "begin: -4 is negative");
  expect_refused(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4.0]}})", le32f({1}),
                 "header.w.data_offsets", "end: expected a non-negative integer");
}

TEST(SafetensorsTest, RefusesOffsetsBeyondTheData) {
  expect_refused(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", le32f({1}), "header.w.data_offsets",
                 "ends beyond the 4 bytes of data");
}

TEST(SafetensorsTest, RefusesAByteSizeThatIsNotTheShapes) {
  expect_refused(R"({"w":{"dtype":"F16","shape":[3],"data_offsets":[0,4]}})", le32f({1}), "header.w.data_offsets",
                 "holds 4 bytes, but 3 elements of F16 take 6");
}

TEST(SafetensorsTest, NamesTheTensorInTheField) {
  expect_refused(R"({"transformer.h.0.ln_1.weight":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})",
                 le32f({1}), "header.transformer.h.0.ln_1.weight.data_offsets", "holds 4 bytes");
}

TEST(SafetensorsTest, RefusesOverlappingTensors) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                 le32f({1, 2, 3}), "header.b.data_offsets", "overlaps 'a' at [0, 8]");
  // The same bytes twice.
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                 le32f({1}), "header.b.data_offsets", "overlaps 'a'");
}

TEST(SafetensorsTest, RefusesGapsAndBytesAfterTheLastTensor) {
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
                 le32f({1, 2, 3}), "header.b.data_offsets", "leaves bytes [4, 8)");
  expect_refused(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", le32f({1, 2}), "data",
                 "the tensors cover 4 of the 8 bytes");
}

TEST(SafetensorsTest, RefusesAnEmptyName) {
  expect_refused(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", le32f({1}), "header", "empty name");
}

TEST(SafetensorsTest, RefusesMetadataThatIsNotStrings) {
  expect_refused(R"({"__metadata__":{"step":12}})", "", "header.__metadata__.step", "expected a string");
  expect_refused(R"({"__metadata__":["a"]})", "", "header.__metadata__", "expected an object of strings");
}

TEST(SafetensorsTest, RefusesAMissingFileOrAFolder) {
  const InputError missing = refusal((test_support::scratch_dir() / "absent.safetensors").string());
  EXPECT_EQ(missing.field(), "file");
  EXPECT_NE(missing.message().find("cannot be read"), std::string::npos);
  const InputError folder = refusal(test_support::scratch_dir().string());
  EXPECT_EQ(folder.field(), "file");
  EXPECT_NE(folder.message().find("not a regular file"), std::string::npos);
}

TEST(SafetensorsTest, AcceptsAnEmptyFileOfNoTensors) {
  const SafetensorsFile f = exec::read_safetensors(raw_file("none.safetensors", "{}", ""));
  EXPECT_TRUE(f.tensors.empty());
  EXPECT_TRUE(f.metadata.empty());
}

// ---- the writer ----------------------------------------------------------------------------

TEST(SafetensorsTest, WriterRefusesWhatCannotBeWritten) {
  const std::string path = (test_support::scratch_dir() / "refused-write.safetensors").string();
  auto field_of_refusal = [&](const SafetensorsFile& f) {
    try {
      exec::write_safetensors(path, f);
    } catch (const InputError& e) {
      EXPECT_EQ(e.file(), path);
      return e.field();
    }
    return std::string("written");
  };
  SafetensorsFile f;
  f.tensors = {{"w", {2, 2}, {1, 2, 3}}};
  EXPECT_EQ(field_of_refusal(f), "tensors.w.data");
  f.tensors = {{"w", {-1}, {}}};
  EXPECT_EQ(field_of_refusal(f), "tensors.w.shape");
  f.tensors = {{"", {1}, {1}}};
  EXPECT_EQ(field_of_refusal(f), "tensors");
  f.tensors = {{"w", {1}, {1}}, {"w", {1}, {2}}};
  EXPECT_EQ(field_of_refusal(f), "tensors.w");
  f.tensors = {{"__metadata__", {1}, {1}}};
  EXPECT_EQ(field_of_refusal(f), "tensors.__metadata__");
  f.tensors = {{"\xff\xfe", {1}, {1}}};
  EXPECT_EQ(field_of_refusal(f), "tensors");
  EXPECT_FALSE(fs::exists(path));
}

TEST(SafetensorsTest, AFailedWriteLeavesNoFileBehind) {
  const fs::path dir = test_support::scratch_dir() / "failed-writes";
  fs::create_directories(dir / "a-folder");
  // The target exists as a folder: the rename fails after every byte was written.
  const SafetensorsFile f = sample();
  EXPECT_THROW(exec::write_safetensors((dir / "a-folder").string(), f), InputError);
  // A folder that does not exist: nothing can be created.
  EXPECT_THROW(exec::write_safetensors((dir / "absent" / "w.safetensors").string(), f), InputError);
  std::vector<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir)) left.push_back(entry.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"a-folder"});

  // A refused write leaves the file that was there as it was.
  const std::string path = (dir / "kept.safetensors").string();
  exec::write_safetensors(path, f);
  const std::string before = test_support::slurp(path);
  SafetensorsFile bad;
  bad.tensors = {{"w", {2}, {1}}};
  EXPECT_THROW(exec::write_safetensors(path, bad), InputError);
  EXPECT_EQ(test_support::slurp(path), before);
}
