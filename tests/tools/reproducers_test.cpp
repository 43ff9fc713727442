// Every reproducer of the hardening issue, run as a user would: bad input exits 2 and a plan
// that cannot run exits 3, each with "hetflow: " and the file, option or field at fault; a
// simulated fault exits 4 with hetflow's own stall report; nothing a library says (C++
// exception texts, nlohmann's or yaml-cpp's messages, SimGrid backtraces) reaches the user;
// and nothing exits 0 with a number other than the input's. The inputs are in
// tests/tools/data/reproducers/; the two deeply nested ones are generated here.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include "tests/tools/run_hetflow.hpp"

namespace fs = std::filesystem;
using hetflow::test_support::run_hetflow;
using hetflow::test_support::RunResult;
using hetflow::test_support::scratch_dir;

namespace {

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(HETFLOW_SANITIZED)
constexpr bool kSanitized = true;  // sanitizers reserve terabytes of address space: no ulimit -v
#else
constexpr bool kSanitized = false;
#endif

// What run_cases.sh applies to every reproducer.
const std::string kMemoryBound = "ulimit -v 4000000;";

struct Case {
  const char* name;
  const char* args;          // {D}: the reproducers' folder; {S}: this test's scratch folder
  std::set<int> statuses;    // accepted exit statuses
  std::vector<const char*> says;  // each expected in stderr (stdout for statuses 0 and 4)
};

// Text that must never reach the user: a library's words, or a crash.
const char* const kForbidden[] = {"std::", "json.exception", "yaml-cpp", "bad_alloc", "stod",
                                  "terminate",  "Backtrace", "what():", "Segmentation"};

const Case kCases[] = {
    {"validate_help", "validate --help", {0}, {"usage: hetflow validate"}},
    {"validate_positional", "validate {S}/plan.json", {0}, {"plan.json: valid"}},
    {"deep_plan", "validate --plan {S}/deep_plan.json", {2}, {"deep_plan.json", "nested deeper than 64 levels"}},
    {"deep_config", "describe --model {S}/deep_config.json", {2}, {"deep_config.json:1: json: nested deeper than 64"}},
    // Version-1 plan files: refused at "version" today; whatever the plan reader's checks
    // become, they must stay clean refusals.
    {"plan_workers_empty", "validate --plan {D}/plan_workers_empty.json", {2, 3}, {"plan_workers_empty.json"}},
    {"plan_worker_oob", "validate --plan {D}/plan_worker_oob.json", {2, 3}, {"plan_worker_oob.json"}},
    {"plan_stage_rank_oob", "validate --plan {D}/plan_stage_rank_oob.json", {2, 3}, {"plan_stage_rank_oob.json"}},
    {"plan_collective_empty", "validate --plan {D}/plan_collective_empty.json", {2, 3}, {"plan_collective_empty.json"}},
    {"plan_memory_short", "validate --plan {D}/plan_memory_short.json", {2, 3}, {"plan_memory_short.json"}},
    {"plan_cluster_fewer", "validate --plan {D}/plan_cluster_fewer_devices.json", {2, 3},
     {"plan_cluster_fewer_devices.json"}},
    {"plan_cluster_fewer_sim", "simulate --plan {D}/plan_cluster_fewer_devices.json", {2, 3},
     {"plan_cluster_fewer_devices.json"}},
    {"plan_transfer_group_huge", "validate --plan {D}/plan_transfer_group_huge.json", {2, 3},
     {"plan_transfer_group_huge.json"}},
    {"plan_self_dependency", "validate --plan {D}/plan_self_dependency.json", {2, 3}, {"plan_self_dependency.json"}},
    {"plan_self_dependency_sim", "simulate --plan {D}/plan_self_dependency.json", {2, 3},
     {"plan_self_dependency.json"}},
    {"plan_negative_recompute", "validate --plan {D}/plan_negative_recompute.json", {2, 3},
     {"plan_negative_recompute.json"}},
    {"hf_model_type_number", "describe --model {D}/hf_model_type_number.json", {2},
     {"hf_model_type_number.json: model_type: expected a string", "found 7"}},
    {"hf_tie_string", "describe --model {D}/hf_tie_string.json", {2},
     {"hf_tie_string.json: tie_word_embeddings: expected true or false, found \"yes\""}},
    {"hf_top_array", "describe --model {D}/hf_top_array.json", {2},
     {"hf_top_array.json: (top level): expected a JSON object", "found an array"}},
    {"hf_layers_wrap", "describe --model {D}/hf_layers_wrap.json", {2},
     {"hf_layers_wrap.json: num_hidden_layers: expected an integer up to 2147483647, found 4294967298"}},
    {"hf_kv_negative", "describe --model {D}/hf_kv_negative.json", {2},
     {"hf_kv_negative.json: num_key_value_heads: expected an integer >= 0, found -8"}},
    {"cluster_complex_key", "describe --cluster {D}/cluster_complex_key.yaml", {2},
     {"cluster_complex_key.yaml:2: document: expected plain names as keys, found a list"}},
    {"cluster_tiny_bandwidth",
     "simulate --cluster {D}/cluster_tiny_bandwidth.yaml --model {D}/seeds/net_tiny.yaml --iterations 1", {2},
     {"cluster_tiny_bandwidth.yaml:37: nodes[1].nic.bandwidth: expected a quantity between 1 B/s and", "found '5e-324 B/s'"}},
    {"cluster_duplicate_wan",
     "simulate --cluster {D}/cluster_duplicate_wan.yaml --model {D}/seeds/net_tiny.yaml --iterations 1", {2},
     {"cluster_duplicate_wan.yaml:32: wan[1].between: regions 'us' and 'eu' are already joined by wan[0]"}},
    {"cluster_latency_overflow",
     "simulate --cluster {D}/cluster_latency_overflow.yaml --model {D}/seeds/net_tiny.yaml --iterations 1", {2},
     {"cluster_latency_overflow.yaml:44: nodes[2].nic.latency: expected a finite quantity, found '1e308 min'"}},
    {"net_flops_overflow",
     "simulate --model {D}/net_flops_overflow_inf.json --cluster {D}/seeds/cluster_small.yaml --pipeline 2 --data 1 "
     "--iterations 1 --recompute full",
     {2},
     {"net_flops_overflow_inf.json:1: layers[0].forward_flops: expected a number <= 1e+30"}},
    {"calib_overhead_huge",
     "simulate --calibration {D}/calib_overhead_huge.yaml --cluster {D}/seeds/cluster_small.yaml "
     "--model gpt:layers=4,hidden=256,heads=4,seq=128 --pipeline 2 --iterations 1",
     {2},
     {"calib_overhead_huge.yaml:3: default_gpu.overhead: expected 0 or a quantity between", "found '1e300 s'"}},
    {"calib_unknown_gpu", "plan --calibration {D}/calib_unknown_gpu.yaml --pipeline 4 --recompute selective --json",
     {2},
     {"calib_unknown_gpu.yaml:1: gpus.NoSuchGPU: unknown GPU type 'NoSuchGPU'", "nearest known:"}},
    {"gpt_hidden_overflow", "describe --model gpt:layers=1,hidden=1000000000,heads=1 --cluster {D}/seeds/one.yaml",
     {2},
     {"hidden: expected a whole number between 1 and 1048576, found 1000000000"}},
    {"global_batch_overflow",
     "plan --cluster hetpipe-testbed --model vgg19 --micro-batch 2000000000 --global-batch 2000000000 --data 2", {2},
     {"--micro-batch: --micro-batch 2000000000 x 2 virtual workers (--data) = 4000000000 samples"}},
    {"bucket_1B", "plan --bucket-size '1 B' --model gpt2-124m --data 2", {2},
     {"--bucket-size: '1 B' would split", "all-reduce buckets per iteration, more than 1000000", "or more"}},
    {"iterations_huge",
     "simulate --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8 "
     "--iterations 2147483647",
     {2},
     {"--iterations: 2147483647 iterations x 84 tasks per iteration", "more than --max-tasks 10000000"}},
    {"workspace_negative", "plan --model gpt2-124m --data 1 --workspace '-1e308 TB'", {2},
     {"--workspace: expected a finite quantity, found '-1e308 TB'"}},
    {"straggler_inf",
     "simulate --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8 "
     "--straggler titanv/gpu0:inf@0",
     {2},
     {"--straggler: expected a slow-down factor between 1 and 1e6, found 'inf'"}},
    {"straggler_1e308",
     "simulate --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8 "
     "--straggler titanv/gpu0:1e308@0",
     {2},
     {"--straggler: expected a slow-down factor between 1 and 1e6, found '1e308'"}},
    {"straggler_junk",
     "simulate --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --microbatches 4 --micro-batch 8 "
     "--straggler titanv/gpu0:2x@-5",
     {2},
     {"--straggler: expected a time >= 0, found '-5'"}},
    {"fault_backtraces", "simulate --pipeline 4 --recompute selective --fail-device 0@1", {4},
     {"THE RUN DID NOT COMPLETE", "device v100-0/gpu0 failed at 1.000000 s", "never completed"}},
    {"plan_ignores_options", "simulate --plan {S}/plan.json --cluster dgx-a100-x4 --model vgg19 --pipeline 8", {2},
     {"--cluster: a plan file fixes its cluster"}},
    // 400 devices under ulimit -v 4000000: SimGrid's 8 MiB actor stacks shrink to fit.
    {"ulimit_400gpus",
     "simulate --cluster {D}/cluster_400gpus.yaml --model {D}/seeds/net_tiny.yaml --iterations 1 "
     "--allreduce hierarchical",
     {0},
     {"simulated tiny on m: 1 iteration", "400 virtual workers"}},
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size())) {
    text.replace(at, from.size(), to);
  }
  return text;
}

