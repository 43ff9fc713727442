// The traps of a first hour with hetflow, each now an error that says what to do: a quantity
// without its unit, a misspelt option, command or key, a missing file, an error blaming an
// option the user never gave.
#include <gtest/gtest.h>

#include <cstdio>
#include <regex>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tests/tools/run_hetflow.hpp"

using hetflow::test_support::run_hetflow;
using hetflow::test_support::scratch_dir;
using hetflow::test_support::write_file;

namespace {

const char* kSmall = "--cluster hetpipe-testbed --model resnet50 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8";

// A two-node cluster whose `nic:` line (line 3) is `nic`.
std::string two_nodes(const std::string& nic) {
  return "name: two\nnodes:\n  - {name: a, count: 2, gpu: T4, gpus: 1, " + nic + "}\n";
}

}  // namespace

// `nic: {bandwidth: 25}` was read as 25 bytes/s (an iteration of 1.36e7 s): now refused at
// its file, line and field, with the units that are accepted.
TEST(Quantities, BareNumbersInClusterFilesAreRefusedNamingTheUnits) {
  struct Case {
    const char* name;
    std::string text;
    const char* field;
    const char* says;
  };
  for (const Case& c :
       {Case{"bare_nic_bandwidth", two_nodes("nic: {bandwidth: 25}"), ":3: nodes[0].nic.bandwidth: ",
             "expected a bandwidth such as '25 GB/s' or '100 Gb/s', found '25' without a unit (units: B/s, kB/s, MB/s, "
             "GB/s, TB/s, GiB/s; b/s, Mb/s, Gb/s, Tb/s for bits; or Gbps)"},
        Case{"bare_nic_latency", two_nodes("nic: {bandwidth: 25 Gb/s, latency: 10}"), ":3: nodes[0].nic.latency: ",
             "expected a time such as '5 us' or '1.5 ms', found '10' without a unit (units: s, ms, us, ns, min)"},
        Case{"bare_memory",
             "gpu_types:\n  - {name: X, fp16: 1 TFLOP/s, fp32: 1 TFLOP/s, memory: 16, memory_bandwidth: 1 GB/s}\n"
             "nodes:\n  - {name: n, gpu: X, gpus: 1}\n",
             ":2: gpu_types[0].memory: ",
             "expected a size such as '80 GiB' or '16 GB', found '16' without a unit (units: B, kB, MB, GB, TB, PB, KiB, "
             "MiB, GiB, TiB, PiB; b, kb, Mb, Gb, Tb for bits)"},
        Case{"bare_fp16",
             "gpu_types:\n  - {name: X, fp16: 125, fp32: 1 TFLOP/s, memory: 16 GiB, memory_bandwidth: 1 GB/s}\n"
             "nodes:\n  - {name: n, gpu: X, gpus: 1}\n",
             ":2: gpu_types[0].fp16: ",
             "expected a compute rate such as '312 TFLOP/s' or '19.5 TFLOPS', found '125' without a unit (units: FLOP/s, "
             "GFLOP/s, TFLOP/s, PFLOP/s (or TFLOPS))"}}) {
    const std::string path = write_file(std::string(c.name) + ".yaml", c.text);
    const auto r = run_hetflow("describe --cluster " + path);
    EXPECT_EQ(r.status, 2) << c.name << ": " << r.err;
    EXPECT_EQ(r.err, "hetflow: " + path + c.field + c.says + "\n") << c.name;
    EXPECT_TRUE(r.out.empty()) << r.out;
  }
  // Zero needs no unit (`uplink: 0`, `latency: 0`), as before.
  const std::string zero = write_file("zero.yaml", two_nodes("nic: {bandwidth: 25 Gb/s, latency: 0}"));
  EXPECT_EQ(run_hetflow("describe --cluster " + zero).status, 0);
}

TEST(Quantities, BareNumbersInLinkWhatIfsAreRefused) {
  auto r = run_hetflow(std::string("simulate ") + kSmall + " --link nic:bandwidth=100");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_EQ(r.err,
            "hetflow: <command line>: --link: expected a bandwidth such as '25 GB/s' or '100 Gb/s', found '100' without a "
            "unit (units: B/s, kB/s, MB/s, GB/s, TB/s, GiB/s; b/s, Mb/s, Gb/s, Tb/s for bits; or Gbps)\n");
  r = run_hetflow(std::string("simulate ") + kSmall + " --link pcie:latency=5");
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_NE(r.err.find("--link: expected a time such as '5 us' or '1.5 ms', found '5' without a unit"), std::string::npos)
      << r.err;
}

// Every built-in cluster and every example cluster file still reads (they all give units).
TEST(Quantities, BuiltInAndExampleClustersStillLoad) {
  for (const char* name : {"mixed-academic", "hetpipe-testbed", "dgx-a100-x4", "h100-fat-tree", "cpu-4", "selene-4",
                           "two-region"}) {
    const auto r = run_hetflow(std::string("describe --cluster ") + name);
    EXPECT_EQ(r.status, 0) << name << ": " << r.err;
  }
  for (const char* file : {"v100-t4.yaml", "priced-v100-t4.yaml", "a100x8.yaml"}) {
    const auto r = run_hetflow(std::string("describe --cluster " HETFLOW_SOURCE_DIR "/tools/examples/") + file);
    EXPECT_EQ(r.status, 0) << file << ": " << r.err;
  }
}

