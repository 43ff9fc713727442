// The layout file: read into the layout it spells out, every mistake reported at its file,
// line and field path, and the layout-file policy's micro-batches and option clashes.
#include <gtest/gtest.h>

#include "model/error.hpp"
#include "model/zoo.hpp"
#include "partition/layout_file.hpp"
#include "partition/plan_builder.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

// Two nodes of 4 GPUs: n-0/gpu0..3 (devices 0-3) and n-1/gpu0..3 (devices 4-7).
const model::Cluster& cluster() {
  static const model::Cluster c = test_support::identical_cluster(4, 2);
  return c;
}

// 6 layers (embedding, 4 blocks, head), 8 heads.
const model::Network& network() {
  static const model::Network n = model::network_from_spec("gpt:layers=4,hidden=256,heads=8,seq=128", model::Precision::fp16);
  return n;
}

Layout read(const std::string& text) { return read_layout_file(text, "layout.yaml", cluster(), network(), Layout{}); }

struct Failure {
  int line;
  std::string field, message;
};

Failure fail(const std::string& text) {
  try {
    read(text);
  } catch (const InputError& e) {
    EXPECT_EQ(e.file(), "layout.yaml");
    return {e.line(), e.field(), e.message()};
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return {};
}

const char* kTwoWorkers = R"(workers:
  - microbatches: 8
    stages:
      - {devices: [n-0/gpu0], layers: 0-2}
      - {devices: [n-0/gpu1], layers: 3-5}
  - stages:
      - {devices: [n-1/gpu2], layers: 0}
      - {devices: [n-1/gpu3], layers: 1-3}
      - {devices: [n-0/gpu3], layers: 4 - 5}
)";

}  // namespace

TEST(LayoutFile, ReadsWorkersStagesAndMicrobatches) {
  Layout base;
  base.schedule = "gpipe";
  base.micro_batch_size = 4;
  const Layout l = read_layout_file(kTwoWorkers, "layout.yaml", cluster(), network(), base);
  Layout expected = base;
  expected.set_size(Axis::tensor, 1);
  expected.workers = {
      VirtualWorker{{{0}, {1}}, {Stage{0, 3, 0}, Stage{3, 6, 1}}, 8},
      VirtualWorker{{{6}, {7}, {3}}, {Stage{0, 1, 0}, Stage{1, 4, 1}, Stage{4, 6, 2}}, 0},  // 0: the policy decides
  };
  expected.set_size(Axis::data, 2);      // two workers
  expected.set_size(Axis::pipeline, 3);  // the deeper one's ranks
  EXPECT_EQ(l, expected);
}

TEST(LayoutFile, SeveralDevicesPerStageAreATensorGroup) {
  const Layout l = read(R"({"workers": [{"stages": [
      {"devices": ["n-0/gpu0", "n-0/gpu1"], "layers": "0-3"},
      {"devices": ["n-1/gpu0", "n-1/gpu1"], "layers": "4-5"}]}]})");  // JSON works too
  EXPECT_EQ(l.size(Axis::tensor), 2);
  EXPECT_EQ(l.workers.at(0).ranks, (std::vector<std::vector<int>>{{0, 1}, {4, 5}}));
}

