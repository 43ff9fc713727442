// Training checkpoints (exec/training_checkpoint.hpp). The oracle is the run that never
// stopped: resumed from its state after k steps, a run of the same plan reaches the same bits
// (losses, weights, both AdamW moments), on every layout; resumed on another layout, the
// one-device run within the distributed tests' tolerances. Controls show the test can fail:
// moments left at zero or the step count lost give other weights.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "compare_weights.hpp"
#include "exec/cpu_backend.hpp"
#include "exec/segmented_run.hpp"
#include "exec/training.hpp"
#include "exec/training_checkpoint.hpp"
#include "exec_test_util.hpp"
#include "odd_networks.hpp"
#include "model/error.hpp"

namespace hetflow {
namespace {

using exec::OptimizerOptions;
using partition::Plan;
namespace fs = std::filesystem;

model::Network odd_gpt() { return test_support::odd_gpt(3); }
model::Network odd_llama(int layers = 4, int seq = 12) { return test_support::odd_llama(layers, seq); }
// Mixtral's routed experts, 4 of them (as the planner divides them over 2 expert ranks).
model::Network odd_mixtral(int layers = 4) {
  model::TransformerConfig c = *test_support::odd_mixtral(layers, 11).architecture;
  c.moe.experts = 4;
  return model::make_transformer(c, model::Precision::fp32);
}

// A schedule with warm-up and cosine decay, clipping that bites, weight decay: every counter
// a resumed run must carry changes what a step does.
OptimizerOptions optimizer() {
  OptimizerOptions o;
  o.lr = 1e-3;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;
  o.lr_decay_style = exec::LrSchedule::Style::cosine;
  o.lr_warmup_iters = 2;
  o.lr_decay_iters = 6;
  o.min_lr = 1e-4;
  return o;
}

exec::SafetensorsFile start_weights(const Plan& plan) { return test_support::perturbed_weights(plan); }

struct Trained {
  std::vector<double> losses;
  exec::TrainingState state;
  int skipped = 0;
};

void train(const Plan& plan, exec::Training& training, int steps, Trained& out) {
  exec::CpuBackend backend({}, &training);
  exec::EngineOptions e;
  e.iterations = steps;
  const exec::RunResult r = exec::run_plan(plan, backend, e);
  ASSERT_TRUE(r.completed) << r.error;
  ASSERT_EQ(r.trace.compute, "real");
  out.losses = training.losses();
  out.state = training.state();
  out.skipped = training.skipped_steps();
}

Trained fresh(const Plan& plan, int steps, const OptimizerOptions& o, const exec::SafetensorsFile& init) {
  exec::Training training(plan, exec::markov_stream(plan.network.architecture->vocab, 7), o, 42, &init, "start");
  Trained out;
  train(plan, training, steps, out);
  return out;
}

Trained resumed(const Plan& plan, int steps, const OptimizerOptions& o, const exec::TrainingState& from) {
  const exec::InMemoryWeights weights(from.weights, "model"), m(from.exp_avg, "exp_avg"), v(from.exp_avg_sq, "exp_avg_sq");
  exec::Training training(plan, exec::markov_stream(plan.network.architecture->vocab, 7), o, 42,
                          exec::ResumeFrom{weights, m, v, from.progress, "checkpoint"});
  Trained out;
  train(plan, training, steps, out);
  return out;
}

// a and b hold the same tensors, bit for bit.
void expect_same_bits(const exec::SafetensorsFile& a, const exec::SafetensorsFile& b, const std::string& what) {
  ASSERT_EQ(a.tensors.size(), b.tensors.size()) << what;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    ASSERT_EQ(a.tensors[i].name, b.tensors[i].name) << what;
    ASSERT_EQ(a.tensors[i].data.size(), b.tensors[i].data.size()) << what << " " << a.tensors[i].name;
    EXPECT_EQ(0, std::memcmp(a.tensors[i].data.data(), b.tensors[i].data.data(), a.tensors[i].data.size() * sizeof(float)))
        << what << ": " << a.tensors[i].name;
  }
}

void expect_continues_bitwise(const Plan& plan, const OptimizerOptions& o, int first, int total) {
  const exec::SafetensorsFile init = start_weights(plan);
  const Trained straight = fresh(plan, total, o, init);
  const Trained head = fresh(plan, first, o, init);
  ASSERT_EQ(head.state.progress.iterations, first);
  const Trained tail = resumed(plan, total - first, o, head.state);
  ASSERT_EQ(tail.losses.size(), static_cast<size_t>(total - first));
  for (int i = first; i < total; ++i) {
    EXPECT_EQ(tail.losses[static_cast<size_t>(i - first)], straight.losses[static_cast<size_t>(i)]) << "step " << i;
  }
  expect_same_bits(tail.state.weights, straight.state.weights, "weights");
  expect_same_bits(tail.state.exp_avg, straight.state.exp_avg, "exp_avg");
  expect_same_bits(tail.state.exp_avg_sq, straight.state.exp_avg_sq, "exp_avg_sq");
  EXPECT_EQ(tail.state.progress.iterations, straight.state.progress.iterations);
  EXPECT_EQ(tail.state.progress.optimizer_steps, straight.state.progress.optimizer_steps);
  EXPECT_EQ(tail.state.progress.loss_scaler.scale, straight.state.progress.loss_scaler.scale);
}

struct ResumeCase {
  const char* name;
  int pipeline = 1, data = 1, tensor = 1;
  int zero = 0;
  bool sequence_parallel = false;
  int context = 1;
  int experts = 1;  // expert-parallel degree (a mixture of experts then)
  const char* schedule = "1f1b";
  int virtual_stages = 1;
};

// The case's plan: a mixture of experts under expert groups, a longer sequence under context
// parallelism, else a LLaMA.
Plan plan_of(const ResumeCase& c) {
  const model::Network net = c.experts > 1 ? odd_mixtral() : c.context > 1 ? odd_llama(3, 24) : odd_llama();
  partition::PlanOptions o = test_support::pipeline_options(c.pipeline, c.data, 4, c.schedule);
  o.tensor = c.tensor;
  o.sequence_parallel = c.sequence_parallel;
  o.context = c.context;
  o.zero_stage = c.zero;
  o.bucket_bytes = 4096;
  o.experts.parallel = c.experts;
  o.virtual_stages = c.virtual_stages;
  return test_support::planned(model::cpu_cluster(c.pipeline * c.data * c.tensor * c.context), net, o);
}

class ResumedTraining : public testing::TestWithParam<ResumeCase> {};

TEST_P(ResumedTraining, ContinuesAsTheRunThatNeverStopped) {
  const Plan plan = plan_of(GetParam());
  ASSERT_EQ(plan.layout.sync.zero.stage, GetParam().zero);
  expect_continues_bitwise(plan, optimizer(), 3, 5);
}

const ResumeCase kResumeCases[] = {
    {"one_device"},
    {"pipeline_2_data_2", 2, 2},
    {"zero_1", 2, 2, 1, 1},
    {"zero_2", 2, 2, 1, 2},
    {"zero_3", 2, 2, 1, 3},
    {"tensor_2_sequence_parallel_zero_2", 1, 2, 2, 2, true},
    {"context_2_zero_3", 1, 2, 1, 3, false, 2},
    {"experts_2_zero_1", 2, 2, 1, 1, false, 1, 2},
    {"experts_2_zero_3", 2, 2, 1, 3, false, 1, 2},
    {"split_w", 2, 2, 1, 0, false, 1, 1, "1f1b-split-w"},
    {"interleaved_zero_2", 2, 2, 1, 2, false, 1, 1, "interleaved", 2},
};

INSTANTIATE_TEST_SUITE_P(Layouts, ResumedTraining, testing::ValuesIn(kResumeCases),
                         [](const testing::TestParamInfo<ResumeCase>& p) { return std::string(p.param.name); });

// --- a run cut at checkpoints (exec/segmented_run.hpp, `hetflow run --save-interval`) ---

// One Training run in segments, its state taken at each cut as `hetflow run` writes it: the
// run reaches the bits of the one that was not cut, and each state is the state of a run
// that stopped there.
void expect_segments_as_one_run(const Plan& plan, const OptimizerOptions& o, const std::vector<int>& cuts, int total) {
  const exec::SafetensorsFile init = start_weights(plan);
  const Trained straight = fresh(plan, total, o, init);
  exec::Training training(plan, exec::markov_stream(plan.network.architecture->vocab, 7), o, 42, &init, "start");
  exec::CpuBackend backend({}, &training);
  exec::EngineOptions e;
  e.iterations = total;
  std::vector<exec::TrainingState> saved;
  const exec::SegmentedResult r = exec::run_in_segments(plan, backend, e, cuts, [&](int) {
    training.collect_at_root(true);
    saved.push_back(training.state());
  });
  ASSERT_TRUE(r.run.completed) << r.run.error;
  ASSERT_EQ(saved.size(), cuts.size());
  EXPECT_EQ(training.losses(), straight.losses);
  const exec::TrainingState end = training.state();
  expect_same_bits(end.weights, straight.state.weights, "weights");
  expect_same_bits(end.exp_avg, straight.state.exp_avg, "exp_avg");
  expect_same_bits(end.exp_avg_sq, straight.state.exp_avg_sq, "exp_avg_sq");
  EXPECT_EQ(end.progress.iterations, total);
  for (size_t k = 0; k < cuts.size(); ++k) {
    const Trained stopped = fresh(plan, cuts[k], o, init);
    const std::string at = "at the checkpoint after " + std::to_string(cuts[k]) + " steps: ";
    EXPECT_EQ(saved[k].progress.iterations, cuts[k]);
    EXPECT_EQ(saved[k].progress.optimizer_steps, stopped.state.progress.optimizer_steps);
    expect_same_bits(saved[k].weights, stopped.state.weights, at + "weights");
    expect_same_bits(saved[k].exp_avg, stopped.state.exp_avg, at + "exp_avg");
    expect_same_bits(saved[k].exp_avg_sq, stopped.state.exp_avg_sq, at + "exp_avg_sq");
  }
}

class SegmentedTraining : public testing::TestWithParam<ResumeCase> {};

TEST_P(SegmentedTraining, CutAtCheckpointsGoesOnAsOneRun) {
  expect_segments_as_one_run(plan_of(GetParam()), optimizer(), {1, 3}, 4);
}

INSTANTIATE_TEST_SUITE_P(Layouts, SegmentedTraining, testing::ValuesIn(kResumeCases),
                         [](const testing::TestParamInfo<ResumeCase>& p) { return std::string(p.param.name); });

// Parameter servers, and WSP's workers a step behind the servers: the pulled weights a
// worker adopts after the cut are the ones it would have adopted in one run.
TEST(SegmentedTraining, ParameterServersAndStaleWeightsCarryOver) {
  for (const auto& [sync, staleness] : {std::pair{partition::SyncKind::ps, 0}, {partition::SyncKind::wsp, 1}}) {
    partition::PlanOptions o = test_support::pipeline_options(sync == partition::SyncKind::ps ? 2 : 1, 2, 2, "1f1b");
    o.sync = sync;
    o.staleness = staleness;
    const Plan plan = test_support::planned(model::cpu_cluster(o.pipeline * 2), odd_llama(), o);
    SCOPED_TRACE(staleness > 0 ? "wsp" : "ps");
    expect_segments_as_one_run(plan, optimizer(), {2}, 4);
  }
}

// Dynamic loss scaling that skips steps now and then (a final norm's gains 30 times a
// checkpoint's overflow the gradients at 2^126 on some batches; hysteresis 1 halves the scale
// at each): the scaler's state and the count of steps taken, which the schedule and Adam's
// bias correction read, carry over, at every point a run may stop.
TEST(ResumedTraining, CarriesTheLossScalerAndTheStepsTaken) {
  const model::Network net = odd_gpt();
  const Plan plan = test_support::planned(model::cpu_cluster(4), net, test_support::pipeline_options(2, 2, 2, "1f1b"));
  OptimizerOptions o = optimizer();
  o.loss_scale.dynamic = true;
  o.loss_scale.initial_loss_scale = std::ldexp(1.0, 126);
  o.loss_scale.hysteresis = 1;
  o.loss_scale.loss_scale_window = 3;
  exec::SafetensorsFile init = start_weights(plan);
  for (auto& t : init.tensors) {
    if (t.name == "transformer.ln_f.weight") {
      for (float& x : t.data) x *= 30;
    }
  }
  const Trained straight = fresh(plan, 8, o, init);
  ASSERT_GT(straight.skipped, 0);  // the case this test is about
  ASSERT_LT(straight.skipped, 7);
  EXPECT_EQ(straight.state.progress.optimizer_steps, 8 - straight.skipped);
  for (const int first : {1, 3, 5, 7}) {
    SCOPED_TRACE("resumed after " + std::to_string(first));
    const Trained head = fresh(plan, first, o, init);
    const Trained tail = resumed(plan, 8 - first, o, head.state);
    for (int i = first; i < 8; ++i) {
      EXPECT_EQ(tail.losses[static_cast<size_t>(i - first)], straight.losses[static_cast<size_t>(i)]) << "step " << i;
    }
    expect_same_bits(tail.state.weights, straight.state.weights, "weights");
    EXPECT_EQ(tail.state.progress.loss_scaler.scale, straight.state.progress.loss_scaler.scale);
    EXPECT_EQ(tail.state.progress.loss_scaler.growth_tracker, straight.state.progress.loss_scaler.growth_tracker);
    EXPECT_EQ(tail.state.progress.optimizer_steps, straight.state.progress.optimizer_steps);
  }
}

// The controls: what the checkpoint carries matters. Moments left at zero, or the steps taken
// forgotten (Adam's bias correction and the schedule start over), give other weights.
TEST(ResumedTraining, WithoutItsMomentsOrItsStepCountARunGoesElsewhere) {
  const Plan plan = test_support::planned(model::cpu_cluster(2), odd_llama(), test_support::pipeline_options(2, 1, 4, "1f1b"));
  const exec::SafetensorsFile init = start_weights(plan);
  const Trained straight = fresh(plan, 5, optimizer(), init);
  const Trained head = fresh(plan, 3, optimizer(), init);
  exec::TrainingState no_moments = head.state;
  for (auto* file : {&no_moments.exp_avg, &no_moments.exp_avg_sq}) {
    for (auto& t : file->tensors) std::fill(t.data.begin(), t.data.end(), 0.0f);
  }
  exec::TrainingState no_steps = head.state;
  no_steps.progress.optimizer_steps = 0;
  for (const auto& [what, state] : {std::pair{"moments at zero", &no_moments}, {"no steps taken", &no_steps}}) {
    const Trained tail = resumed(plan, 2, optimizer(), *state);
    EXPECT_GT(test_support::compare_weights(tail.state.weights, straight.state.weights).whole_relative, 1e-6) << what;
  }
}

// Whole tensors whatever the layout: a run of ZeRO 3 over a pipeline of tensor-parallel
// stages stops, and one device goes on from its checkpoint (and the other way round), as the
// one-device run that never stopped, within the distributed tests' tolerances.
TEST(ResumedTraining, AnotherLayoutGoesOnFromTheCheckpoint) {
  const model::Network net = odd_llama();
  partition::PlanOptions sharded = test_support::pipeline_options(2, 2, 4, "1f1b");
  sharded.tensor = 2;
  sharded.zero_stage = 3;
  sharded.bucket_bytes = 4096;
  const Plan many = test_support::planned(model::cpu_cluster(8), net, sharded);
  const Plan one = test_support::planned(model::cpu_cluster(1), net, test_support::pipeline_options(1, 1, 8, "1f1b"));
  const exec::SafetensorsFile init = start_weights(one);
  const Trained want = fresh(one, 5, optimizer(), init);
  for (const auto& [from, to] : {std::pair{&many, &one}, {&one, &many}}) {
    const Trained head = fresh(*from, 3, optimizer(), init);
    const Trained tail = resumed(*to, 2, optimizer(), head.state);
    const std::string what = from == &many ? "sharded, then one device" : "one device, then sharded";
    for (int i = 3; i < 5; ++i) {
      EXPECT_NEAR(tail.losses[static_cast<size_t>(i - 3)], want.losses[static_cast<size_t>(i)], 1e-5 * want.losses[static_cast<size_t>(i)])
          << what << " step " << i;
    }
    const auto diff = test_support::compare_weights(tail.state.weights, want.state.weights);
    EXPECT_TRUE(diff.same_names) << what;
    EXPECT_LT(diff.whole_relative, 1e-5) << what;
    EXPECT_LT(diff.worst_relative, 1e-4) << what << ": " << diff.worst;
    EXPECT_LT(test_support::compare_weights(tail.state.exp_avg_sq, want.state.exp_avg_sq).whole_relative, 1e-4) << what;
  }
}

// A run takes the data where the checkpoint left it and counts its steps in the same global
// batches: another batch size is refused, naming the state's field.
TEST(ResumedTraining, AnotherGlobalBatchIsRefused) {
  const model::Network net = odd_llama();
  const Plan four = test_support::planned(model::cpu_cluster(1), net, test_support::pipeline_options(1, 1, 4, "1f1b"));
  const Plan eight = test_support::planned(model::cpu_cluster(1), net, test_support::pipeline_options(1, 1, 8, "1f1b"));
  const Trained head = fresh(four, 1, optimizer(), start_weights(four));
  try {
    resumed(eight, 1, optimizer(), head.state);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "global_batch") << e.what();
    EXPECT_NE(std::string(e.what()).find("4 samples"), std::string::npos) << e.what();
  }
}