// The generated inputs, once per test process.
const fs::path& scratch() {
  static const fs::path dir = [] {
    const fs::path d = scratch_dir();
    // 100,000 (config) and 50,000 (plan) nested arrays where an integer is expected.
    std::ofstream(d / "deep_config.json") << R"({"model_type": "gpt2", "n_layer": )" << std::string(100000, '[')
                                          << std::string(100000, ']') << "}";
    std::ofstream(d / "deep_plan.json") << R"({"format": "hetflow-plan", "version": )" << std::string(50000, '[')
                                        << std::string(50000, ']') << "}";
    const RunResult r =
        run_hetflow("plan --cluster " + std::string(HETFLOW_SOURCE_DIR) +
                    "/tests/tools/data/reproducers/seeds/cluster_small.yaml --model gpt:layers=4,hidden=256,heads=4,seq=128 "
                    "--pipeline 2 --data 2 --out " + (d / "plan.json").string());
    EXPECT_EQ(r.status, 0) << r.err;
    return d;
  }();
  return dir;
}

}  // namespace

class ReproducerTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReproducerTest, ExitsCleanlyWithTheFieldAtFault) {
  const Case& c = GetParam();
  const bool bounded = !kSanitized;
  if (std::string(c.name) == "ulimit_400gpus" && !bounded) GTEST_SKIP() << "no ulimit -v under sanitizers";
  std::string args = replace_all(c.args, "{D}", std::string(HETFLOW_SOURCE_DIR) + "/tests/tools/data/reproducers");
  args = replace_all(args, "{S}", scratch().string());

