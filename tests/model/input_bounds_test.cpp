// Numbers are checked where they enter: integers as 64 bits and range-checked, quantities
// finite after their unit is applied and within what the simulator's physics can take,
// names that match nothing refused with the nearest known ones (model/limits.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "model/calibration.hpp"
#include "model/error.hpp"
#include "model/io.hpp"
#include "model/limits.hpp"
#include "model/units.hpp"
#include "model/zoo.hpp"

using namespace hetflow::model;
using hetflow::InputError;

namespace {

// "line: field: message" of the InputError `f` throws, or "no error".
template <typename F>
std::string error_of(F f) {
  try {
    f();
  } catch (const InputError& e) {
    return std::to_string(e.line()) + ": " + e.field() + ": " + e.message();
  }
  return "no error";
}

std::string cluster_error(const std::string& yaml) {
  return error_of([&] { parse_cluster(yaml, "c.yaml"); });
}

std::string hf_error(const std::string& json) {
  return error_of([&] { transformer_from_hf_config(json, "config.json"); });
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

const std::string kOneNode = "nodes:\n  - {name: n, gpu: T4, gpus: 1";

}  // namespace

TEST(InputBounds, QuantitiesAreFiniteAfterTheirUnit) {
  EXPECT_THROW(units::parse_time_s("1e308 min"), std::invalid_argument);
  EXPECT_THROW(units::parse_bytes("1e308 TiB"), std::invalid_argument);
  EXPECT_THROW(units::parse_bandwidth_bytes_per_s("1e308 TB/s"), std::invalid_argument);
  EXPECT_THROW(units::parse_flops_per_s("1e307 EFLOP/s"), std::invalid_argument);
  EXPECT_THROW(units::parse_bytes("-1e308 TB"), std::invalid_argument);
  EXPECT_DOUBLE_EQ(units::parse_time_s("1e300 min"), 6e301);  // large, but finite
  try {
    units::parse_time_s("1e308 min");
  } catch (const std::invalid_argument& e) {
    EXPECT_TRUE(contains(e.what(), "expected a finite quantity, found '1e308 min'")) << e.what();
  }
}

TEST(InputBounds, ClusterCountsAreRangeChecked) {
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", count: 2147483647}\n"),
                       "2: nodes[0].count: expected a whole number between 1 and 100000, found 2147483647"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", count: 4294967297}\n"), "nodes[0].count: expected a whole number"));
  EXPECT_TRUE(contains(cluster_error("nodes:\n  - {name: n, gpu: T4, gpus: 99999999999}\n"),
                       "nodes[0].gpus: expected a whole number between 1 and 1024"));
  // More GPUs in all than hetflow models: refused before the nodes are expanded.
  EXPECT_TRUE(contains(cluster_error("nodes:\n  - {name: a, count: 100000, gpu: T4, gpus: 1000, nic: {bandwidth: 1 Gb/s}}\n"),
                       "nodes[0].count: the cluster would have more than"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {count: 1000, bandwidth: 1 Gb/s}}\n"),
                       "nodes[0].nic.count: expected a whole number between 1 and 64"));
}

TEST(InputBounds, ClusterPhysicsIsWhatTheSimulatorCanTake) {
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 5e-324 B/s}}\n"),
                       "nodes[0].nic.bandwidth: expected a quantity between 1 B/s and"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 1e300 Gb/s}}\n"), "nodes[0].nic.bandwidth"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 1 Gb/s, latency: 1e308 min}}\n"),
                       "nodes[0].nic.latency: expected a finite quantity"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 1 Gb/s, latency: 2 min}}\n"), "no error"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 1 Gb/s, latency: 2 d}}\n"), "unknown unit 'd'"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 1 Gb/s, latency: 1e-300 s}}\n"),
                       "nodes[0].nic.latency: expected 0 or a quantity between 1e-12 s and 86400 s"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {bandwidth: 1 Gb/s, latency: 0 s}}\n"), "no error"));
  EXPECT_TRUE(contains(cluster_error("fabric: {latency: 2000 min}\n" + kOneNode + "}\n"), "1: fabric.latency"));
  EXPECT_TRUE(contains(cluster_error("fabric: {kind: fat-tree, nodes_per_leaf: 2, oversubscription: 1e300}\n" +
                                     kOneNode + "}\n"),
                       "fabric.oversubscription: expected a number <= 1000000"));
  const std::string gpu = "gpu_types:\n  - {name: X, fp16: 1e-300 TFLOP/s, fp32: 1 TFLOP/s, memory: 1 GiB, "
                          "memory_bandwidth: 1 GB/s}\nnodes:\n  - {name: n, gpu: X, gpus: 1}\n";
  EXPECT_TRUE(contains(cluster_error(gpu), "2: gpu_types[0].fp16: expected a quantity between 1 MFLOP/s and")) << cluster_error(gpu);
}