// Parameter servers keep the weights and moments themselves: a checkpoint takes the servers'
// and a resumed run's servers start from them, bit for bit as the run that never stopped (a
// constant loss scale, so the steps are judged; one server and two, tensor parallelism).
// Under WSP the resumed run's workers start together from the servers' latest weights.
TEST(ResumedTraining, ParameterServersKeepAndResumeTheirState) {
  for (const auto& [sync, tensor] : {std::pair{partition::SyncKind::ps, 1}, {partition::SyncKind::ps, 2}}) {
    partition::PlanOptions o = test_support::pipeline_options(2, 2, 2, "1f1b");
    o.sync = sync;
    o.tensor = tensor;
    const Plan plan = test_support::planned(model::cpu_cluster(4 * tensor), odd_llama(), o);
    OptimizerOptions scaled = optimizer();
    scaled.loss_scale.loss_scale = 1024;
    SCOPED_TRACE("tensor " + std::to_string(tensor));
    expect_continues_bitwise(plan, scaled, 2, 4);
  }
  partition::PlanOptions o = test_support::pipeline_options(1, 2, 2, "1f1b");
  o.sync = partition::SyncKind::wsp;
  o.staleness = 1;
  const Plan wsp = test_support::planned(model::cpu_cluster(2), odd_llama(), o);
  o.sync = partition::SyncKind::ps;
  o.staleness = 0;
  const Plan synchronous = test_support::planned(model::cpu_cluster(2), odd_llama(), o);
  const Trained head = fresh(wsp, 3, optimizer(), start_weights(wsp));
  const Trained tail = resumed(wsp, 2, optimizer(), head.state);
  EXPECT_EQ(tail.state.progress.iterations, 5);
  // Its first step's forward reads the servers' latest weights, as a synchronous run's does.
  EXPECT_EQ(tail.losses.front(), resumed(synchronous, 1, optimizer(), head.state).losses.front());
}

