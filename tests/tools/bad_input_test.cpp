// Table-driven: every kind of bad input gets "file:line: field: what was expected, what was
// found" on stderr and exit status 2 — never a crash, never a silently wrong number.
#include <gtest/gtest.h>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::write_file;

namespace {

struct BadInput {
  const char* name;
  const char* option;  // --cluster or --model
  const char* text;    // file content
  const char* where;   // expected "line: field" right after the file name
  const char* says;    // expected part of the message
};

const BadInput kCases[] = {
    {"yaml_syntax", "--cluster", "nodes: [\n  - {name: n\n", ":2: syntax", "not valid YAML"},
    {"unknown_gpu", "--cluster", "nodes:\n  - {name: n, gpu: V10, gpus: 4}\n", ":2: nodes[0].gpu",
     "unknown GPU type 'V10'; nearest known: V100-16"},
    {"zero_gpus", "--cluster", "nodes:\n  - {name: n, gpu: V100-16, gpus: 0}\n", ":2: nodes[0].gpus",
     "expected a positive whole number, found 0"},
    {"negative_gpus", "--cluster", "nodes:\n  - {name: n, gpu: V100-16, gpus: -2}\n", ":2: nodes[0].gpus",
     "expected a positive whole number, found -2"},
    {"empty_cluster", "--cluster", "name: nothing\nnodes: []\n", ":2: nodes", "expected a non-empty list of nodes"},
    {"missing_nodes", "--cluster", "name: nothing\n", ":1: nodes", "is required but missing"},
    {"bad_unit", "--cluster",
     "nodes:\n  - name: n\n    gpu: V100-16\n    gpus: 2\n    intra: {bandwidth: 25 parsecs}\n",
     ":5: nodes[0].intra.bandwidth", "unknown unit 'parsecs'"},
    {"size_without_per_second", "--cluster",
     "nodes:\n  - name: n\n    gpu: V100-16\n    gpus: 2\n    intra: {bandwidth: 25 GB}\n",
     ":5: nodes[0].intra.bandwidth", "expected a bandwidth"},
    {"zero_bandwidth", "--cluster",
     "nodes:\n  - {name: a, gpu: T4, gpus: 1, nic: {bandwidth: 0 Gb/s}}\n  - {name: b, gpu: T4, gpus: 1}\n",
     ":2: nodes[0].nic.bandwidth", "expected a positive quantity"},
    {"misspelt_key", "--cluster", "nodes:\n  - {name: n, gpu: V100-16, gpus: 4, nics: {bandwidth: 1 Gb/s}}\n",
     ":2: nodes[0].nics", "unknown key; expected one of the known keys, nearest: nic"},
    {"duplicate_node", "--cluster",
     "nodes:\n  - {name: n, gpu: T4, gpus: 1, nic: {bandwidth: 1 Gb/s}}\n"
     "  - {name: n, gpu: T4, gpus: 1, nic: {bandwidth: 1 Gb/s}}\n",
     ":3: nodes[1].name", "duplicate node name 'n'"},
    {"multi_node_without_nic", "--cluster", "nodes:\n  - {name: n, count: 2, gpu: T4, gpus: 1}\n", ":2: nodes[0].nic",
     "needs a NIC"},
    {"unknown_region", "--cluster", "nodes:\n  - {name: n, gpu: T4, gpus: 1, region: mars}\n", ":2: nodes[0].region",
     "unknown region 'mars'"},
    {"disconnected_regions", "--cluster",
     "regions:\n  - {name: a}\n  - {name: b}\nnodes:\n  - {name: n, gpu: T4, gpus: 1, region: a, nic: {bandwidth: 1 Gb/s}}\n"
     "  - {name: m, gpu: T4, gpus: 1, region: b, nic: {bandwidth: 1 Gb/s}}\n",
     ":2: wan", "region 'b' is not connected"},
    {"duplicate_key", "--cluster", "nodes:\n  - {name: n, gpu: T4, gpus: 1,\n     gpus: 8}\n", ":3: nodes[0].gpus",
     "appears twice in one mapping; give it once"},
    {"not_a_mapping", "--cluster", "- just\n- a list\n", ":1: document", "expected a mapping"},
    {"custom_gpu_missing_field", "--cluster",
     "gpu_types:\n  - {name: X, fp16: 1 TFLOP/s, memory: 1 GiB, memory_bandwidth: 1 GB/s}\nnodes:\n  - {name: n, gpu: X, gpus: 1}\n",
     ":2: gpu_types[0].fp32", "is required but missing"},
    {"layer_bad_input_index", "--model",
     "layers:\n  - {name: a, forward_flops: 1, output_elems: 1}\n  - {name: b, forward_flops: 1, output_elems: 1, inputs: [5]}\n",
     ":3: layers[1].inputs", "expected the index of an earlier layer"},
    {"layer_negative_flops", "--model", "layers:\n  - {name: a, forward_flops: -1, output_elems: 1}\n",
     ":2: layers[0].forward_flops", "expected a number >= 0"},
    {"layer_zero_output", "--model", "layers:\n  - {name: a, forward_flops: 1, output_elems: 0}\n",
     ":2: layers[0].output_elems", "expected a number > 0"},
    {"unknown_precision", "--model", "precision: fp8\nzoo: gpt2-xl\n", ":1: precision",
     "expected one of fp32, fp16, bf16, found 'fp8'"},
    {"unknown_zoo_name", "--model", "zoo: gpt5\n", ":1: zoo", "unknown network"},
    {"hf_config_bad_value", "--model", R"({"model_type": "llama", "num_hidden_layers": "many"})",
     ": num_hidden_layers", "expected an integer"},
    {"hf_config_syntax", "--model", "{\"model_type\": \"llama\",\n \"num_hidden_layers\": }", ":2: json",
     "not valid JSON at column 23: syntax error while parsing value"},
    {"hf_config_number_overflow", "--model", R"({"model_type": "llama", "num_hidden_layers": 1e400})", ": json",
     "not valid JSON: number overflow parsing '1e400'"},
    {"hf_config_bad_heads", "--model",
     R"({"model_type": "gpt2", "n_layer": 2, "n_embd": 100, "n_head": 3})", ": heads",
     "expected a divisor of hidden=100"},
};

// Readable test names in gtest's output instead of a byte dump.
void PrintTo(const BadInput& c, std::ostream* os) { *os << c.name; }

}  // namespace

