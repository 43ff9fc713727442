// Hand-broken plans: each is rejected with a message that names what is wrong, and nothing
// that validates reads out of range.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>

#include "model/error.hpp"
#include "model/io.hpp"
#include "model/zoo.hpp"
#include "partition/estimate.hpp"
#include "partition/plan_builder.hpp"
#include "partition/plan_io.hpp"
#include "partition/policy.hpp"
#include "partition/validate.hpp"
#include "tests/partition/plan_test_util.hpp"
#include "tests/scratch.hpp"

using namespace hetflow;
using namespace hetflow::partition;

namespace {

Plan small_plan(double memory_per_layer_bytes = 1e7) {
  const model::Cluster cluster = test_support::identical_cluster(4);
  model::Network net = test_support::equal_layers(8);
  for (model::Layer& l : net.layers) l.stashed_bytes = memory_per_layer_bytes;
  PlanOptions o;
  o.pipeline = 4;
  o.data = 1;
  o.microbatches = 4;
  const CostModel cost(cluster, net.precision);
  return build_plan(cluster, net, make_layout(cluster, net, o, cost), cost);
}

bool mentions(const Validation& v, const std::string& text) {
  return std::any_of(v.problems.begin(), v.problems.end(),
                     [&](const std::string& p) { return p.find(text) != std::string::npos; });
}

std::string first_problem(const Validation& v) { return v.ok() ? "valid" : v.problems.front(); }

int first_task(const Plan& plan, TaskKind kind) {
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    if (plan.tasks[i].kind == kind) return static_cast<int>(i);
  }
  return -1;
}

std::vector<int>& program_of(Plan& plan, int task) {
  const Task& t = plan.tasks[static_cast<size_t>(task)];
  auto& streams = plan.programs[static_cast<size_t>(t.device)];
  return std::find_if(streams.begin(), streams.end(), [&](const auto& p) { return p.stream == t.stream; })->tasks;
}

// Moves a task to another stream of its device (a new one), keeping everything else.
void move_to_new_stream(Plan& plan, int task, const std::string& name) {
  auto& from = program_of(plan, task);
  from.erase(std::find(from.begin(), from.end(), task));
  plan.streams.push_back(name);
  Task& t = plan.tasks[static_cast<size_t>(task)];
  t.stream = static_cast<int>(plan.streams.size()) - 1;
  plan.programs[static_cast<size_t>(t.device)].push_back(StreamProgram{t.stream, {task}});
}

}  // namespace

TEST(Validate, AWellFormedPlanIsValid) {
  const Plan plan = small_plan();
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(v.ok()) << first_problem(v);
  EXPECT_NO_THROW(require_valid(plan));
}

TEST(Validate, AReceiveOnAnotherChannelLeavesBothUnmatched) {
  Plan plan = small_plan();
  const int recv = first_task(plan, TaskKind::recv);
  ASSERT_GE(recv, 0);
  const Channel c = plan.channels[static_cast<size_t>(plan.tasks[static_cast<size_t>(recv)].channel)];
  plan.tasks[static_cast<size_t>(recv)].channel = plan.add_channel({c.src, c.dst, "other", c.communicator});
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "unmatched send")) << first_problem(v);
  EXPECT_TRUE(mentions(v, "unmatched receive"));
  EXPECT_THROW(require_valid(plan), PlanError);
}

// Regression: a receive moved to another stream used to pass validation, and the simulator
// then paired the wrong messages.
TEST(Validate, AReceiveMovedToAnotherStreamIsRefused) {
  Plan plan = small_plan();
  int recv = -1, seen = 0;
  for (size_t i = 0; i < plan.tasks.size(); ++i) {
    if (plan.tasks[i].kind == TaskKind::recv && plan.tasks[i].channel == 0 && ++seen == 2) recv = static_cast<int>(i);
  }
  ASSERT_GE(recv, 0);
  move_to_new_stream(plan, recv, "elsewhere");
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "receives are on several streams")) << first_problem(v);
}

TEST(Validate, MismatchedBytesAreNamed) {
  Plan plan = small_plan();
  const int recv = first_task(plan, TaskKind::recv);
  plan.tasks[static_cast<size_t>(recv)].bytes *= 2;
  EXPECT_TRUE(mentions(validate_plan(plan), "but received as"));
}

