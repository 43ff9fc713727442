// A HuggingFace model folder, as downloaded (config.json, tokenizer files; weights or not),
// given to --model as it is; and the sequence length such a config gives said for what it is.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;

namespace {

// Llama 3.2 1B's config.json as released (meta-llama/Llama-3.2-1B), with tokenizer files
// beside it and no weights.
const char* kLlama32Config = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256
})";

std::string model_folder() {
  const auto dir = scratch_dir() / "Llama-3.2-1B";
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << kLlama32Config;
  std::ofstream(dir / "tokenizer.json") << R"({"version": "1.0", "model": {"type": "BPE"}})";
  std::ofstream(dir / "tokenizer_config.json") << R"({"model_max_length": 131072})";
  std::ofstream(dir / "generation_config.json") << R"({"bos_token_id": 128000})";
  return dir.string();
}

nlohmann::json describe_json(const std::string& args) {
  const auto r = run_hetflow("describe --cluster cpu-4 " + args + " --json");
  EXPECT_EQ(r.status, 0) << args << ": " << r.err;
  return r.status == 0 ? nlohmann::json::parse(r.out) : nlohmann::json();
}

}  // namespace

// The folder reads as its config.json does, and at the zoo's sequence length it is the zoo's
// Llama 3.2 1B, built independently from the published architecture.
TEST(ModelFolder, ReadsTheFoldersConfigJson) {
  const std::string folder = model_folder();
  const auto zoo = describe_json("--model llama3.2-1b");
  const auto from_folder = describe_json("--model " + folder + " --seq-length 8192");
  const auto from_file = describe_json("--model " + folder + "/config.json --seq-length 8192");
  ASSERT_FALSE(zoo.is_null());
  ASSERT_FALSE(from_folder.is_null());
  EXPECT_EQ(from_folder["network"]["params"], zoo["network"]["params"]);
  EXPECT_EQ(from_folder["network"]["forward_flops_per_sample"], zoo["network"]["forward_flops_per_sample"]);
  EXPECT_EQ(from_folder["network"]["params"], from_file["network"]["params"]);
  EXPECT_EQ(from_folder["network"]["name"], "llama(Llama-3.2-1B) (seq 8192)");
}

// 131,072 tokens from max_position_embeddings is the longest context, not a training length:
// said so, with the option that sets it; not said once --seq-length is given.
TEST(ModelFolder, SequenceLengthFromMaxPositionEmbeddingsIsSaidSo) {
  const std::string folder = model_folder();
  auto r = run_hetflow("describe --cluster cpu-4 --model " + folder);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err,
            "hetflow: note: llama(Llama-3.2-1B): 131072 tokens per sample, the config's max_position_embeddings (the "
            "longest context it supports); --seq-length sets the length you train at (e.g. --seq-length 2048)\n");
  r = run_hetflow("describe --cluster cpu-4 --model " + folder + " --seq-length 2048");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
  // GPT-2's n_positions is the length it was trained at: nothing to say.
  const auto gpt2 = scratch_dir() / "gpt2";
  std::filesystem::create_directories(gpt2);
  std::ofstream(gpt2 / "config.json") << R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "n_positions": 128, "vocab_size": 256})";
  r = run_hetflow("describe --cluster cpu-4 --model " + gpt2.string());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST(ModelFolder, AFolderWithoutConfigJsonIsRefused) {
  const auto empty = scratch_dir() / "weights-only";
  std::filesystem::create_directories(empty);
  const auto r = run_hetflow("describe --model " + empty.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: " + empty.string() +
                       ": model: is a folder without a config.json; expected a HuggingFace model folder (config.json, "
                       "tokenizer files, weights) or a network file\n");
}