TEST(InputBounds, DuplicateWanLinksAndComplexKeysAreRefused) {
  const std::string regions = "regions: [{name: us}, {name: eu}]\nnodes:\n"
                              "  - {name: a, region: us, gpu: T4, gpus: 1, nic: {bandwidth: 1 Gb/s}}\n"
                              "  - {name: b, region: eu, gpu: T4, gpus: 1, nic: {bandwidth: 1 Gb/s}}\n";
  EXPECT_TRUE(contains(cluster_error(regions + "wan:\n  - {between: [us, eu], bandwidth: 1 Gb/s}\n"
                                               "  - {between: [eu, us], bandwidth: 2 Gb/s}\n"),
                       "7: wan[1].between: regions 'eu' and 'us' are already joined by wan[0]"));
  EXPECT_TRUE(contains(cluster_error("name: x\n? [a, b]\n: 1\n" + kOneNode + "}\n"),
                       "2: document: expected plain names as keys, found a list used as a key"));
  EXPECT_TRUE(contains(cluster_error(kOneNode + ", nic: {? {a: 1} : 2, bandwidth: 1 Gb/s}}\n"),
                       "nodes[0].nic: expected plain names as keys, found a mapping"));
  EXPECT_TRUE(contains(cluster_error("nodes: " + std::string(5000, '[') + std::string(5000, ']') + "\n"),
                       "syntax: nested deeper than"));
}

TEST(InputBounds, NetworkFiguresStayFinite) {
  const auto net_error = [](const std::string& yaml) {
    return error_of([&] { parse_network(yaml, "n.yaml", std::nullopt); });
  };
  EXPECT_TRUE(contains(net_error("layers:\n  - {name: a, forward_flops: 1.7e308, output_elems: 1}\n"),
                       "2: layers[0].forward_flops: expected a number <= 1e+30, found 1.7e308"));
  EXPECT_TRUE(contains(net_error("layers:\n  - {name: a, forward_flops: 1, output_elems: 1, params: inf}\n"),
                       "layers[0].params: expected a finite number"));
  EXPECT_TRUE(contains(net_error("tokens_per_sample: 1e300\nlayers:\n  - {name: a, forward_flops: 1, output_elems: 1}\n"),
                       "1: tokens_per_sample: expected a number <= 1000000000"));
  EXPECT_TRUE(contains(net_error("layers:\n  - {name: a, forward_flops: 1, output_elems: 1, tp_units: 4294967296}\n"),
                       "layers[0].tp_units: expected a whole number between 0 and"));
}

TEST(InputBounds, DecoderSpecsRefuseAbsurdSizes) {
  const auto spec_error = [](const char* spec) { return error_of([&] { network_from_spec(spec, Precision::fp16); }); };
  EXPECT_TRUE(contains(spec_error("gpt:layers=1,hidden=1000000000,heads=1"),
                       "hidden: expected a whole number between 1 and 1048576, found 1000000000"));
  EXPECT_TRUE(contains(spec_error("gpt:layers=4294967298,hidden=64,heads=1"),
                       "layers: expected a whole number between 0 and 2147483647, found 4294967298"));
  EXPECT_TRUE(contains(spec_error("llama:layers=2,hidden=64,heads=4,kv_heads=-8"), "kv_heads: expected a whole number"));
  EXPECT_TRUE(contains(spec_error("gpt:layers=2,hidden=64,heads=4,vocab=0"), "vocab: expected a whole number between 1"));
  // The largest hidden size: 4 x hidden no longer overflows `int` (the MLP width is computed
  // in double), so the parameter count is the closed form's.
  const Network big = network_from_spec("gpt:layers=1,hidden=1048576,heads=1,seq=16,vocab=16", Precision::fp16);
  const double h = 1048576;
  EXPECT_DOUBLE_EQ(big.layers[1].params, 12 * h * h + 13 * h);
  EXPECT_TRUE(std::isfinite(big.training_flops_per_sample()));
}