TEST(Validate, CycleIsReportedAsDeadlockWithItsTasks) {
  Plan plan = small_plan();
  // Make rank 0's first forward wait for its own last backward.
  const auto program = plan.program(0, 0);
  plan.add_order(program.back(), program.front());
  const Validation v = validate_plan(plan);
  ASSERT_TRUE(mentions(v, "deadlock")) << first_problem(v);
  EXPECT_TRUE(mentions(v, "forward #"));
  const CostModel cost(test_support::identical_cluster(4), model::Precision::fp16);
  EXPECT_THROW(estimate_plan(plan, cost), PlanError);
}

// Regression: a task waiting for itself used to validate, then deadlock the simulator.
TEST(Validate, ATaskThatWaitsForItselfIsADeadlock) {
  Plan plan = small_plan();
  const int f = first_task(plan, TaskKind::forward);
  plan.add_order(f, f);
  EXPECT_TRUE(mentions(validate_plan(plan), "deadlock"));
  // Across iterations it is only an order: the task waits for its previous iteration.
  Plan staggered = small_plan();
  staggered.add_order(f, f, 1);
  EXPECT_TRUE(validate_plan(staggered).ok()) << first_problem(validate_plan(staggered));
}

TEST(Validate, CrossedChannelsDeadlock) {
  // Device A receives from B before it sends to B; B sends only after it has received A's
  // message: a classic send/recv deadlock.
  Plan plan = small_plan();
  const int a = first_task(plan, TaskKind::send);
  const Task send_a = plan.tasks[static_cast<size_t>(a)];
  const Channel forward = plan.channels[static_cast<size_t>(send_a.channel)];
  const int back = plan.add_channel({forward.dst, forward.src, "back", forward.communicator});
  Task forged_recv = send_a;
  forged_recv.kind = TaskKind::recv;
  forged_recv.channel = back;
  plan.add_task(forged_recv);
  auto& stream = program_of(plan, a);
  std::rotate(stream.begin(), stream.end() - 1, stream.end());  // the forged recv goes first
  int peer_recv = -1;
  for (size_t i = 0; i < plan.tasks.size() && peer_recv < 0; ++i) {
    if (plan.tasks[i].kind == TaskKind::recv && plan.tasks[i].channel == send_a.channel) peer_recv = static_cast<int>(i);
  }
  Task forged_send = plan.tasks[static_cast<size_t>(peer_recv)];
  forged_send.kind = TaskKind::send;
  forged_send.channel = back;
  plan.streams.push_back("send back");
  forged_send.stream = static_cast<int>(plan.streams.size()) - 1;
  const int s = plan.add_task(forged_send);
  plan.add_order(peer_recv, s);
  plan.finish();
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "deadlock")) << first_problem(v);
}

TEST(Validate, ATensorFreedBeforeItsLastReaderIsRefused) {
  Plan plan = small_plan();
  for (Tensor& t : plan.tensors) {
    if (t.kind == TensorKind::stash) {
      t.free_after = t.producer;  // the backward still reads it
      break;
    }
  }
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "may still read it")) << first_problem(v);
}

TEST(Validate, ATensorReadOnAnotherDeviceIsRefused) {
  Plan plan = small_plan();
  for (Tensor& t : plan.tensors) {
    if (t.kind == TensorKind::stash) {
      t.device = (t.device + 1) % plan.device_count();
      break;
    }
  }
  EXPECT_TRUE(mentions(validate_plan(plan), "on another device")) << first_problem(validate_plan(plan));
}

TEST(Validate, OversizedStageNamesDeviceTermAndExcess) {
  const Plan plan = small_plan(40e9);  // 2 layers x 40 GB per micro-batch per stage
  const Validation v = validate_plan(plan);
  ASSERT_FALSE(v.ok());
  EXPECT_TRUE(mentions(v, "n-0/gpu0 needs")) << first_problem(v);
  EXPECT_TRUE(mentions(v, "over by"));
  EXPECT_TRUE(mentions(v, "largest term: activations"));
  EXPECT_TRUE(mentions(v, "micro-batches in flight"));
}

TEST(Validate, RecordedMemoryMustBeWhatTheTensorsSay) {
  Plan plan = small_plan();
  plan.memory[1].activations_bytes /= 2;
  EXPECT_TRUE(mentions(validate_plan(plan), "but the tensors' lifetimes give"));
}

TEST(Validate, LayerCoverageIsChecked) {
  Plan plan = small_plan();
  plan.layout.workers[0].stages[1].layer_begin += 1;  // a gap after the first chunk
  EXPECT_TRUE(mentions(validate_plan(plan), "do not cover the layers"));
}

