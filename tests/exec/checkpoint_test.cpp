// A sharded HuggingFace checkpoint reads as the one file it was split from; an index that
// does not describe its shards is refused, naming the index or the shard.
#include "exec/checkpoint.hpp"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "exec_test_util.hpp"
#include "model/error.hpp"

namespace hetflow {
namespace {

namespace fs = std::filesystem;

exec::NamedTensor tensor(std::string name, std::vector<std::int64_t> shape, float first) {
  exec::NamedTensor t{std::move(name), std::move(shape), {}};
  size_t n = 1;
  for (const auto d : t.shape) n *= static_cast<size_t>(d);
  for (size_t i = 0; i < n; ++i) t.data.push_back(first + static_cast<float>(i) / 8);
  return t;
}

// model-00001-of-00002 holds a and b, model-00002-of-00002 holds c; `index` is the
// weight_map's JSON text.
fs::path sharded(const std::string& name, const std::string& index) {
  const fs::path dir = fs::path(testing::TempDir()) / ("checkpoint_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  exec::SafetensorsFile one, two;
  one.tensors = {tensor("a", {2, 3}, 1), tensor("b", {4}, -2)};
  two.tensors = {tensor("c", {3, 1}, 5)};
  exec::write_safetensors((dir / "model-00001-of-00002.safetensors").string(), one);
  exec::write_safetensors((dir / "model-00002-of-00002.safetensors").string(), two);
  std::ofstream(dir / "model.safetensors.index.json") << R"({"metadata": {"total_size": 52}, "weight_map": )" << index << "}";
  return dir;
}

const char* kIndex = R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors",
                        "b": "model-00001-of-00002.safetensors"})";

// The field and a part of the message of the InputError that reading `path` throws.
std::pair<std::string, std::string> refusal(const fs::path& path) {
  try {
    exec::read_checkpoint(path.string());
  } catch (const InputError& e) {
    return {e.field(), e.what()};
  }
  return {"(read)", ""};
}

TEST(Checkpoint, ShardsReadAsTheFileTheyWereSplitFrom) {
  const fs::path dir = sharded("whole", kIndex);
  for (const fs::path& path : {dir, dir / "model.safetensors.index.json"}) {
    const exec::SafetensorsFile got = exec::read_checkpoint(path.string());
    ASSERT_EQ(got.tensors.size(), 3u) << path;
    EXPECT_EQ(got.tensors[0].name, "a");  // shard by shard, each in its own order
    EXPECT_EQ(got.tensors[1].name, "b");
    EXPECT_EQ(got.tensors[2].name, "c");
    EXPECT_EQ(got.tensors[2].shape, (std::vector<std::int64_t>{3, 1}));
    EXPECT_EQ(got.tensors[2].data, tensor("c", {3, 1}, 5).data);
  }
  // A directory with one model.safetensors, and the file itself.
  const fs::path single = fs::path(testing::TempDir()) / "checkpoint_single";
  fs::create_directories(single);
  exec::SafetensorsFile one;
  one.tensors = {tensor("w", {5}, 3)};
  exec::write_safetensors((single / "model.safetensors").string(), one);
  EXPECT_EQ(exec::read_checkpoint(single.string()).tensors[0].data, one.tensors[0].data);
  EXPECT_EQ(exec::read_checkpoint((single / "model.safetensors").string()).tensors[0].data, one.tensors[0].data);
}

TEST(Checkpoint, AnIndexThatDoesNotDescribeItsShardsIsRefused) {
  struct Case {
    const char* name;
    std::string index;
    const char* field;
    const char* says;
  };
  for (const Case& c : std::vector<Case>{
           {"unnamed_tensor", R"({"a": "model-00001-of-00002.safetensors", "c": "model-00002-of-00002.safetensors"})",
            "header.b", "is a tensor of this shard that the index"},
           {"extra_tensor",
            R"({"a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                "c": "model-00002-of-00002.safetensors", "d": "model-00002-of-00002.safetensors"})",
            "weight_map.d", "model-00002-of-00002.safetensors does not hold"},
           {"wrong_shard",
            R"({"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
                "c": "model-00002-of-00002.safetensors"})",
            "weight_map.b", "places it in model-00002-of-00002.safetensors, but it is in model-00001-of-00002"},
           {"absent_shard", R"({"a": "model-00001-of-00003.safetensors"})", "weight_map", "not a file beside it"},
           {"outside", R"({"a": "../elsewhere.safetensors"})", "weight_map.a", "a file beside the index"},
           {"not_a_name", R"({"a": 7})", "weight_map.a", "expected a shard file name"},
           {"itself", R"({"a": "model.safetensors.index.json"})", "weight_map.a", "names the index itself"},
           {"nul", R"({"a": "model-00001-of-00002.safetensors\u0000x"})", "weight_map.a", "a file beside the index"},
           {"too_long", R"({"a": ")" + std::string(300, 'x') + R"(.safetensors"})", "weight_map", "not a file beside it"},
           {"empty", R"({})", "weight_map", "an empty one"},
           {"not_an_object", R"([1])", "weight_map", "found an array"},
       }) {
    const auto [field, what] = refusal(sharded(c.name, c.index));
    EXPECT_EQ(field, c.field) << c.name << ": " << what;
    EXPECT_NE(what.find(c.says), std::string::npos) << c.name << ": " << what;
  }
  // The line of the entry at fault, in an index written as transformers writes one.
  const fs::path pretty = sharded("pretty", "{\n    \"a\": \"model-00001-of-00002.safetensors\",\n"
                                            "    \"b\": \"model-00002-of-00002.safetensors\",\n"
                                            "    \"c\": \"model-00002-of-00002.safetensors\"\n  }");
  try {
    exec::read_checkpoint(pretty.string());
    ADD_FAILURE() << "read";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "weight_map.b");
    EXPECT_EQ(e.line(), 3) << e.what();
  }
  // A FIFO in place of the index is refused, not waited on.
  const fs::path fifo_dir = sharded("fifo", kIndex);
  fs::remove(fifo_dir / "model.safetensors.index.json");
  ASSERT_EQ(::mkfifo((fifo_dir / "model.safetensors.index.json").c_str(), 0600), 0);
  EXPECT_NE(refusal(fifo_dir / "model.safetensors.index.json").second.find("not a regular file"), std::string::npos);
  // Not JSON: the index and its line.
  const fs::path dir = sharded("syntax", kIndex);
  std::ofstream(dir / "model.safetensors.index.json") << "{\n  \"weight_map\": {\"a\": }\n}";
  const auto [field, what] = refusal(dir);
  EXPECT_NE(what.find("model.safetensors.index.json:2:"), std::string::npos) << what;
  // A shard that is not safetensors: the shard's own error.
  const fs::path broken = sharded("broken_shard", kIndex);
  std::ofstream(broken / "model-00002-of-00002.safetensors") << "not safetensors";
  EXPECT_NE(refusal(broken).second.find("model-00002-of-00002.safetensors"), std::string::npos);
  // A directory with neither file.
  const fs::path empty = fs::path(testing::TempDir()) / "checkpoint_no_weights";
  fs::remove_all(empty);
  fs::create_directories(empty);
  EXPECT_NE(refusal(empty).second.find("is a directory holding neither model.safetensors nor model.safetensors.index.json"),
            std::string::npos);
}

}  // namespace
}  // namespace hetflow