TEST(LayoutFile, EveryMistakeNamesItsLineAndField) {
  const auto stages = [](const std::string& first, const std::string& second) {
    return "workers:\n  - stages:\n      - " + first + "\n      - " + second + "\n";
  };
  struct Case {
    std::string text;
    int line;
    std::string field, message;
  } cases[] = {
      {stages("{devices: [n-0/gpu0], layers: 0-2}", "{devices: [n-0/gpu9], layers: 3-5}"), 4,
       "workers[0].stages[1].devices[0]", "unknown device 'n-0/gpu9'; nearest known: n-0/gpu0, n-0/gpu1, n-0/gpu2"},
      {stages("{devices: [n-0/gpu0], layers: 0-2}", "{devices: [n-1/gpu0, n-0/gpu0], layers: 3-5}"), 4,
       "workers[0].stages[1].devices[1]", "device n-0/gpu0 is used twice: also in workers[0].stages[0] (line 3)"},
      {stages("{devices: [n-0/gpu0], layers: 0-1}", "{devices: [n-0/gpu1], layers: 3-5}"), 4,
       "workers[0].stages[1].layers", "layer 2 is covered by no stage: this stage starts at 3, the one before ends at 1"},
      {stages("{devices: [n-0/gpu0], layers: 1-2}", "{devices: [n-0/gpu1], layers: 3-5}"), 3,
       "workers[0].stages[0].layers", "layer 0 is covered by no stage: this stage starts at 1, the first must start at 0"},
      {stages("{devices: [n-0/gpu0], layers: 0-3}", "{devices: [n-0/gpu1], layers: 3-5}"), 4,
       "workers[0].stages[1].layers", "overlaps the stage before: it starts at 3, but layers up to 3 are already covered"},
      {stages("{devices: [n-0/gpu0], layers: 0-2}", "{devices: [n-0/gpu1], layers: 3-6}"), 4,
       "workers[0].stages[1].layers", "layer 6 is out of range: " + network().name + " has 6 layers, 0-5"},
      {stages("{devices: [n-0/gpu0], layers: 0-2}", "{devices: [n-0/gpu1], layers: 3}"), 4,
       "workers[0].stages[1].layers",
       "layers 4-5 are covered by no stage: the last stage ends at 3, but " + network().name + " has 6 layers (0-5)"},
      {stages("{devices: [n-0/gpu0], layers: 2-0}", "{devices: [n-0/gpu1], layers: 3-5}"), 3,
       "workers[0].stages[0].layers", "expected a layer range FIRST-LAST (inclusive, FIRST <= LAST) or one layer N, found '2-0'"},
      {stages("{devices: [n-0/gpu0]}", "{devices: [n-0/gpu1], layers: 3-5}"), 3, "workers[0].stages[0].layers",
       "is required but missing"},
      {stages("{devices: [n-0/gpu0], layer: 0-2}", "{devices: [n-0/gpu1], layers: 3-5}"), 3, "workers[0].stages[0].layer",
       "unknown key; expected one of the known keys, nearest: layers, devices"},
      {stages("{devices: [n-0/gpu0], layers: 0-2}", "{devices: [n-0/gpu1, n-0/gpu2, n-0/gpu3], layers: 3-5}"), 4,
       "workers[0].stages[1].devices",
       "3 devices per stage (tensor parallel) must divide the 8 attention heads (or KV groups) of layer0"},
      {stages("{devices: [n-0/gpu0, n-0/gpu1, n-0/gpu2], layers: 0-2}", "{devices: [n-1/gpu0], layers: 3-5}"), 3,
       "workers[0].stages[0].devices",
       "3 devices per stage (tensor parallel) must divide the 8 attention heads (or KV groups) of layer0"},
      {stages("{devices: [], layers: 0-2}", "{devices: [n-0/gpu1], layers: 3-5}"), 3, "workers[0].stages[0].devices",
       "expected a list of device names (as `hetflow describe` prints them), found an empty list"},
      {"workers:\n  - stages: []\n", 2, "workers[0].stages", "expected a list of stages in model order"},
      {"workers:\n  - micro: 2\n    stages: []\n", 2, "workers[0].micro",
       "unknown key; expected one of the known keys, nearest: microbatches, stages"},
      {"workers:\n  - microbatches: 0\n    stages: [{devices: [n-0/gpu0], layers: 0-5}]\n", 2, "workers[0].microbatches",
       "expected a whole number >= 1, found 0"},
      {"worker: []\n", 1, "worker", "unknown key; expected one of the known keys, nearest: workers, options"},
      {"workers: {}\n", 1, "workers", "expected a list of virtual workers, each with its stages"},
  };
  for (const Case& c : cases) {
    const Failure f = fail(c.text);
    EXPECT_EQ(f.line, c.line) << c.text;
    EXPECT_EQ(f.field, c.field) << c.text;
    EXPECT_EQ(f.message, c.message) << c.text;
  }
}