  const auto start = std::chrono::steady_clock::now();
  const RunResult r = run_hetflow(args, bounded ? kMemoryBound : "");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  EXPECT_EQ(c.statuses.count(r.status), 1u) << c.name << ": exit status " << r.status << "\nstderr: " << r.err
                                            << "\nstdout: " << r.out.substr(0, 2000);
  const bool refused = r.status == 2 || r.status == 3;
  if (refused) {
    EXPECT_EQ(r.err.rfind("hetflow: ", 0), 0u) << r.err;
    EXPECT_TRUE(r.out.empty()) << r.out.substr(0, 2000);
  } else {
    EXPECT_TRUE(r.err.empty()) << r.err;  // a fault (4) is reported on stdout, like a result
  }
  for (const char* expected : c.says) {
    const std::string& where = refused ? r.err : r.out;
    EXPECT_NE(where.find(expected), std::string::npos) << "expected '" << expected << "' in:\n" << where;
  }
  for (const char* bad : kForbidden) {
    EXPECT_EQ(r.err.find(bad), std::string::npos) << "'" << bad << "' in stderr:\n" << r.err;
    EXPECT_EQ(r.out.find(bad), std::string::npos) << "'" << bad << "' in stdout";
  }
  if (!kSanitized) {
    EXPECT_LT(seconds, 10.0) << c.name << " took " << seconds << " s";
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, ReproducerTest, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

// A calibration names GPU types case-insensitively, as cluster files do: "v100-16" calibrates
// the V100-16s (here: slower), where it used to be silently ignored.
TEST(Reproducers, CalibrationGpuTypesAreCaseInsensitive) {
  const std::string calibration =
      hetflow::test_support::write_file("slow_v100.yaml", "gpus: {v100-16: {max_efficiency: 0.1}}\n");
  const RunResult plain = run_hetflow("plan --pipeline 4 --recompute selective --json");
  const RunResult slow = run_hetflow("plan --pipeline 4 --recompute selective --json --calibration " + calibration);
  ASSERT_EQ(plain.status, 0) << plain.err;
  ASSERT_EQ(slow.status, 0) << slow.err;
  const auto time_of = [](const std::string& json) {
    const size_t at = json.find("\"iteration_time_s\": ");
    return std::stod(json.substr(at + 20));
  };
  EXPECT_GT(time_of(slow.out), 1.5 * time_of(plain.out));
}

namespace {

// Children of `pid` (every thread's list).
std::vector<pid_t> children_of(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : fs::directory_iterator(fs::path("/proc") / std::to_string(pid) / "task", ec)) {
    std::ifstream in(task.path() / "children");
    for (pid_t child = 0; in >> child;) out.push_back(child);
  }
  return out;
}

// Running or sleeping: present in /proc and not a zombie.
bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(in, text)) return false;
  const size_t close = text.rfind(')');
  return close != std::string::npos && close + 2 < text.size() && text[close + 2] != 'Z' && text[close + 2] != 'X';
}

}  // namespace

