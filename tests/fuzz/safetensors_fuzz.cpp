// Fuzz target: the safetensors reader (exec::parse_safetensors, which read_safetensors runs
// over a file's bytes). An accepted file is written back (as F32) and must read back bitwise
// equal: names, shapes, order, values (NaN payloads included) and metadata.
#include <cstring>

#include "exec/safetensors.hpp"
#include "tests/fuzz/fuzz_check.hpp"

namespace {

bool same(const hetflow::exec::SafetensorsFile& a, const hetflow::exec::SafetensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const auto &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.shape != y.shape || x.data.size() != y.data.size()) return false;
    // memcmp of no bytes may still not be given an empty vector's null pointer.
    if (!x.data.empty() && std::memcmp(x.data.data(), y.data.data(), x.data.size() * sizeof(float)) != 0) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string bytes = fuzz::text_of(data, size);
  const std::string file = "model.safetensors";
  exec::SafetensorsFile contents;
  try {
    contents = exec::parse_safetensors(bytes, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, bytes);
    return 0;
  }
  const std::string written = exec::encode_safetensors(contents, "written.safetensors");
  FUZZ_CHECK(same(exec::parse_safetensors(written, "written.safetensors"), contents));
  return 0;
}
