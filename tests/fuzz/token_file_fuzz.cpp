// Fuzz target: the llm.c token file reader (exec::parse_token_file, which TokenFile runs over
// a file's bytes: GPT-2's uint16 layout and LLaMA 3's uint32 one) and the batches read from
// what it accepts. Header int 3, which the format leaves unused, picks the vocabulary (its
// low 24 bits; 0: GPT-2's 50257) and int 4 the batch shape, so that the fuzzer reaches
// the vocabulary check and the dataloader's wrap. Accepted tokens written back must read
// back equal; every batch must be B*T consecutive tokens and their successors.
#include "exec/token_data.hpp"
#include "tests/fuzz/fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetflow;
  const std::string bytes = fuzz::text_of(data, size);
  const std::string file = "tokens.bin";
  const int vocab_field = size >= 16 ? data[12] | data[13] << 8 | data[14] << 16 : 0;
  const int vocab = vocab_field == 0 ? 50257 : vocab_field;
  std::vector<std::uint32_t> tokens;
  exec::TokenFormat format{};
  try {
    tokens = exec::parse_token_file(bytes, file, vocab, &format);
  } catch (const InputError& e) {
    fuzz::check_refusal(e, file, bytes);
    return 0;
  }
  const std::vector<int> as_ints(tokens.begin(), tokens.end());
  // Written back in its format: the same magic, version, count and token bytes.
  const std::string written = exec::encode_token_file(as_ints, "written.bin", format);
  FUZZ_CHECK(written.substr(0, 12) == bytes.substr(0, 12) && written.substr(1024) == bytes.substr(1024));
  FUZZ_CHECK(exec::parse_token_file(exec::encode_token_file(as_ints, "written.bin", format), "written.bin", vocab) == tokens);

  const exec::TokenFile source(tokens, vocab, file);
  const int B = 1 + data[16] % 4, T = 1 + data[17] % 16;
  const long long bt = static_cast<long long>(B) * T;
  for (long long step = 0; step < 8; ++step) {
    exec::Batch batch;
    try {
      batch = source.batch(step, B, T);
    } catch (const InputError& e) {
      FUZZ_CHECK(static_cast<long long>(tokens.size()) < bt + 1 && e.field() == "tokens");
      return 0;
    }
    const long long p = source.position(step, B, T);
    FUZZ_CHECK(p >= 0 && p % bt == 0 && p + bt + 1 <= static_cast<long long>(tokens.size()));
    FUZZ_CHECK(batch.inputs.size() == static_cast<size_t>(bt) && batch.targets.size() == static_cast<size_t>(bt));
    for (long long k = 0; k < bt; ++k) {
      FUZZ_CHECK(static_cast<std::uint32_t>(batch.inputs[static_cast<size_t>(k)]) == tokens[static_cast<size_t>(p + k)]);
      FUZZ_CHECK(static_cast<std::uint32_t>(batch.targets[static_cast<size_t>(k)]) == tokens[static_cast<size_t>(p + k + 1)]);
    }
  }
  return 0;
}