// Regressions from the reproducers: references out of range are named, never followed.
TEST(Validate, ReferencesOutOfRangeAreNamedNotFollowed) {
  const Plan good = small_plan();
  auto problem = [&](auto&& edit) {
    Plan plan = good;
    edit(plan);
    return first_problem(validate_plan(plan));
  };
  // The embedded cluster has fewer GPUs than the plan's devices (used to crash).
  EXPECT_NE(problem([](Plan& p) { p.cluster = test_support::identical_cluster(2); }).find("embedded cluster has 2 GPUs"),
            std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.layout.workers.clear(); }).find("at least one virtual worker"), std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.tasks[0].worker = 7; }).find("worker 7 does not exist"), std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.layout.workers[0].stages[1].rank = 99; }).find("rank 99 does not exist"),
            std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.memory.pop_back(); }).find("one entry per device"), std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.tasks[0].recompute_flops = 1e30; }).find("recompute_flops <= flops"), std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.tasks[0].device = 99; }).find("device 99 does not exist"), std::string::npos);
  EXPECT_NE(problem([](Plan& p) {
              p.collectives.push_back(Collective{});
            }).find("communicator -1 does not exist"),
            std::string::npos);
  EXPECT_NE(problem([](Plan& p) { p.order.push_back({0, 1 << 30, 0}); }).find("task does not exist"), std::string::npos);
}

TEST(Validate, BrokenPlanFilesGetFieldNamesNotCrashes) {
  const std::string good = write_plan_json(small_plan());
  auto error_of = [](const std::string& text) {
    try {
      read_plan_json(text, "p.json");
    } catch (const InputError& e) {
      return e.field() + ": " + e.message();
    }
    return std::string("no error");
  };
  EXPECT_EQ(error_of(good), "no error");
  EXPECT_NE(error_of(good.substr(0, good.size() / 2)).find("json: not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"format\": \"something\"}").find("format"), std::string::npos);
  // The fingerprint guards the content; without it the content is taken as it is.
  const size_t fp = good.find("\"fingerprint\"");
  std::string unstamped = good;
  unstamped.erase(fp, good.find('\n', fp) + 1 - fp);
  EXPECT_EQ(error_of(unstamped), "no error");
  std::string bad_device = unstamped;
  const size_t at = bad_device.find("\"device\": ", bad_device.find("\n \"tasks\""));  // the table, not a collective's
  bad_device.replace(at, std::string("\"device\": 0").size(), "\"device\": \"x\"");
  EXPECT_EQ(error_of(bad_device), "tasks[0].device: expected an integer, found \"x\"");
  std::string edited = good;
  edited.replace(edited.find("\"microbatches\":4"), 16, "\"microbatches\":5");
  EXPECT_NE(error_of(edited).find("fingerprint: the file says"), std::string::npos) << error_of(edited);
  // Versions 1 and 2 are refused, with how to make a new plan.
  for (const char* old : {"1", "2"}) {
    std::string before = unstamped;
    before.replace(before.find("\"version\": 3"), 12, std::string("\"version\": ") + old);
    EXPECT_NE(error_of(before).find(std::string("version-") + old + " plan; hetflow reads version 3 only. Make the plan again"),
              std::string::npos)
        << error_of(before);
  }
  // Coordinates are on the axes the plan names, each a known axis, one coordinate per axis.
  std::string axes = unstamped;
  axes.replace(axes.find("\"axes\": [\"data\""), std::string("\"axes\": [\"data\"").size(), "\"axes\": [\"sequence\"");
  EXPECT_NE(error_of(axes).find("axes[0]: expected an axis (data, pipeline, tensor, context, expert), found 'sequence'"),
            std::string::npos)
      << error_of(axes);
  std::string axis_twice = unstamped;
  axis_twice.replace(axis_twice.find("\"axes\": [\"data\", \"pipeline\""),
                     std::string("\"axes\": [\"data\", \"pipeline\"").size(), "\"axes\": [\"data\", \"data\"");
  EXPECT_NE(error_of(axis_twice).find("axes[1]: expected each axis once, found 'data' again"), std::string::npos)
      << error_of(axis_twice);
  std::string short_coords = unstamped;
  short_coords.replace(short_coords.find("[0,0,0,0,0]", short_coords.find("\"coords\"")), 11, "[0,0]");
  EXPECT_NE(error_of(short_coords).find("coords[0]: expected one coordinate per axis"), std::string::npos)
      << error_of(short_coords);
  std::string role = unstamped;
  role.replace(role.find("\"role\": \""), 9, "\"role\": \"x");
  EXPECT_NE(error_of(role).find("expected a communicator role"), std::string::npos) << error_of(role);
  // Integers that do not fit are refused, not wrapped.
  std::string huge = unstamped;
  huge.replace(huge.find("\"iterations\":1"), 14, "\"iterations\":4294967297");
  EXPECT_NE(error_of(huge).find("layout.iterations: expected an integer in [1, 2147483647]"), std::string::npos)
      << error_of(huge);
  // A key given twice would silently mean its second value: refused, with the line and path.
  std::string twice = unstamped;
  twice.replace(twice.find("\"iterations\":1"), 14, "\"iterations\":1,\"iterations\":3");
  EXPECT_NE(error_of(twice).find("layout.iterations: given twice in one object"), std::string::npos) << error_of(twice);
  // Deep nesting is refused while parsing, not by recursion.
  EXPECT_NE(error_of(std::string(100000, '[')).find("nested deeper than 64"), std::string::npos);
}

