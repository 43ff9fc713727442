// The executor's data loader: a plan's load tasks (partition/loading.hpp) on the CPU back
// end. Oracles: the same plan without load tasks (the losses and weights, bit for bit), the
// token source's own rows (each micro-batch read once, by its load), and the loader's closed
// form (partition::loader_bound) for a run whose throttled loader is its bottleneck.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "exec/cpu_backend.hpp"
#include "exec/engine.hpp"
#include "exec/token_data.hpp"
#include "exec/training.hpp"
#include "exec_test_util.hpp"
#include "partition/loading.hpp"
#include "traces/metrics.hpp"

namespace hetflow {
namespace {

using partition::Plan;
using partition::TaskKind;

// The cluster with an input path whose one loader worker per node spends `preprocess_s` on a
// sample (nothing else limits it).
model::Cluster with_input(model::Cluster c, double preprocess_s = 0) {
  c.input.given = true;
  c.input.preprocess_s_per_sample = preprocess_s;
  c.input.workers_per_node = 1;
  c.input.prefetch_batches = 2;
  return c;
}

// A token source that says who read what: every samples() call's (step, first sample) and
// the thread that made it.
class Recording final : public exec::TokenSource {
 public:
  explicit Recording(int vocab) : inner_(exec::markov_stream(vocab, 7)) {}
  exec::Batch batch(long long step, int B, int T) const override { return inner_->batch(step, B, T); }
  exec::Batch samples(long long step, int B, int T, int first, int count) const override {
    {
      std::lock_guard lock(mutex_);
      reads_.push_back({step, first, std::this_thread::get_id()});
    }
    return inner_->samples(step, B, T, first, count);
  }
  std::string describe() const override { return "recording " + inner_->describe(); }
  struct Read {
    long long step;
    int first;
    std::thread::id thread;
  };
  std::vector<Read> reads() const {
    std::lock_guard lock(mutex_);
    return reads_;
  }