TEST(InputBounds, HuggingFaceConfigsAreReadStrictly) {
  EXPECT_TRUE(contains(hf_error(R"(["n_layer"])"), "0: (top level): expected a JSON object of settings, found an array"));
  EXPECT_TRUE(contains(hf_error(R"({"model_type": 7, "n_layer": 2})"),
                       "model_type: expected a string (gpt2, llama, mistral, mixtral, qwen2, qwen2_moe, qwen3, "
                       "qwen3_moe, deepseek_v2, deepseek_v3 or glm4_moe), found 7"));
  const std::string llama = R"({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, )"
                            R"("intermediate_size": 100, "vocab_size": 100, )";
  EXPECT_TRUE(contains(hf_error(llama + R"("num_hidden_layers": 2, "tie_word_embeddings": "yes"})"),
                       "tie_word_embeddings: expected true or false, found \"yes\""));
  EXPECT_TRUE(contains(hf_error(llama + R"("num_hidden_layers": 4294967298})"),
                       "num_hidden_layers: expected an integer up to 2147483647, found 4294967298"));
  EXPECT_TRUE(contains(hf_error(llama + R"("num_hidden_layers": 18446744073709551615})"),
                       "num_hidden_layers: expected an integer up to 2147483647"));
  EXPECT_TRUE(contains(hf_error(llama + R"("num_hidden_layers": 2, "num_key_value_heads": -8})"),
                       "num_key_value_heads: expected an integer >= 0, found -8"));
  EXPECT_TRUE(contains(hf_error(llama + R"("num_hidden_layers": 2.5})"), "num_hidden_layers: expected an integer, found 2.5"));
  // Never the whole value in a message, and no recursion over a deep one.
  EXPECT_TRUE(contains(hf_error(llama + R"("num_hidden_layers": {"a": [1, 2, 3]}})"),
                       "num_hidden_layers: expected an integer, found an object"));
  const std::string deep = R"({"n_layer": )" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_TRUE(contains(hf_error(deep), "json: nested deeper than 64 levels")) << hf_error(deep);
  // A key given twice is refused with its line and path, not read as its last value.
  EXPECT_TRUE(contains(hf_error(llama + "\n\"num_hidden_layers\": 2,\n\"num_hidden_layers\": 3}"),
                       "3: num_hidden_layers: given twice in one object"))
      << hf_error(llama + "\n\"num_hidden_layers\": 2,\n\"num_hidden_layers\": 3}");
  EXPECT_TRUE(contains(hf_error(R"({"rope_scaling": {"factor": 2, "factor": 4}})"), "rope_scaling.factor: given twice"));
  // An object of many keys reads in linear time (the check hashes once an object is large);
  // the duplicate at its end is still found.
  std::string wide = "{";
  for (int k = 0; k < 100000; ++k) wide += "\"k" + std::to_string(k) + "\": " + std::to_string(k) + ", ";
  EXPECT_TRUE(contains(hf_error(wide + "\"k7\": 0}"), "k7: given twice")) << hf_error(wide + "\"k7\": 0}");
  const std::string broken = hf_error(R"({"n_layer": })");
  EXPECT_TRUE(contains(broken, "json: not valid JSON")) << broken;
  EXPECT_FALSE(contains(broken, "json.exception")) << broken;
}

TEST(InputBounds, CalibrationIsBoundedAndMatchesGpuTypesCaseInsensitively) {
  const auto calibration_error = [](const std::string& yaml) {
    return error_of([&] { parse_calibration(yaml, "cal.yaml"); });
  };
  EXPECT_TRUE(contains(calibration_error("default_gpu: {overhead: 1e300 s}\n"),
                       "1: default_gpu.overhead: expected 0 or a quantity between 1e-12 s and 3600 s"));
  EXPECT_TRUE(contains(calibration_error("links: {nic: {latency_factor: 1e300}}\n"),
                       "links.nic.latency_factor: expected a number <= 1000000"));
  EXPECT_TRUE(contains(calibration_error("gpus: {? [a, b] : {max_efficiency: 0.5}}\n"),
                       "gpus: expected plain names as keys"));
  EXPECT_TRUE(contains(calibration_error("gpus: {v100-16: {max_efficiency: 0.5}, V100-16: {max_efficiency: 0.4}}\n"),
                       "given twice"));

  const Cluster cluster = builtin_cluster("mixed-academic");
  const Calibration lower = parse_calibration("gpus: {v100-16: {max_efficiency: 0.1}}\n", "cal.yaml");
  const Calibration resolved = resolve_calibration(lower, cluster, "cal.yaml");
  EXPECT_DOUBLE_EQ(resolved.gpu("V100-16").max_efficiency, 0.1);

  const Calibration unknown = parse_calibration("gpus: {NoSuchGPU: {max_efficiency: 0.2}}\n", "cal.yaml");
  const std::string message = error_of([&] { resolve_calibration(unknown, cluster, "cal.yaml"); });
  EXPECT_TRUE(contains(message, "gpus.NoSuchGPU: unknown GPU type 'NoSuchGPU'")) << message;
  EXPECT_TRUE(contains(message, "nearest known:")) << message;

  // A cluster's own GPU types count too, whatever their case.
  const Cluster mine = parse_cluster(
      "gpu_types:\n  - {name: MyGPU, fp16: 100 TFLOP/s, fp32: 20 TFLOP/s, memory: 24 GiB, memory_bandwidth: 1 TB/s}\n"
      "nodes:\n  - {name: n, gpu: MyGPU, gpus: 1}\n",
      "c.yaml");
  const Calibration custom = parse_calibration("gpus: {mygpu: {overhead: 1 ms}}\n", "cal.yaml");
  EXPECT_DOUBLE_EQ(resolve_calibration(custom, mine, "cal.yaml").gpu("MyGPU").overhead_s, 1e-3);
}