// Regressions from the plan mutation test (tests/tools/plan_mutation_test.cpp).
namespace {

// The plan file without its fingerprint line, so that edits reach the checks after it.
std::string unstamped_plan_file() {
  std::string text = write_plan_json(small_plan());
  const size_t fp = text.find("\"fingerprint\"");
  return text.erase(fp, text.find('\n', fp) + 1 - fp);
}

std::string read_error(const std::string& text) {
  try {
    read_plan_json(text, "p.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Validate, AJsonSyntaxErrorNamesLineAndColumnNotTheParser) {
  const std::string error = read_error(unstamped_plan_file().substr(0, 200));
  EXPECT_NE(error.find("p.json:"), std::string::npos) << error;
  EXPECT_NE(error.find("json: not valid JSON at column"), std::string::npos) << error;
  EXPECT_EQ(error.find("json.exception"), std::string::npos) << error;
  // A number beyond a double's range has no position, but is named (it used to escape as the
  // parser's own out_of_range exception).
  std::string overflow = unstamped_plan_file();
  overflow.replace(overflow.find("\"iterations\":1"), 14, "\"iterations\":1e400");
  EXPECT_EQ(read_error(overflow), "p.json: json: not valid JSON: number overflow parsing '1e400'");
}

// An edit to the name beside an embedded cluster or network alone used to be read, then
// silently undone when the plan was written again.
TEST(Validate, TheNameBesideAnEmbeddedYamlMustBeTheOneInsideIt) {
  const std::string good = unstamped_plan_file();
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    return text.replace(text.find(from), from.size(), to);
  };
  const std::string renamed = read_error(replaced("\"name\": \"identical\"", "\"name\": \"elsewhere\""));
  EXPECT_NE(renamed.find("cluster.name: 'elsewhere' is not the name in cluster.yaml ('identical')"), std::string::npos)
      << renamed;
  const std::string unnamed = read_error(replaced("\"name\": \"equal\",", ""));
  EXPECT_NE(unnamed.find("network.name: is required but missing"), std::string::npos) << unnamed;
}

TEST(Validate, MoreTaskInstancesThanTheBackEndsTakeAreRefused) {
  Plan plan = small_plan();
  plan.layout.iterations = std::numeric_limits<int>::max();  // the estimate used to run for hours
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "layout.iterations: 2147483647 iterations of")) << first_problem(v);
  EXPECT_TRUE(mentions(v, "task instances"));
  plan.layout.iterations = static_cast<int>(kMaxTaskInstances / static_cast<long long>(plan.tasks.size()));
  EXPECT_TRUE(validate_plan(plan).ok()) << first_problem(validate_plan(plan));
}

// Two channels with one source, destination and tag used to validate; the simulator, which
// tells channels apart by those, then paired one's sends with the other's receives.
TEST(Validate, TwoChannelsAlikeAreRefused) {
  Plan plan = small_plan();
  ASSERT_GE(plan.channels.size(), 2u);
  plan.channels[1] = plan.channels[0];
  const Validation v = validate_plan(plan);
  EXPECT_TRUE(mentions(v, "channels[1]: has the source, destination and tag of channels[0]")) << first_problem(v);
}