class BadInputTest : public ::testing::TestWithParam<BadInput> {};

TEST_P(BadInputTest, ClearMessageAndExitStatus2) {
  const BadInput& c = GetParam();
  const std::string path = write_file(std::string(c.name) + (c.text[0] == '{' ? ".json" : ".yaml"), c.text);
  const auto r = run_hetflow(std::string("describe ") + c.option + " " + path);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("hetflow: " + path + c.where + ": "), std::string::npos)
      << "expected '" << path << c.where << "' in: " << r.err;
  EXPECT_NE(r.err.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << r.err;
  EXPECT_TRUE(r.out.empty()) << r.out;
}

INSTANTIATE_TEST_SUITE_P(Files, BadInputTest, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// Checks made once the whole file is read (a NIC needed because there is a second node, a
// GPU type the cluster lacks) still name the line of the entry they blame.
TEST(BadCommandLine, ChecksAfterReadingNameTheEntrysLine) {
  const std::string cluster = write_file("late_nic.yaml", "name: two\nnodes:\n  - {name: a, gpu: T4, gpus: 1, nic: "
                                                          "{bandwidth: 1 Gb/s}}\n  - {name: b, gpu: T4, gpus: 1}\n");
  auto r = run_hetflow("describe --cluster " + cluster);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find(cluster + ":4: nodes[1].nic: a node of a multi-node cluster needs a NIC"), std::string::npos)
      << r.err;
  const std::string calibration =
      write_file("unknown_gpu.yaml", "default_gpu: {max_efficiency: 0.5}\ngpus:\n  V100-16: {max_efficiency: 0.5}\n"
                                     "  Z100: {max_efficiency: 0.5}\n");
  r = run_hetflow("simulate --cluster cpu-2 --model gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256 --calibration " +
                  calibration);
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find(calibration + ":4: gpus.Z100: unknown GPU type 'Z100'"), std::string::npos) << r.err;
}

TEST(BadCommandLine, UnknownOptionsAndNamesExit2) {
  auto r = run_hetflow("describe --clutser x");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("unrecognised option '--clutser'"), std::string::npos) << r.err;
  r = run_hetflow("describe --cluster dgx-a100");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("nearest built-in: dgx-a100-x4"), std::string::npos) << r.err;
  r = run_hetflow("describe --model gpt3-175");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("gpt3-175b"), std::string::npos) << r.err;
  r = run_hetflow("describe --precision fp8");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("--precision: expected one of fp32, fp16, bf16"), std::string::npos) << r.err;
  r = run_hetflow("frobnicate");
  EXPECT_EQ(r.status, 2);
  r = run_hetflow("describe --cluster /nonexistent/c.yaml");
  EXPECT_EQ(r.status, 2);
}