// Found by fuzzing (tests/fuzz/cluster_fuzz.cpp): a description with bytes that are not UTF-8
// was read, but written back by yaml-cpp as other characters, so the cluster embedded in a
// plan file differed from the one planned for. YAML is Unicode: such text is refused.
TEST(InputBounds, TextThatIsNotUtf8IsRefusedAtItsLine) {
  EXPECT_EQ(cluster_error("name: x\ndescription: caf\xff\n" + kOneNode + "}\n"),
            "2: syntax: not UTF-8 text at column 17 (byte 0xFF); save the file as UTF-8");
  EXPECT_TRUE(contains(cluster_error("name: \xc0\xaf\n" + kOneNode + "}\n"), "1: syntax: not UTF-8 text at column 7"));
  EXPECT_TRUE(contains(cluster_error("name: \xed\xa0\x80\n" + kOneNode + "}\n"), "not UTF-8"));  // a surrogate
  EXPECT_TRUE(contains(cluster_error("name: x\xe2\x82"), "1: syntax: not UTF-8 text at column 8 (byte 0xE2)"));
  // UTF-8 itself (2, 3 and 4 bytes) reads and writes back unchanged.
  const Cluster c = parse_cluster("name: \"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80\"\n" + kOneNode + "}\n", "c.yaml");
  EXPECT_EQ(c.name, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x9a\x80");
  EXPECT_EQ(parse_cluster(write_cluster(c), "rt.yaml"), c);
}

// Found by fuzzing (tests/fuzz/calibration_fuzz.cpp): a raw NUL in a GPU type name was read
// by yaml-cpp as a lone 0x85 byte, written back as U+FFFD, and read back as another name.
// YAML allows control characters only as escapes; a NUL is refused even then, since
// yaml-cpp does not write it back.
TEST(InputBounds, ControlCharactersAndNulAreRefused) {
  using namespace std::string_literals;
  const std::string calibration = "gpus: {TITAN"s + '\0' + "V: {max_efficiency: 0.5}}\n";
  EXPECT_EQ(error_of([&] { parse_calibration(calibration, "cal.yaml"); }),
            "1: syntax: a control character at column 13 (byte 0x00); YAML takes them only as escapes in double "
            "quotes (\"\\t\")");
  EXPECT_TRUE(contains(cluster_error("name: x\nnodes: [{name: \"a\x04\", gpu: T4, gpus: 1}]\n"),
                       "2: syntax: a control character at column 18 (byte 0x04)"));
  EXPECT_EQ(error_of([] { parse_calibration("gpus: {\"TITAN\\0V\": {max_efficiency: 0.5}}\n", "cal.yaml"); }),
            "1: gpus: holds a NUL character (\\0); names and values are text");
  EXPECT_TRUE(contains(cluster_error("name: \"a\\0b\"\n" + kOneNode + "}\n"), "1: name: holds a NUL character"));
  // Tabs, line ends and escaped control characters other than NUL read and write back.
  const Cluster c = parse_cluster("name: \"a\\tb\\x05\"\r\n" + kOneNode + "}\n", "c.yaml");
  EXPECT_EQ(c.name, "a\tb\x05");
  EXPECT_EQ(parse_cluster(write_cluster(c), "rt.yaml"), c);
}