TEST(LayoutFile, PolicyFillsMicrobatchesFromTheOptions) {
  PlanOptions o;
  o.layout_file = test_support::write_file("two-workers.yaml", kTwoWorkers);
  const CostModel cost(cluster(), model::Precision::fp16);
  const auto microbatches = [&](const PlanOptions& options) {
    const Layout l = make_layout(cluster(), network(), options, cost);
    EXPECT_EQ(l.policy, "layout-file");
    return std::vector<int>{l.workers.at(0).microbatches, l.workers.at(1).microbatches};
  };
  EXPECT_EQ(microbatches(o), (std::vector<int>{8, 6}));  // the file's, else 2 x its depth
  PlanOptions given = o;
  given.microbatches = 5;
  EXPECT_EQ(microbatches(given), (std::vector<int>{8, 5}));
  PlanOptions global = o;
  global.micro_batch = 2;
  global.global_batch = 2 * 8 + 2 * 4;  // the file's 8 micro-batches, then 4 for the other
  EXPECT_EQ(microbatches(global), (std::vector<int>{8, 4}));
  global.global_batch = 2 * 8 + 1;
  EXPECT_THROW(make_layout(cluster(), network(), global, cost), InputError);
}

TEST(LayoutFile, GlobalBatchGoesToTheFasterWorker) {
  // Identical stages, but worker 1 runs on one slower GPU type (T4 vs A100).
  const model::Cluster mixed = model::parse_cluster(
      "name: mixed\nnodes:\n  - {name: a, gpu: A100-80, gpus: 2, nic: {bandwidth: 100 Gb/s}}\n"
      "  - {name: t, gpu: T4, gpus: 2, nic: {bandwidth: 100 Gb/s}}\n",
      "mixed.yaml");
  PlanOptions o;
  o.global_batch = 12;
  o.layout_file = test_support::write_file("fast-slow.yaml", R"(workers:
  - stages: [{devices: [a/gpu0], layers: 0-2}, {devices: [a/gpu1], layers: 3-5}]
  - stages: [{devices: [t/gpu0], layers: 0-2}, {devices: [t/gpu1], layers: 3-5}]
)");
  const Layout l = make_layout(mixed, network(), o, CostModel(mixed, model::Precision::fp16));
  EXPECT_EQ(l.workers.at(0).microbatches + l.workers.at(1).microbatches, 12);
  EXPECT_GT(l.workers.at(0).microbatches, l.workers.at(1).microbatches);
}

TEST(LayoutFile, OptionsTheFileReplacesAreRefused) {
  const CostModel cost(cluster(), model::Precision::fp16);
  PlanOptions o;
  o.layout_file = test_support::write_file("clash.yaml", kTwoWorkers);
  const auto option_at_fault = [&](PlanOptions options) {
    try {
      make_layout(cluster(), network(), options, cost);
    } catch (const InputError& e) {
      return e.field();
    }
    return std::string("no error");
  };
  PlanOptions a = o, b = o, c = o, d = o, e = o, g = o;  // (virtual stages: the file lists each rank's chunks)
  a.policy = "balanced";
  b.pipeline = 2;
  c.data = 2;
  d.tensor = 2;
  e.stage_layers = {3, 3};
  g.sequence_parallel = true;  // the file's stages have one device each
  EXPECT_EQ(option_at_fault(a), "policy");
  EXPECT_EQ(option_at_fault(b), "pipeline");
  EXPECT_EQ(option_at_fault(c), "data");
  EXPECT_EQ(option_at_fault(d), "tensor");
  EXPECT_EQ(option_at_fault(e), "stage_layers");
  EXPECT_EQ(option_at_fault(g), "sequence_parallel");
  PlanOptions missing;
  missing.policy = "layout-file";
  EXPECT_EQ(option_at_fault(missing), "policy");
}

