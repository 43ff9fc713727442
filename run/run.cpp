#include "run/run.hpp"

#include <unistd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "exec/checkpoint.hpp"
#include "exec/cpu_backend.hpp"
#include "exec/cuda_backend.hpp"
#include "exec/token_data.hpp"
#include "exec/training_checkpoint.hpp"
#include "kernels/transformer_cuda.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/loading.hpp"

namespace hetflow::run {

namespace {

namespace u = model::units;

// This host's memory, or under mpirun the least of the ranks' hosts': every rank then makes
// the same choice between real math and proxies (ranks of both kinds would not meet).
double smallest_host_bytes(const exec::Ranks& ranks) {
  const double here = static_cast<double>(::sysconf(_SC_PHYS_PAGES)) * static_cast<double>(::sysconf(_SC_PAGE_SIZE));
  if (ranks.alone()) return here;
  std::vector<std::byte> mine, least;
  exec::put(mine, here);
  const std::vector<std::vector<std::byte>> all = ranks.gather(mine);
  if (ranks.rank() == 0) {
    double smallest = here;
    for (const auto& bytes : all) smallest = std::min(smallest, exec::ByteReader(bytes).get<double>());
    exec::put(least, smallest);
  }
  const std::vector<std::byte> agreed = ranks.broadcast(least);
  return exec::ByteReader(agreed).get<double>();
}

}  // namespace

TrainingSetup make_training(const Request& r, const exec::Ranks& ranks) {
  TrainingSetup t;
  if (r.compute == "proxy") return t;
  const partition::Plan& plan = r.plan;
  try {
    if (!plan.network.architecture) {
      throw PlanError("the network '" + plan.network.name + "' is not a transformer: real math covers GPT-2 and LLaMA "
                      "style decoders, other networks run as FLOP-matched proxies");
    }
    const exec::DecoderShape shape = exec::decoder_shape(*plan.network.architecture);  // a PlanError when not covered
    if (r.backend == "cuda" && shape.HS > kernels::kMaxCudaHeadSize) {
      throw PlanError("its heads are " + std::to_string(shape.HS) + " wide, and the CUDA attention kernels take up to " +
                      std::to_string(kernels::kMaxCudaHeadSize));
    }
    // FP32 weights, gradients and two Adam moments on every replica: auto keeps real math to
    // what fits in a quarter of this host's memory (a GPU-sized model runs as proxies).
    const double state_bytes =
        16.0 * plan.network.param_count() * static_cast<double>(std::max<size_t>(1, plan.layout.workers.size()));
    if (r.compute == "auto") {
      const double host_bytes = smallest_host_bytes(ranks);
      if (host_bytes > 0 && state_bytes > host_bytes / 4) {
        throw PlanError("its FP32 training state (" + u::human_bytes(state_bytes) + ") is more than a quarter of " +
                        (ranks.alone() ? "this host's " : "the smallest of the ranks' hosts' ") + u::human_bytes(host_bytes) +
                        " of memory (--compute real runs it anyway)");
      }
    }
    const int vocab = plan.network.architecture->vocab;
    std::unique_ptr<exec::TokenSource> data;
    if (!r.data_path.empty()) {
      data = exec::open_token_file(r.data_path, vocab);
    } else {
      auto markov = exec::markov_stream(vocab, r.seed);
      t.entropy_nats = markov->entropy_nats();
      data = std::move(markov);
    }
    t.data = data->describe();
    if (!r.resume.empty()) {
      // Its tensors are read as the training is set up, each rank its shares.
      const exec::TrainingCheckpoint checkpoint(r.resume);
      t.training = std::make_unique<exec::Training>(plan, std::move(data), r.optimizer, r.seed, checkpoint.resume(), &ranks);
      t.resumed_iterations = checkpoint.progress().iterations;
    } else if (!r.init_weights.empty()) {
      // Each rank reads the tensors of its own parameters, one at a time.
      const exec::Checkpoint init(r.init_weights);
      t.training = std::make_unique<exec::Training>(plan, std::move(data), r.optimizer, r.seed, init, &ranks);
    } else {
      t.training = std::make_unique<exec::Training>(plan, std::move(data), r.optimizer, r.seed, nullptr, "", &ranks);
    }
  } catch (const PlanError& e) {
    if (r.compute == "real") throw;
    t.proxy_reason = e.what();
  }
  if (t.training && r.flop_scale != 1) {
    // Real math does the model's work, all of it; a scaled prediction would not be of this run.
    throw InputError("<command line>", 0, "--flop-scale",
                     "scales proxies' work, and this run trains for real (give --compute proxy to scale it)");
  }
  if (!t.training) {
    for (const auto& [option, value] : {std::pair{"--data-path", r.data_path}, {"--init-weights", r.init_weights},
                                        {"--save-weights", r.save_weights}, {"--resume", r.resume},
                                        {"--save-checkpoint", r.save_checkpoint}}) {
      if (!value.empty()) throw InputError("<command line>", 0, option, "needs real math, and this plan runs proxies: " + t.proxy_reason);
    }
  }
  return t;
}

std::vector<int> checkpoint_cuts(const Request& r) {
  std::vector<int> cuts;
  if (r.save_interval <= 0 || r.save_checkpoint.empty()) return cuts;
  const long long iterations = r.warmup + r.steps, n = r.save_interval;
  // (The first step count at or after the run's first that is a multiple of the interval.)
  for (long long done = (r.resumed_iterations / n + 1) * n - r.resumed_iterations; done < iterations; done += n) {
    cuts.push_back(static_cast<int>(done));
  }
  return cuts;
}

partition::Task scaled(partition::Task t, double flop_scale) {
  t.flops *= flop_scale;
  t.recompute_flops *= flop_scale;
  t.memory_bytes *= flop_scale;
  return t;
}

partition::Plan scaled(const partition::Plan& plan, double flop_scale) {
  partition::Plan out = plan;
  for (partition::Task& t : out.tasks) t = scaled(t, flop_scale);
  return out;
}

partition::Plan as_run(const partition::Plan& plan, const Request& r) {
  partition::Plan out = scaled(plan, r.flop_scale);
  model::InputPath& in = out.cluster.input;
  in.shared_read_bytes_per_s = in.node_read_bytes_per_s = 0;
  in.preprocess_s_per_sample = r.loader_throttle_s_per_sample;
  in.workers_per_node = 1;
  return out;
}

double longest_task_s(const partition::Plan& plan, const partition::CostModel& cost, double flop_scale) {
  double longest = 0;
  for (const partition::Task& t : plan.tasks) {
    if (partition::is_compute(t.kind)) longest = std::max(longest, cost.task_compute_time_s(plan, scaled(t, flop_scale)));
  }
  return longest;
}

std::unique_ptr<exec::Backend> make_backend(const Request& r, const TrainingSetup& training, const exec::Ranks& ranks) {
  if (r.backend == "cuda") {
    // Under mpirun each process drives its block of the devices on its node's GPUs.
    return std::make_unique<exec::CudaBackend>(
        exec::CudaBackendOptions{r.flop_scale, r.max_buffer_bytes, {}, false, &ranks, training.training.get()});
  }
  return std::make_unique<exec::CpuBackend>(
      exec::CpuBackendOptions{r.flop_scale, r.max_buffer_bytes, r.loader_throttle_s_per_sample}, training.training.get(), &ranks);
}

exec::EngineOptions engine_options(const Request& r, const partition::CostModel& cost, exec::Ranks& ranks) {
  exec::EngineOptions engine;
  engine.watchdog_s = r.watchdog_s;
  // A long task is not a stall: unless told, the watchdog waits at least ten times the
  // longest compute task the cost model predicts for this run.
  if (!r.watchdog_given) engine.watchdog_s = std::max(r.watchdog_s, 10 * longest_task_s(r.plan, cost, r.flop_scale));
  // Nor is a throttled loader: a load may wait for its node's whole iteration of samples.
  if (!r.watchdog_given && r.loader_throttle_s_per_sample > 0) {
    engine.watchdog_s = std::max(engine.watchdog_s, 10 * partition::loader_bound(as_run(r.plan, r)).iteration_s);
  }
  engine.max_buffer_bytes = r.max_buffer_bytes;
  engine.ranks = &ranks;
  return engine;
}

}  // namespace hetflow::run