// --- the folder ---

struct TempFolder {
  fs::path path = fs::temp_directory_path() / ("hetflow-ckpt-" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
                                               "-" + std::to_string(reinterpret_cast<std::uintptr_t>(this)));
  TempFolder() { fs::create_directories(path); }
  ~TempFolder() { fs::remove_all(path); }
};

// Written and opened again, a checkpoint resumes as the state in memory did; writing over it
// replaces it whole and leaves nothing beside it.
TEST(TrainingCheckpoint, AFolderResumesAsTheStateInMemory) {
  const Plan plan = test_support::planned(model::cpu_cluster(4), odd_llama(), test_support::pipeline_options(2, 2, 4, "1f1b"));
  const exec::SafetensorsFile init = start_weights(plan);
  const Trained head = fresh(plan, 2, optimizer(), init), straight = fresh(plan, 4, optimizer(), init);
  const TempFolder temp;
  const std::string folder = (temp.path / "ckpt").string();
  exec::write_training_checkpoint(folder, fresh(plan, 1, optimizer(), init).state);  // (replaced next)
  exec::write_training_checkpoint(folder, head.state);
  EXPECT_FALSE(fs::exists(folder + ".partial"));
  EXPECT_FALSE(fs::exists(folder + ".previous"));
  const exec::TrainingCheckpoint checkpoint(folder);
  EXPECT_EQ(checkpoint.progress().iterations, 2);
  exec::Training training(plan, exec::markov_stream(101, 7), optimizer(), 42, checkpoint.resume());
  Trained tail;
  train(plan, training, 2, tail);
  expect_same_bits(tail.state.weights, straight.state.weights, "weights");
  // Its weights are a model file as --init-weights takes it.
  expect_same_bits(exec::read_checkpoint(folder), head.state.weights, "model.safetensors");
}