// A signal to the hetflow process alone (a job runner's SIGTERM, a subprocess timeout) stops
// the simulation child too, within a second, and hetflow exits as a shell reports SIGTERM.
TEST(Reproducers, SigtermToTheParentStopsTheSimulationChild) {
  const std::string cluster = std::string(HETFLOW_SOURCE_DIR) + "/tests/tools/data/reproducers/cluster_400gpus.yaml";
  const pid_t parent = ::fork();
  ASSERT_GE(parent, 0);
  if (parent == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, STDOUT_FILENO);
    ::dup2(null, STDERR_FILENO);
    // (--no-fold: folded, the 400 GPUs' replicas would simulate as one, too fast to signal.)
    ::execl(HETFLOW_BIN, HETFLOW_BIN, "simulate", "--cluster", cluster.c_str(), "--model", "gpt2-124m", "--iterations",
            "300", "--no-fold", static_cast<char*>(nullptr));
    ::_exit(127);
  }
  // The child appears once planning is done; the simulation then runs for many seconds (300
  // iterations: a few of the 400 GPUs' would end within the wait below).
  std::vector<pid_t> children;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kSanitized ? 120 : 30);
  while (children.empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    children = children_of(parent);
  }
  ASSERT_EQ(children.size(), 1u) << "no simulation child appeared";
  const pid_t child = children.front();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well inside the simulation
  ASSERT_TRUE(alive(child));

  ASSERT_EQ(::kill(parent, SIGTERM), 0);
  const auto signalled = std::chrono::steady_clock::now();
  while (alive(child) && std::chrono::steady_clock::now() - signalled < std::chrono::seconds(1)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_FALSE(alive(child)) << "the simulation child outlived its parent by more than 1 s";
  if (alive(child)) ::kill(child, SIGKILL);
  int status = 0;
  ASSERT_EQ(::waitpid(parent, &status, 0), parent);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 143) << "status " << status;
}

// The classes the command-line reproducers stand for: every size or count an option gives is
// bounded before planning multiplies it.
TEST(Reproducers, OptionSizesAreBoundedWhereTheyEnter) {
  struct OptionCase {
    const char* args;
    const char* says;
  };
  const OptionCase cases[] = {
      {"plan --cluster hetpipe-testbed --model vgg19 --staleness 2147483647 --sync wsp --data 2",
       "--staleness: expected at most 1000000 iterations"},
      {"plan --cluster hetpipe-testbed --model vgg19 --pipeline 2 --virtual-stages 2147483647 --schedule interleaved",
       "--virtual-stages: pipeline x virtual stages = 4294967294 model chunks, more than the 19 layers of vgg19"},
      {"plan --cluster hetpipe-testbed --model vgg19 --pipeline 2 --stage-layers 2147483647,1",
       "--stage-layers: the counts add up to 2147483648 layers, but vgg19 has 19"},
      {"plan --cluster hetpipe-testbed --model vgg19 --microbatches 1000000000",
       "--microbatches: --micro-batch 1 x --microbatches 1000000000 x 16 virtual workers"},
      {"plan --cluster hetpipe-testbed --model vgg19 --pipeline 4 --microbatches 2000000",
       "--max-tasks: the plan would hold about"},
      {"plan --cluster hetpipe-testbed --model vgg19 --micro-batch 2147483647",
       "--micro-batch: the layout trains 68719476704 samples per iteration"},
      {"plan --model gpt2-124m --data 1 --workspace '2000 TiB'", "--workspace: expected a size between 0 and"},
      {"plan --model gpt2-124m --data 1 --workspace '-1 GiB'", "--workspace: expected a size between 0 and"},
      {"plan --model gpt2-124m --data 2 --bucket-size '0.5 B'", "--bucket-size: expected a size of at least 1 B"},
      {"plan --model gpt2-124m --data 2 --max-tasks 0", "--max-tasks: expected a positive number"},
      {"simulate --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --iterations 200000 --max-tasks 1000000",
       "--iterations: 200000 iterations x"},
      {"simulate --cluster hetpipe-testbed --model vgg19 --pipeline 4 --data 1 --fail-device '0@1e308 min'",
       "--fail-device: expected a finite quantity"},
  };
  for (const OptionCase& c : cases) {
    const RunResult r = run_hetflow(c.args);
    EXPECT_EQ(r.status, 2) << c.args << "\n" << r.err;
    EXPECT_EQ(r.err.rfind("hetflow: <command line>: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find(c.says), std::string::npos) << "expected '" << c.says << "' in: " << r.err;
    for (const char* bad : kForbidden) EXPECT_EQ(r.err.find(bad), std::string::npos) << r.err;
  }
}
