// Fuzz target: the network reader (model::parse_network, YAML or JSON: explicit layers or a
// zoo reference). An accepted network of up to 2,000 layers is written back
// (model::write_network, every layer explicit) and must read back equal.
#include "model/io.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "network.yaml";
  model::Network network;
  try {
    network = model::parse_network(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  // yaml-cpp writes and reads about 1 MB/s (~0.7 ms a layer): a zoo spec of 100,000 layers
  // is read at once but would take a minute to round-trip, so larger networks are not.
  if (network.layers.size() > 2'000) return 0;
  FUZZ_CHECK(model::parse_network(model::write_network(network), "written.yaml") == network);
  return 0;
}