TEST(TrainingCheckpoint, TheStateRoundTrips) {
  exec::TrainingProgress p;
  p.iterations = 12;
  p.optimizer_steps = 9;
  p.global_batch = 32;
  p.seq_len = 1024;
  p.loss_scaler = {true, 65536, 7, 1};
  p.model = "llama, 4 layers";
  const std::string text = exec::training_progress_json(p);
  const exec::TrainingProgress back = exec::parse_training_progress(text, "trainer_state.json");
  EXPECT_EQ(back.iterations, 12);
  EXPECT_EQ(back.optimizer_steps, 9);
  EXPECT_EQ(back.global_batch, 32);
  EXPECT_EQ(back.seq_len, 1024);
  EXPECT_TRUE(back.loss_scaler.dynamic);
  EXPECT_EQ(back.loss_scaler.scale, 65536);
  EXPECT_EQ(back.loss_scaler.growth_tracker, 7);
  EXPECT_EQ(back.loss_scaler.hysteresis_tracker, 1);
  EXPECT_EQ(back.model, p.model);
  EXPECT_EQ(exec::training_progress_json(back), text);
}

// A state at fault is refused with its file, line and field.
TEST(TrainingCheckpoint, BadStatesNameTheirField) {
  exec::TrainingProgress p;
  p.iterations = 4;
  p.optimizer_steps = 4;
  p.global_batch = 8;
  p.seq_len = 12;
  const std::string good = exec::training_progress_json(p);
  const auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    const size_t at = text.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return text.replace(at, from.size(), to);
  };
  const struct {
    std::string text, field;
  } cases[] = {
      {"[]", "(top level)"},
      {replaced("\"hetflow-training-checkpoint\"", "\"other\""), "format"},
      {replaced("\"version\": 1", "\"version\": 2"), "version"},
      {replaced("\"iterations\": 4", "\"iterations\": -1"), "iterations"},
      {replaced("\"optimizer_steps\": 4", "\"optimizer_steps\": 5"), "optimizer_steps"},  // more steps than iterations
      {replaced("\"global_batch\": 8", "\"global_batch\": \"8\""), "global_batch"},
      {replaced("\"seq_len\": 12,", ""), "seq_len"},
      {replaced("\"scale\": 1.0", "\"scale\": 0"), "loss_scale.scale"},
      {replaced("\"growth_tracker\": 0", "\"growth_tracker\": 1.5"), "loss_scale.growth_tracker"},
  };
  for (const auto& c : cases) {
    try {
      (void)exec::parse_training_progress(c.text, "trainer_state.json");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), c.field) << e.what();
      EXPECT_EQ(e.file(), "trainer_state.json") << e.what();
      if (c.field != "seq_len" && c.field != "(top level)") {
        EXPECT_GT(e.line(), 1) << e.what();
      }
    }
  }
}

// A folder that is not a checkpoint, or whose moments are not of its weights, is refused
// before anything trains.
TEST(TrainingCheckpoint, FoldersThatAreNotCheckpointsAreRefused) {
  const TempFolder temp;
  EXPECT_THROW(exec::TrainingCheckpoint((temp.path / "absent").string()), InputError);
  EXPECT_THROW(exec::TrainingCheckpoint(temp.path.string()), InputError);  // no trainer_state.json
  const Plan plan = test_support::planned(model::cpu_cluster(1), odd_llama(2), test_support::pipeline_options(1, 1, 2, "1f1b"));
  exec::TrainingState state = fresh(plan, 1, optimizer(), start_weights(plan)).state;
  state.exp_avg.tensors.pop_back();
  const std::string folder = (temp.path / "ckpt").string();
  exec::write_training_checkpoint(folder, state);
  try {
    exec::TrainingCheckpoint opened(folder);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.file()).find("exp_avg.safetensors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace hetflow
