// The cluster's input path (`input:`) and the network's bytes per sample: what the data
// loader reads, its defaults, its round trip and its errors.
#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"

using namespace hetflow::model;

namespace {
const char* kNodes = "nodes:\n  - {name: a, count: 2, gpu: A100-80, gpus: 8, nic: {count: 8, bandwidth: 200 Gb/s}}\n";
}

TEST(InputPath, AbsentSectionIsAnUnboundedLoaderAndWritesNothing) {
  const Cluster c = parse_cluster(std::string("name: plain\n") + kNodes, "plain.yaml");
  EXPECT_FALSE(c.input.given);
  EXPECT_EQ(c.input, InputPath{});
  EXPECT_EQ(write_cluster(c).find("input"), std::string::npos);  // embedded clusters hash as before
}

TEST(InputPath, ReadsEveryKeyAndRoundTrips) {
  const Cluster c = parse_cluster(std::string("name: lab\n") + kNodes +
                                      "input: {shared_read: 2 GB/s, node_read: 1.25 GB/s, preprocess: 5 ms,\n"
                                      "        workers: 12, prefetch: 4}\n",
                                  "lab.yaml");
  EXPECT_TRUE(c.input.given);
  EXPECT_DOUBLE_EQ(c.input.shared_read_bytes_per_s, 2e9);
  EXPECT_DOUBLE_EQ(c.input.node_read_bytes_per_s, 1.25e9);
  EXPECT_DOUBLE_EQ(c.input.preprocess_s_per_sample, 5e-3);
  EXPECT_EQ(c.input.workers_per_node, 12);
  EXPECT_EQ(c.input.prefetch_batches, 4);
  EXPECT_EQ(parse_cluster(write_cluster(c), "again.yaml"), c);
}

TEST(InputPath, DefaultsOfAnEmptySection) {
  const Cluster c = parse_cluster(std::string("name: lab\n") + kNodes + "input: {}\n", "lab.yaml");
  EXPECT_TRUE(c.input.given);
  EXPECT_EQ(c.input.shared_read_bytes_per_s, 0);  // unbounded
  EXPECT_EQ(c.input.node_read_bytes_per_s, 0);
  EXPECT_EQ(c.input.preprocess_s_per_sample, 0);
  EXPECT_EQ(c.input.workers_per_node, 1);
  EXPECT_EQ(c.input.prefetch_batches, 2);
  EXPECT_EQ(parse_cluster(write_cluster(c), "again.yaml"), c);
}

TEST(InputPath, ErrorsNameFileLineAndField) {
  struct Case {
    const char* section;
    const char* field;
    const char* says;
  };
  for (const Case& k : {Case{"input: {shared_read: 2 GB}\n", "input.shared_read", "B/s"},
                        Case{"input: {workers: 0}\n", "input.workers", "1"},
                        Case{"input: {prefetch: -1}\n", "input.prefetch", "1"},
                        Case{"input: {preprocess: 5}\n", "input.preprocess", "unit"},
                        Case{"input: {shared_reed: 2 GB/s}\n", "input.shared_reed", "shared_read"}}) {
    try {
      parse_cluster(std::string("name: lab\n") + kNodes + k.section, "lab.yaml");
      FAIL() << k.section << " was accepted";
    } catch (const hetflow::InputError& e) {
      EXPECT_EQ(e.file(), "lab.yaml");
      EXPECT_EQ(e.line(), 4) << e.what();
      EXPECT_EQ(e.field(), k.field) << e.what();
      EXPECT_NE(std::string(e.what()).find(k.says), std::string::npos) << e.what();
    }
  }
}

TEST(InputPath, BytesPerSampleGivenOrDefault) {
  // ImageNet's training tar over its image count (network.cpp's citation).
  const Network resnet = network_from_spec("resnet50", Precision::fp16);
  EXPECT_EQ(resnet.sample_bytes, 0);
  EXPECT_NEAR(resnet.stored_sample_bytes(), 147897477120.0 / 1281167.0, 1e-6);
  // Token ids of two bytes each, llm.c's files.
  const Network gpt = network_from_spec("gpt2-124m", Precision::fp16);
  EXPECT_DOUBLE_EQ(gpt.stored_sample_bytes(), 2 * gpt.tokens_per_sample);
  // Given in the file: read, written back, used.
  Network n = resnet;
  n.sample_bytes = 3e6;
  const Network back = parse_network(write_network(n), "n.yaml");
  EXPECT_DOUBLE_EQ(back.sample_bytes, 3e6);
  EXPECT_DOUBLE_EQ(back.stored_sample_bytes(), 3e6);
  EXPECT_EQ(write_network(resnet).find("sample_bytes"), std::string::npos);
}