// With v virtual stages a worker lists p x v chunks, chunk k on the devices of chunk k % p.
TEST(LayoutFile, VirtualStagesListEachRanksChunks) {
  Layout base;
  base.virtual_stages = 2;
  const std::string two_ranks = R"(workers:
  - stages:
      - {devices: [n-0/gpu0, n-0/gpu1], layers: 0-1}
      - {devices: [n-1/gpu0], layers: 2}
      - {devices: [n-0/gpu0, n-0/gpu1], layers: 3-4}
      - {devices: [n-1/gpu0], layers: 5}
)";
  const Layout l = read_layout_file(two_ranks, "layout.yaml", cluster(), network(), base);
  ASSERT_EQ(l.workers.size(), 1u);
  EXPECT_EQ(l.workers[0].ranks, (std::vector<std::vector<int>>{{0, 1}, {4}}));
  EXPECT_EQ(l.workers[0].stages, (std::vector<Stage>{Stage{0, 2, 0}, Stage{2, 3, 1}, Stage{3, 5, 0}, Stage{5, 6, 1}}));
  std::string wrong = two_ranks;
  wrong.replace(wrong.find("[n-1/gpu0], layers: 5"), 10, "[n-1/gpu1]");
  try {
    read_layout_file(wrong, "layout.yaml", cluster(), network(), base);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.line(), 6);
    EXPECT_EQ(e.field(), "workers[0].stages[3].devices");
    EXPECT_EQ(e.message(), "expected the devices of workers[0].stages[1] again ([n-1/gpu0]): with `virtual_stages` 2, "
                           "chunk k runs on the rank of chunk k % the ranks");
  }
  base.virtual_stages = 3;
  try {
    read_layout_file(two_ranks, "layout.yaml", cluster(), network(), base);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "workers[0].stages");
    EXPECT_EQ(e.message(), "expected a multiple of `virtual_stages` 3 stages (each rank's 3 chunks), found 4");
  }
}

// A layout file's `options:` set the plan options the caller does not keep; a bad value is
// named at its line.
TEST(LayoutFile, OptionsPlanTheLayoutBack) {
  const std::string text = "options: {micro_batch: 4, schedule: gpipe, recompute: full, sync: ps, bucket_size: 8 MiB, "
                           "fused_adam: false}\n" + std::string(kTwoWorkers);
  PlanOptions o;
  apply_layout_file_options(text, "layout.yaml", o, [](std::string_view member) { return member == "schedule"; });
  EXPECT_EQ(o.micro_batch, 4);
  EXPECT_EQ(o.schedule, "1f1b");  // kept: the caller's own
  EXPECT_EQ(o.recompute, Recompute::full);
  EXPECT_EQ(o.sync, SyncKind::ps);
  EXPECT_EQ(o.bucket_bytes, 8.0 * 1024 * 1024);
  EXPECT_FALSE(o.kernels.fused_adam);
  try {
    apply_layout_file_options("options:\n  recompute: sometimes\n", "layout.yaml", o, [](std::string_view) { return false; });
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.field(), "options.recompute");
  }
}

TEST(LayoutFile, EverySyncBuildsAValidPlan) {
  const CostModel cost(cluster(), model::Precision::fp16);
  for (SyncKind sync : {SyncKind::allreduce, SyncKind::ps, SyncKind::wsp}) {
    PlanOptions o;
    o.sync = sync;
    o.layout_file = test_support::write_file("sync.yaml", kTwoWorkers);
    const Layout l = make_layout(cluster(), network(), o, cost);
    const Validation v = validate_plan(build_plan(cluster(), network(), l, cost));
    EXPECT_TRUE(v.ok()) << to_string(sync) << ": " << (v.ok() ? "" : v.problems.front());
  }
}

TEST(LayoutFile, StagesMayDifferInTensorParallelDegree) {
  const Layout l = read(R"(workers:
  - stages:
      - {devices: [n-0/gpu0], layers: 0-2}
      - {devices: [n-0/gpu1, n-0/gpu2], layers: 3-5}
  - stages:
      - {devices: [n-1/gpu0, n-1/gpu1, n-1/gpu2, n-1/gpu3], layers: 0-5}
)");
  EXPECT_EQ(l.size(Axis::tensor), 4);  // the largest stage's
  EXPECT_EQ(l.workers.at(0).ranks, (std::vector<std::vector<int>>{{0}, {1, 2}}));
  EXPECT_EQ(l.workers.at(0).tensor_of(0), 1);
  EXPECT_EQ(l.workers.at(0).tensor_of(1), 2);
  EXPECT_EQ(l.workers.at(1).tensor_of(0), 4);
  EXPECT_FALSE(l.uniform_tensor());
}