// `--link pcie:bandwidth=1kB/s` slows the run down a million-fold: the table's columns stay
// apart, and the change reads as the factor the JSON figures give.
TEST(Quantities, WhatIfColumnsStayApartForHugeChanges) {
  const std::string what_if = std::string("simulate ") + kSmall + " --link pcie:bandwidth=1kB/s";
  const auto json = run_hetflow(what_if + " --json");
  ASSERT_EQ(json.status, 0) << json.err;
  const auto j = nlohmann::json::parse(json.out)["what_if"];
  const double ratio =
      j["what_if"]["iteration_time_s"].get<double>() / j["baseline"]["iteration_time_s"].get<double>();
  ASSERT_GT(ratio, 100);  // (else this test shows nothing)
  char factor[32];
  std::snprintf(factor, sizeof factor, "x%.3g", ratio);
  const auto text = run_hetflow(what_if);
  ASSERT_EQ(text.status, 0) << text.err;
  const size_t at = text.out.find("what if --link pcie:bandwidth=1kB/s:\n");
  ASSERT_NE(at, std::string::npos) << text.out;
  std::istringstream lines(text.out.substr(at));
  std::string line;
  std::getline(lines, line);
  std::getline(lines, line);
  EXPECT_TRUE(std::regex_match(line, std::regex(" {20,}baseline {2,}what-if {2,}change"))) << line;
  std::getline(lines, line);
  // "  iteration time  <baseline>  <what-if>  x<factor>", each column two spaces or more apart
  const std::regex row(R"(  iteration time +(\S+ \S+) {2,}(\S+ \S+) {2,}(\S+))");
  std::smatch m;
  ASSERT_TRUE(std::regex_match(line, m, row)) << line;
  EXPECT_EQ(m[3].str(), factor) << line;
}

// git and cargo suggest the nearest command or option; so does hetflow.
TEST(Names, MisspeltCommandsAndOptionsGetDidYouMean) {
  auto r = run_hetflow("simulte");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: unknown command 'simulte'; did you mean 'simulate'?\n(hetflow --help lists the commands)\n");
  r = run_hetflow("frobnicate");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.find("hetflow: unknown command 'frobnicate'\n\nhetflow: plan, simulate"), 0u) << r.err;
  r = run_hetflow("simulate --pipline 4");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: <command line>: hetflow simulate: unrecognised option '--pipline'; did you mean '--pipeline'?\n");
  r = run_hetflow("describe --modle gpt2-124m");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: <command line>: hetflow describe: unrecognised option '--modle'; did you mean '--model'?\n");
  r = run_hetflow("describe --frobnicate 1");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: <command line>: hetflow describe: unrecognised option '--frobnicate'\n");
}

TEST(Names, MissingFilesAreSaidToBeMissing) {
  const std::string missing = (scratch_dir() / "no-such-cluster.yaml").string();
  auto r = run_hetflow("describe --cluster " + missing);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: " + missing + ": cluster: no such file or folder\n");
  r = run_hetflow("describe --model ./llama/config.json");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: ./llama/config.json: model: no such file or folder\n");
  // A bare name is still looked up among the built-in ones.
  r = run_hetflow("describe --cluster dgx-a100");
  EXPECT_EQ(r.status, 2);
  EXPECT_NE(r.err.find("nearest built-in: dgx-a100-x4"), std::string::npos) << r.err;
}

// `bandwith` was answered with "bandwidth is required but missing": now the misspelt key is
// named, at its line, with the key it most likely means.
TEST(Names, MisspeltKeysAreNamedAsUnknown) {
  const std::string path = write_file("bandwith.yaml", two_nodes("nic: {bandwith: 25 Gb/s}"));
  auto r = run_hetflow("describe --cluster " + path);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: " + path +
                       ":3: nodes[0].nic.bandwith: unknown key; did you mean 'bandwidth'? (nodes[0].nic.bandwidth is "
                       "required)\n");
  const std::string gpus = write_file("gpsu.yaml", "nodes:\n  - {name: n, gpu: T4,\n     gpsu: 4}\n");
  r = run_hetflow("describe --cluster " + gpus);
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err, "hetflow: " + gpus + ":3: nodes[0].gpsu: unknown key; did you mean 'gpus'? (nodes[0].gpus is required)\n");
}

// `--pipeline 32` on 20 devices blamed `--data ... x 0`, an option never given.
TEST(Names, ErrorsBlameOnlyOptionsGiven) {
  auto r = run_hetflow("simulate --cluster mixed-academic --pipeline 32");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err,
            "hetflow: <command line>: --pipeline: tensor x pipeline = 1 x 32 devices for one data-parallel replica, more "
            "than the cluster's 20\n");
  r = run_hetflow("simulate --cluster mixed-academic --tensor 32");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.find("hetflow: <command line>: --tensor: "), 0u) << r.err;
  r = run_hetflow("simulate --cluster mixed-academic --pipeline 4 --data 8");
  EXPECT_EQ(r.status, 2);
  EXPECT_EQ(r.err.find("hetflow: <command line>: --data: tensor x pipeline x data = 1 x 4 x 8"), 0u) << r.err;
}
