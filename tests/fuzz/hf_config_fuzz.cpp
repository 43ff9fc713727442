// Fuzz target: the HuggingFace config.json reader (model::transformer_from_hf_config), and
// the decoder it describes built as `--model config.json` builds it.
#include "model/zoo.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string text = fuzz::text_of(data, size);
  const std::string file = "config.json";
  model::TransformerConfig config;
  try {
    config = model::transformer_from_hf_config(text, file);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, text);
    return 0;
  }
  const model::Network network = model::make_transformer(config, model::Precision::fp16);
  FUZZ_CHECK(!network.layers.empty() && network.training_flops_per_sample() > 0);
  return 0;
}