TEST(LayoutFile, SequenceParallelStagesShareOneDegree) {
  Layout base;
  base.sequence_parallel = true;
  try {
    read_layout_file(R"(workers:
  - stages:
      - {devices: [n-0/gpu0, n-0/gpu1], layers: 0-2}
      - {devices: [n-0/gpu2], layers: 3-5}
)",
                     "layout.yaml", cluster(), network(), base);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.line(), 4);
    EXPECT_EQ(e.field(), "workers[0].stages[1].devices");
    EXPECT_EQ(e.message(),
              "1 device, but workers[0].stages[0] has 2: sequence parallelism (`sequence_parallel`) needs the same "
              "tensor-parallel degree in every stage, since sequence shards would differ between neighbouring stages");
  }
}

TEST(LayoutFile, LayersThatAreNotTensorParallelKeepOneDegreeAcrossWorkers) {
  // Plain layers with parameters (not tensor parallel): every device of a stage holds all of
  // them, so two workers cannot all-reduce them at different degrees.
  const model::Network plain = test_support::equal_layers(4);
  const std::string text = R"(workers:
  - stages:
      - {devices: [n-0/gpu0], layers: 0-1}
      - {devices: [n-0/gpu1, n-0/gpu2], layers: 2-3}
  - stages:
      - {devices: [n-1/gpu0], layers: 0-1}
      - {devices: [n-1/gpu1], layers: 2-3}
)";
  try {
    read_layout_file(text, "layout.yaml", cluster(), plain, Layout{});
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_EQ(e.line(), 7);
    EXPECT_EQ(e.field(), "workers[1].stages[1].devices");
    EXPECT_EQ(e.message(),
              "1 device, but workers[0].stages[1] has 2: l2 is not tensor parallel (every device of a stage holds all "
              "of it), so its data-parallel all-reduce needs the same number of devices in both stages");
  }
  // Under a parameter server nothing is all-reduced: the same file is a layout.
  Layout ps;
  ps.sync.kind = SyncKind::ps;
  EXPECT_EQ(read_layout_file(text, "layout.yaml", cluster(), plain, ps).size(Axis::tensor), 2);
}

TEST(LayoutFile, MixedDegreesBuildAValidPlanWithEverySync) {
  const CostModel cost(cluster(), model::Precision::fp16);
  for (SyncKind sync : {SyncKind::allreduce, SyncKind::ps, SyncKind::wsp}) {
    PlanOptions o;
    o.sync = sync;
    o.layout_file = test_support::write_file("mixed.yaml", R"(workers:
  - stages:
      - {devices: [n-0/gpu0], layers: 0-2}
      - {devices: [n-0/gpu1, n-0/gpu2], layers: 3-5}
  - stages:
      - {devices: [n-1/gpu0, n-1/gpu1, n-1/gpu2, n-1/gpu3], layers: 0-1}
      - {devices: [n-1/gpu0], layers: 2-5}
)");
    // n-1/gpu0 twice: refused; then a valid file.
    EXPECT_THROW(make_layout(cluster(), network(), o, cost), InputError);
    o.layout_file = test_support::write_file("mixed.yaml", R"(workers:
  - stages:
      - {devices: [n-0/gpu0], layers: 0-2}
      - {devices: [n-0/gpu1, n-0/gpu2], layers: 3-5}
  - stages:
      - {devices: [n-1/gpu0, n-1/gpu1, n-1/gpu2, n-1/gpu3], layers: 0-1}
      - {devices: [n-0/gpu3], layers: 2-5}
)");
    const Layout l = make_layout(cluster(), network(), o, cost);
    const Validation v = validate_plan(build_plan(cluster(), network(), l, cost));
    EXPECT_TRUE(v.ok()) << to_string(sync) << ": " << (v.ok() ? "" : v.problems.front());
  }
}
