// hetflow run: execute a plan (a file, or built from the plan options) on a back end; print
// each step's time (and loss, when it trains) and the measured figures beside the
// simulator's prediction and the analytic estimate of the same plan; write the trace. Three
// steps, as in simulate: read what was asked (run_request.cpp), run it (run/run.hpp, with the
// progress line here), report it (run/compare.hpp's comparison, printed by run_report.cpp).
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>

#include "exec/engine.hpp"
#include "exec/interrupt.hpp"
#include "exec/ranks.hpp"
#include "exec/safetensors.hpp"
#include "exec/segmented_run.hpp"
#include "exec/training.hpp"
#include "exec/training_checkpoint.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/validate.hpp"
#include "run/compare.hpp"
#include "run/run.hpp"
#include "tools/cli.hpp"
#include "tools/options.hpp"
#include "tools/plan_options.hpp"
#include "tools/run_prediction.hpp"
#include "tools/run_progress.hpp"
#include "tools/run_report.hpp"
#include "tools/run_request.hpp"
#include "traces/metrics.hpp"
#include "traces/trace_io.hpp"

namespace hetflow::tools {

void run_options(po::options_description& options) {
  add_plan_options(options, PlanCommand::run);
  options.add_options()
      ("plan", po::value<std::string>(), "run this plan file instead of planning from the options")
      ("backend", po::value<std::string>()->default_value("cpu"), "cpu (threads in this process) | cuda (local GPUs, cuBLAS and NCCL)")
      ("steps", po::value<int>()->default_value(3), "iterations measured")
      ("progress", "show the progress line also where stderr is not a terminal (a line a second)")
      ("yes", "start a run predicted to take more than 10 minutes without asking (asked when stdin is a terminal)")
      ("warmup", po::value<int>()->default_value(1), "iterations run first and left out of the figures")
      ("watchdog", po::value<std::string>()->default_value("60 s"), "stop when no task completes for this long")
      ("loader-throttle", po::value<std::string>(),
       "slow the data loader for tests: each node's loader spends this time on every sample (e.g. 20ms; "
       "the cluster needs an input: section)")
      ("flop-scale", po::value<std::string>()->default_value("1"),
       "run compute tasks with their FLOPs times this (e.g. 0.001 for a GPU plan on a CPU)")
      ("max-buffer", po::value<std::string>()->default_value("4 MiB"),
       "host bytes allocated per tensor and moved per message at most (the accounting keeps the plan's bytes)")
      ("compute", po::value<std::string>()->default_value("auto"),
       "real (the model's training math) | proxy (FLOP-matched sgemm) | auto (real where covered)")
      ("data-path", po::value<std::string>(), "training tokens, an llm.c token file (default: a seeded Markov stream)")
      ("init-weights", po::value<std::string>(),
       "start from these weights (safetensors, HuggingFace names): a file, a sharded checkpoint's index.json, or their directory")
      ("save-weights", po::value<std::string>(), "write the FP32 weights after the last step (safetensors)")
      ("save-checkpoint", po::value<std::string>(),
       "write a training checkpoint folder after the last step: weights, AdamW moments, counters (--resume goes on from it)")
      ("save-interval", po::value<int>(),
       "write --save-checkpoint's folder also after every step this many steps since the first run's first (a resumed "
       "run's count on; each write replaces the last)")
      ("resume", po::value<std::string>(),
       "go on from a training checkpoint folder: its weights, moments, data position, step count and loss scale")
      ("seed", po::value<long long>()->default_value(1234), "seed of the initial weights and the Markov stream")
      ("lr", po::value<std::string>()->default_value("3e-4"), "AdamW learning rate (the schedule's peak)")
      ("lr-decay-style", po::value<std::string>()->default_value("constant"),
       "constant | linear | cosine | inverse-square-root (Megatron's schedule)")
      ("lr-warmup-iters", po::value<int>()->default_value(0), "steps of linear warm-up from 0 to --lr")
      ("lr-decay-iters", po::value<int>(),
       "the step the decay reaches --min-lr (default: --warmup + --steps, one past the last, as Megatron's --train-iters)")
      ("min-lr", po::value<std::string>()->default_value("0"), "the rate the decay ends at")
      ("adam-beta1", po::value<std::string>()->default_value("0.9"), "AdamW beta1")
      ("adam-beta2", po::value<std::string>()->default_value("0.999"), "AdamW beta2")
      ("adam-eps", po::value<std::string>()->default_value("1e-8"), "AdamW epsilon")
      ("weight-decay", po::value<std::string>()->default_value("0.01"), "decoupled weight decay of matrices and embeddings")
      ("clip-grad", po::value<std::string>()->default_value("1.0"), "clip gradients to this global norm (0: off)")
      ("moe-router-bias-update-rate", po::value<std::string>()->default_value("1e-3"),
       "a sigmoid router's balancing bias step (DeepSeek-V3's; 0: frozen)")
      ("loss-scale", po::value<std::string>(), "constant loss scale, a power of two (default: none; dynamic for fp16 GEMMs)")
      ("initial-loss-scale", po::value<std::string>()->default_value("4294967296"), "dynamic loss scale's start (2^32)")
      ("min-loss-scale", po::value<std::string>()->default_value("1"), "dynamic loss scale's floor")
      ("loss-scale-window", po::value<std::string>()->default_value("1000"), "good steps before the loss scale doubles")
      ("hysteresis", po::value<std::string>()->default_value("2"), "steps with non-finite gradients before it halves")
      ("trace", po::value<std::string>(), "write the trace as CSV (the traces/ format)")
      ("chrome", po::value<std::string>(), "write a Chrome trace JSON (open in ui.perfetto.dev)")
      ("metrics", po::value<std::string>(), "write per-iteration metrics as CSV (also of a partial run)");
}

int run_run(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("run options");
  po::variables_map vm;
  if (!parse_command_options("run", args, options, vm, out)) return 0;
  // 1. What was asked.
  run::Request request = read_run_request(vm);
  const partition::Plan& plan = request.plan;
  partition::require_valid(plan);
  const model::Calibration calibration = read_calibration_option(vm, plan.cluster);
  const partition::CostModel cost(plan.cluster, plan.layout.precision, calibration);

  // 2. The run: every device here as threads, or under mpirun this rank's devices; rank 0
  // then holds the whole run and reports it, the other ranks only say whether it completed.
  exec::Ranks& ranks = exec::Ranks::world();
  double predicted_s = 0;
  if (ranks.rank() == 0) {
    const int iterations = request.warmup + request.steps;
    predicted_s = predicted_run_wall_s(run::as_run(plan, request), iterations, request.backend, cost);
    confirm_run(predicted_s, iterations, vm.count("yes") > 0);
  }
  if (ranks.rank() == 0) {  // (the rank that writes them) before the run, not after it
    for (const char* option : {"trace", "chrome", "metrics"}) {
      if (vm.count(option)) check_writable(vm[option].as<std::string>(), std::string("--") + option);
    }
    if (!request.save_weights.empty()) check_writable(request.save_weights, "--save-weights");
    if (!request.save_checkpoint.empty()) check_writable_folder(request.save_checkpoint, "--save-checkpoint");
  }
  const run::TrainingSetup training = run::make_training(request, ranks);
  const std::unique_ptr<exec::Backend> backend = run::make_backend(request, training, ranks);
  exec::EngineOptions engine = run::engine_options(request, cost, ranks);
  // Under mpirun rank 0 shows its own devices' tasks, without the loss (another rank's to say).
  RunProgressLine progress(predicted_s, ranks.alone() ? training.training.get() : nullptr, ranks.rank() == 0,
                           vm.count("progress") > 0);
  engine.on_progress = progress.reporter();
  // A file that cannot be written now (checked before the run: a full disk, say) is said
  // after the report, which is not lost; the run's own status stands if it failed.
  std::vector<std::string> unwritten;  // the failures' messages
  std::set<std::string> failed;         // and their options
  // --save-interval: the run stops between steps to write the checkpoint (every rank gathers
  // to rank 0, which writes); one that cannot be written is said at once, and the run goes on.
  long long last_checkpoint = -1;  // the step after which the last one was written
  const auto checkpoint = [&](int done) {
    training.training->collect_at_root(true);
    if (ranks.rank() != 0) return;
    try {
      exec::write_training_checkpoint(request.save_checkpoint, training.training->state());
      last_checkpoint = training.resumed_iterations + done;
    } catch (const InputError& e) {
      const std::string message = as_command_line_error(e).what();
      std::cerr << "hetflow: after step " << training.resumed_iterations + done << ": " << message << "\n";
      unwritten.push_back(message);
      failed.insert("save-interval");
    }
  };
  const exec::SegmentedResult segmented = [&] {
    const exec::InterruptOnSignal on_signal;  // Ctrl-C stops every thread and rank; what ran is still reported
    engine.interrupt = &on_signal.flag();
    return exec::run_in_segments(plan, *backend, engine, run::checkpoint_cuts(request), checkpoint);
  }();
  const exec::RunResult& result = segmented.run;
  progress.finish();
  if (training.training) training.training->collect_at_root(!request.save_checkpoint.empty());
  if (ranks.rank() != 0) return result.completed ? 0 : 4;
  const auto write = [&](const std::string& option, const std::function<void()>& writing) {
    try {
      writing();
    } catch (const InputError& e) {
      unwritten.push_back(as_command_line_error(e).what());
      failed.insert(option);
    }
  };
  const auto written = [&](const std::string& option) { return vm.count(option) && !failed.count(option); };
  if (vm.count("trace")) {
    write("trace", [&] { write_file(vm["trace"].as<std::string>(), traces::write_trace_csv(result.trace), "--trace"); });
  }
  if (vm.count("chrome")) {
    write("chrome", [&] { write_file(vm["chrome"].as<std::string>(), traces::write_chrome_trace(result.trace), "--chrome"); });
  }
  if (training.training && result.completed && !request.save_weights.empty()) {
    write("save-weights", [&] { exec::write_safetensors(request.save_weights, training.training->weights()); });
  }
  if (training.training && result.completed && !request.save_checkpoint.empty()) {
    write("save-checkpoint", [&] { exec::write_training_checkpoint(request.save_checkpoint, training.training->state()); });
  }
  // The measured figures beside the simulator's and the estimate's (run/compare.hpp).
  const run::Comparison comparison = run::compare(request, training, result, calibration);
  if (vm.count("metrics")) {
    write("metrics", [&] {
      write_file(vm["metrics"].as<std::string>(), traces::write_metrics_csv(comparison.metrics, result.trace), "--metrics");
    });
  }
  const auto status = [&] {
    for (const std::string& u : unwritten) std::cerr << "hetflow: " << u << "\n";
    return !result.completed ? 4 : unwritten.empty() ? 0 : 2;
  };

  // 3. The report.
  if (vm.count("json")) {
    print_json(out, run_report_json(request, training, result, comparison, ranks.size(), engine.watchdog_s, segmented.pauses));
    return status();
  }
  if (!result.completed) {
    out << "ran " << plan.network.name << " on " << plan.cluster.name << ": THE RUN DID NOT COMPLETE ("
        << result.task_instances << " task instances completed):\n  " << result.error << "\n";
    if (written("trace")) out << "wrote the partial trace to " << vm["trace"].as<std::string>() << "\n";
    if (written("chrome")) out << "wrote the partial Chrome trace to " << vm["chrome"].as<std::string>() << "\n";
    if (written("metrics")) out << "wrote the partial metrics to " << vm["metrics"].as<std::string>() << "\n";
    if (last_checkpoint >= 0) {
      out << "the last checkpoint: " << request.save_checkpoint << ", after step " << last_checkpoint
          << " (--resume goes on from it)\n";
    }
    return status();
  }
  print_run_report(out, request, training, result, comparison, ranks.size(), segmented.pauses);
  if (written("trace")) out << "\nwrote " << vm["trace"].as<std::string>() << " (" << result.trace.events.size() << " events)\n";
  if (written("chrome")) out << "wrote " << vm["chrome"].as<std::string>() << " (open in ui.perfetto.dev)\n";
  if (written("metrics")) out << "wrote " << vm["metrics"].as<std::string>() << " (per-iteration metrics)\n";
  if (written("save-weights")) out << "wrote " << request.save_weights << " (the weights)\n";
  if (written("save-checkpoint")) {
    const long long steps = training.resumed_iterations + request.warmup + request.steps;
    out << "wrote " << request.save_checkpoint << " (a training checkpoint after " << steps
        << " steps; --resume goes on from step " << steps << ")\n";
  }
  return status();
}

}  // namespace hetflow::tools