 private:
  std::unique_ptr<exec::TokenSource> inner_;
  mutable std::mutex mutex_;
  mutable std::vector<Read> reads_;
};

struct Trained {
  std::vector<double> losses;
  exec::SafetensorsFile weights;
  std::vector<Recording::Read> reads;
  std::set<std::thread::id> load_threads;  // the threads load tasks ran on
};

Trained train(const Plan& plan, int steps) {
  auto source = std::make_unique<Recording>(plan.network.architecture->vocab);
  const Recording& recording = *source;
  exec::OptimizerOptions o;
  o.lr = 1e-3;
  exec::Training training(plan, std::move(source), o, 42);
  exec::CpuBackend backend({}, &training);
  exec::EngineOptions e;
  e.iterations = steps;
  std::mutex mutex;
  std::set<std::thread::id> load_threads;
  e.on_task_end = [&](const exec::TaskView& v) {  // on the task's own thread
    if (plan.task(v.task).kind != TaskKind::load) return;
    std::lock_guard lock(mutex);
    load_threads.insert(std::this_thread::get_id());
  };
  const exec::RunResult r = exec::run_plan(plan, backend, e);
  EXPECT_TRUE(r.completed) << r.error;
  return {training.losses(), training.weights(), recording.reads(), load_threads};
}

int count_kind(const Plan& plan, TaskKind kind) {
  return static_cast<int>(std::count_if(plan.tasks.begin(), plan.tasks.end(), [&](const partition::Task& t) { return t.kind == kind; }));
}

// Load tasks read the micro-batches and the forwards take them: every micro-batch of every
// step is read once, on a load task's thread, and training gives the bits of the same plan
// without load tasks (whose forwards read the samples themselves). Under tensor parallelism
// rank 1 of the first stage is not ordered after rank 0's load (Megatron broadcasts the
// batch from rank 0): it may read its micro-batch itself, the same samples; the bits stay.
TEST(Loader, LoadTasksReadTheMicroBatchesAndTrainToTheSameBits) {
  const model::Network net = test_support::tiny_gpt();
  struct Case {
    const char* name;
    partition::PlanOptions options;
  };
  partition::PlanOptions tensor = test_support::pipeline_options(2, 1, 4, "1f1b");
  tensor.tensor = 2;
  for (const Case& c : {Case{"pipeline 2 x data 2, 1F1B", test_support::pipeline_options(2, 2, 4, "1f1b")},
                        Case{"pipeline 2 x data 2, GPipe, micro-batches of 2",
                             [] {
                               partition::PlanOptions o = test_support::pipeline_options(2, 2, 3, "gpipe");
                               o.micro_batch = 2;
                               return o;
                             }()},
                        Case{"tensor 2 x pipeline 2", tensor}}) {
    SCOPED_TRACE(c.name);
    const Plan plain = test_support::planned(model::cpu_cluster(4), net, c.options);
    const Plan loaded = test_support::planned(with_input(model::cpu_cluster(4)), net, c.options);
    ASSERT_EQ(count_kind(plain, TaskKind::load), 0);
    int microbatches = 0;
    for (const partition::VirtualWorker& w : loaded.layout.workers) microbatches += w.microbatches;
    ASSERT_EQ(count_kind(loaded, TaskKind::load), microbatches);
    const int steps = 3;
    const Trained want = train(plain, steps), got = train(loaded, steps);
    ASSERT_EQ(want.losses.size(), static_cast<size_t>(steps));
    EXPECT_EQ(got.losses, want.losses);
    ASSERT_EQ(got.weights.tensors.size(), want.weights.tensors.size());
    for (size_t i = 0; i < want.weights.tensors.size(); ++i) EXPECT_EQ(got.weights.tensors[i].data, want.weights.tensors[i].data);
    // Who read what: each (step, first sample) of every micro-batch, by a load task.
    std::map<std::pair<long long, int>, int> by_load, by_others;
    for (const Recording::Read& r : got.reads) ++(got.load_threads.count(r.thread) ? by_load : by_others)[{r.step, r.first}];
    const int mbs = loaded.layout.micro_batch_size;
    EXPECT_EQ(static_cast<int>(by_load.size()), steps * microbatches);
    for (long long step = 0; step < steps; ++step) {
      for (int m = 0; m < microbatches; ++m) EXPECT_EQ((by_load[{step, m * mbs}]), 1) << "step " << step << " micro-batch " << m;
    }
    if (c.options.tensor == 1) {
      EXPECT_TRUE(by_others.empty()) << by_others.size() << " micro-batches read by forwards";
    }
  }
}

// One run of the plan on the CPU back end (real math or proxies) with a loader throttle: what
// completed and its metrics (the first iteration left out).
struct Ran {
  exec::RunResult result;
  traces::Metrics metrics;
};

Ran run_throttled(const Plan& plan, bool real, double throttle_s, int iterations) {
  exec::Training training(plan, exec::markov_stream(plan.network.architecture->vocab, 7), {}, 42);
  exec::CpuBackend backend({1, 4.0 * 1024 * 1024, throttle_s}, real ? &training : nullptr);
  exec::EngineOptions e;
  e.iterations = iterations;
  Ran ran{exec::run_plan(plan, backend, e), {}};
  EXPECT_TRUE(ran.result.completed) << ran.result.error;
  const partition::CostModel cost(plan.cluster, plan.layout.precision);
  ran.metrics = traces::compute_metrics(ran.result.trace, plan, cost, 1);
  return ran;
}

// A throttled loader slows the run to its closed form. Each node's loader spends T on a
// sample (exec/loader_throttle.hpp), so the node delivers 1/T samples/s: partition's
// loader_bound for the same plan on a cluster whose input path has that preprocessing time
// and one worker. The two virtual workers' loads share the node's one loader, 8 samples an
// iteration. T is 25 ms (200 ms an iteration, against a few ms of this model's compute on
// an idle core), or more where this build and host compute slower (a sanitizer, a loaded
// machine): at least 5 times an unthrottled iteration measured just before, so that loading
// dominates by 5x whatever the host's speed.
//
// Tolerance. The loader keeps its own clock (a late wake-up delays a forward, not the loads
// behind it), so the loads of the measured steps take at least their 8 T each: the measured
// rate exceeds the closed form only by what the steady state's window edges (the compute
// after the last load of the warm-up and of the last step) differ, a few ms over 5 x 8 T.
// It falls below it when the loader idles: when a load's prefetch edge waits for a forward
// that is late, which the 2-micro-batch prefetch (4 loads, 4 T, queued on the node) hides
// while an iteration's compute, at most a fifth of 8 T, is shorter than that. Hence
// [0.85, 1.10]: input-bound at the closed form, with room for a busy machine (measured
// 1.001-1.002 on this project's 2-core machine), and no assertion on the host's own speed.
TEST(Loader, AThrottledRunIsInputBoundAtTheLoadersClosedForm) {
  const auto plan_with = [](double throttle_s) {
    return test_support::planned(with_input(model::cpu_cluster(2), throttle_s), test_support::tiny_gpt(),
                                 test_support::pipeline_options(1, 2, 4, "1f1b"));
  };
  for (const bool real : {true, false}) {
    SCOPED_TRACE(real ? "real math" : "proxies");
    const Plan free = plan_with(0);
    const double samples = free.layout.samples_per_iteration();
    ASSERT_EQ(samples, 8);
    const double compute_s = run_throttled(free, real, 0, 3).metrics.iteration_time_s;
    const double throttle_s = std::max(0.025, 5 * compute_s / samples);
    const Plan plan = plan_with(throttle_s);
    const partition::LoaderBound bound = partition::loader_bound(plan);
    ASSERT_TRUE(bound.bounded);
    EXPECT_EQ(std::string(bound.limit), "preprocessing");
    EXPECT_DOUBLE_EQ(bound.samples_per_s, 1 / throttle_s);
    const int iterations = 6;
    const Ran ran = run_throttled(plan, real, throttle_s, iterations);
    const traces::Metrics& m = ran.metrics;
    const double ratio = m.samples_per_s / bound.samples_per_s;
    EXPECT_GE(ratio, 0.85) << m.samples_per_s << " samples/s measured, the loader's closed form " << bound.samples_per_s;
    EXPECT_LE(ratio, 1.10) << m.samples_per_s << " samples/s measured, the loader's closed form " << bound.samples_per_s;
    // Every load is in the trace, on the load stream, and took at least its samples' time.
    int loads = 0;
    for (const traces::Event& ev : ran.result.trace.events) {
      if (ev.kind != TaskKind::load) continue;
      ++loads;
      EXPECT_EQ(ev.stream, "load");
      EXPECT_GE(ev.end_s - ev.start_s, plan.layout.micro_batch_size * throttle_s - 1e-9) << "task " << ev.task;
    }
    EXPECT_EQ(loads, count_kind(plan, TaskKind::load) * iterations);
    // Waiting for the loader is not compute but input wait: each device computes for at most
    // about a fifth of the iteration and waits for its loads most of the rest.
    for (const traces::DeviceMetrics& d : m.devices) {
      EXPECT_LT(d.utilization, 0.5) << d.name;
      EXPECT_GT(d.input_wait_s, 0.5 * m.iteration_time_s) << d.name;
      EXPECT_LE(d.input_wait_s, d.idle_s + 1e-12) << d.name;
    }
  }
}

}  // namespace
}  // namespace hetflow
