// Fuzz target: a sharded checkpoint's index (exec::parse_safetensors_index), as
// --init-weights reads model.safetensors.index.json before it opens any shard.
#include <set>

#include "exec/checkpoint.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "model.safetensors.index.json";
  exec::SafetensorsIndex index;
  try {
    index = exec::parse_safetensors_index(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  // Every shard a plain file name, named once, and every tensor mapped to one of them.
  FUZZ_CHECK(!index.weight_map.empty() && !index.shards.empty());
  const std::set<std::string> shards(index.shards.begin(), index.shards.end());
  FUZZ_CHECK(shards.size() == index.shards.size());
  for (const auto& [tensor, shard] : index.weight_map) {
    FUZZ_CHECK(!tensor.empty() && shards.count(shard) == 1 && shard.find('/') == std::string::npos && shard != "..");
  }
  return 0;
}