namespace {
// A Llama 3.2 1B folder whose tokenizer_config.json says `tokenizer_config` and whose
// config.json lacks the keys in `drop`.
std::string folder_with_tokenizer(const std::string& name, const std::string& tokenizer_config,
                                  const std::vector<std::string>& drop = {}) {
  const auto dir = scratch_dir() / name;
  std::filesystem::create_directories(dir);
  auto config = nlohmann::json::parse(kLlama32Config);
  for (const std::string& key : drop) config.erase(key);
  std::ofstream(dir / "config.json") << config.dump();
  std::ofstream(dir / "tokenizer_config.json") << tokenizer_config;
  return dir.string();
}

nlohmann::json::number_integer_t forward_flops(const nlohmann::json& describe) {
  return describe["network"]["forward_flops_per_sample"].get<nlohmann::json::number_integer_t>();
}
}  // namespace

// As transformers' tokenizer truncates there, the tokenizer's model_max_length is an upper
// bound on the length trained: below max_position_embeddings it is the length planned, said
// so with where it came from and the option; the oracle is the same folder at --seq-length.
TEST(ModelFolder, TheTokenizersModelMaxLengthCapsTheSequenceLength) {
  const std::string folder = folder_with_tokenizer("Llama-tok-2048", R"({"model_max_length": 2048})");
  const auto r = run_hetflow("describe --cluster cpu-4 --model " + folder);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "hetflow: note: llama(Llama-tok-2048): 2048 tokens per sample, model_max_length in " + folder +
                       "/tokenizer_config.json (the longest input its tokenizer makes; the config's "
                       "max_position_embeddings is 131072); --seq-length sets the length you train at\n");
  const auto capped = describe_json("--model " + folder);
  const auto at_2048 = describe_json("--model " + folder + " --seq-length 2048");
  ASSERT_FALSE(capped.is_null());
  EXPECT_EQ(forward_flops(capped), forward_flops(at_2048));
  EXPECT_EQ(capped["network"]["params"], at_2048["network"]["params"]);
  // Asked for more than the tokenizer makes: planned as asked, and said.
  const auto longer = run_hetflow("describe --cluster cpu-4 --model " + folder + " --seq-length 8192");
  EXPECT_EQ(longer.status, 0) << longer.err;
  EXPECT_EQ(longer.err, "hetflow: note: --seq-length 8192 is above model_max_length 2048 in " + folder +
                            "/tokenizer_config.json: the model's tokenizer makes no input that long\n");
}

// Without max_position_embeddings the config's length is the model type's default (LlamaConfig:
// 2048); the tokenizer's limit is the better word, and is taken. transformers' "no limit"
// (VERY_LARGE_INTEGER, int(1e30)) caps nothing; a limit that is not a number is refused.
TEST(ModelFolder, TheTokenizerGivesTheLengthTheConfigDoesNot) {
  const std::string folder =
      folder_with_tokenizer("Llama-no-positions", R"({"model_max_length": 4096})", {"max_position_embeddings"});
  const auto r = run_hetflow("describe --cluster cpu-4 --model " + folder);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "hetflow: note: llama(Llama-no-positions): 4096 tokens per sample, model_max_length in " + folder +
                       "/tokenizer_config.json (the longest input its tokenizer makes; the default of its model_type "
                       "is 2048); --seq-length sets the length you train at\n");
  EXPECT_EQ(forward_flops(describe_json("--model " + folder)),
            forward_flops(describe_json("--model " + folder + " --seq-length 4096")));

  const std::string unlimited =
      folder_with_tokenizer("Llama-no-limit", R"({"model_max_length": 1000000000000000019884624838656})");
  const auto u = run_hetflow("describe --cluster cpu-4 --model " + unlimited);
  EXPECT_EQ(u.status, 0) << u.err;
  EXPECT_EQ(u.err, "hetflow: note: llama(Llama-no-limit): 131072 tokens per sample, the config's max_position_embeddings "
                   "(the longest context it supports); --seq-length sets the length you train at (e.g. --seq-length "
                   "2048)\n");

  const std::string bad = folder_with_tokenizer("Llama-bad-limit", R"({"model_max_length": "long"})");
  const auto b = run_hetflow("describe --cluster cpu-4 --model " + bad);
  EXPECT_EQ(b.status, 2);
  EXPECT_EQ(b.err, "hetflow: " + bad + "/tokenizer_config.json: model_max_length: expected a whole number of tokens > 0, "
                   "found \"long\"\n");
}