TEST(Validate, APlanFileStandsAloneAndNamesItsFingerprint) {
  const Plan plan = small_plan();
  const Plan back = read_plan_json(write_plan_json(plan), "p.json");
  EXPECT_TRUE(same_plan(plan, back));
  EXPECT_EQ(back.fingerprint, plan_fingerprint(plan));
  EXPECT_EQ(back.network, plan.network);
  EXPECT_EQ(back.cluster, plan.cluster);
  EXPECT_TRUE(validate_plan(back).ok());
}

TEST(Validate, MixedTensorDegreesAreCheckedPerStage) {
  // Worker 0: one device, then two; worker 1: two, then one.
  const model::Cluster cluster = test_support::identical_cluster(4);
  const model::Network net = model::network_from_spec("gpt:layers=2,hidden=256,heads=4,seq=64", model::Precision::fp16);
  PlanOptions o;
  o.layout_file = test_support::write_file("validate-mixed.yaml", R"(workers:
  - stages: [{devices: [n-0/gpu0], layers: 0-1}, {devices: [n-0/gpu1, n-0/gpu2], layers: 2-3}]
  - stages: [{devices: [n-0/gpu3], layers: 0-3}]
)");
  const CostModel cost(cluster, net.precision);
  const Plan plan = build_plan(cluster, net, make_layout(cluster, net, o, cost), cost);
  EXPECT_EQ(first_problem(validate_plan(plan)), "valid");
  Plan lying = plan;  // a hand edit: the tensor axis's size must be the largest rank's degree
  lying.layout.set_size(Axis::tensor, 1);
  EXPECT_EQ(first_problem(validate_plan(lying)), "layout.axes[0].size: expected 2 (tensor: the most devices a rank has), found 1");
  Plan regrouped = plan;  // the second stage's layers computed twice per micro-batch, not once
  regrouped.layout.workers[0].ranks[1] = {1};
  regrouped.layout.set_size(Axis::tensor, 1);
  EXPECT_TRUE(mentions(validate_plan(regrouped), "virtual worker 0: layer 2 is computed 2 times per micro-batch (expected 1"))
      << first_problem(validate_plan(regrouped));
}

// A tied head in a later chunk on the device of the first chunk (interleaving on one pipeline
// rank): nothing would sum its two copies, so the plan is refused, naming the worker and the
// device; on two ranks the embedding all-reduce sums them and the plan is valid.
TEST(Validate, ATiedHeadOnTheFirstChunksDeviceIsRefused) {
  const model::Network gpt = model::network_from_spec("gpt:layers=4,hidden=32,heads=2,seq=16,vocab=64", model::Precision::fp32);
  for (const int ranks : {1, 2}) {
    const model::Cluster cluster = test_support::identical_cluster(ranks);
    PlanOptions o;
    o.pipeline = ranks;
    o.data = 1;
    o.microbatches = 2;
    o.schedule = "interleaved";
    o.virtual_stages = 2;
    o.precision = gpt.precision;
    const CostModel cost(cluster, gpt.precision);
    const Validation v = validate_plan(build_plan(cluster, gpt, make_layout(cluster, gpt, o, cost), cost));
    if (ranks == 1) {
      EXPECT_TRUE(mentions(v, "virtual worker 0: its chunk 1 holds the head tied to the embedding of its first chunk on "
                              "the same device 0, where no collective sums the two copies"))
          << first_problem(v);
    } else {
      EXPECT_TRUE(v.ok()) << first_problem(v);
    }
  }
  // An untied model's multi-token prediction module keeps its own copy of the table: the
  // same rule, naming the module.
  model::TransformerConfig c =
      *model::network_from_spec("llama:layers=4,hidden=32,heads=2,seq=16,vocab=64", model::Precision::fp32).architecture;
  c.tied_embeddings = false;
  c.mtp_layers = 1;
  const model::Network mtp = model::make_transformer(c, model::Precision::fp32);
  const model::Cluster cluster = test_support::identical_cluster(1);
  PlanOptions o;
  o.pipeline = 1;
  o.data = 1;
  o.microbatches = 2;
  o.schedule = "interleaved";
  o.virtual_stages = 2;
  o.precision = mtp.precision;
  const CostModel cost(cluster, mtp.precision);
  const Validation v = validate_plan(build_plan(cluster, mtp, make_layout(cluster, mtp, o, cost), cost));
  EXPECT_TRUE(mentions(v, "virtual worker 0: its chunk 1 holds the multi-token prediction module mtp1 (its copy of the "
                          "table) tied to the embedding of its first chunk on the same device 0"))
      << first_problem(v);
}
