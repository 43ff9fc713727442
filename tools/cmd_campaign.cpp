// hetflow campaign: a whole training run over days on a plan (a file, or built from the plan
// options): failures, restarts or dropped replicas, checkpoints, stragglers, cost. The
// iteration times come from the simulator; the rest is campaign/.
#include <cmath>
#include <filesystem>
#include <iomanip>
#include <ostream>
#include <sstream>

#include "campaign/campaign.hpp"
#include "campaign/cost.hpp"
#include "campaign/svg.hpp"
#include "model/error.hpp"
#include "model/units.hpp"
#include "partition/validate.hpp"
#include "tools/cli.hpp"
#include "tools/plan_options.hpp"

namespace hetflow::tools {

namespace {

namespace c = campaign;
namespace u = model::units;

double duration_option(const po::variables_map& vm, const char* name) {
  const std::string text = vm[name].as<std::string>();
  try {
    const double s = c::parse_duration_s(text);
    if (!(s >= 0) || !std::isfinite(s)) throw std::invalid_argument("expected a non-negative duration, found '" + text + "'");
    return s;
  } catch (const std::invalid_argument& e) {
    throw InputError("<command line>", 0, std::string("--") + name, e.what());
  }
}

double positive_number(const po::variables_map& vm, const char* name) {
  const double v = vm[name].as<double>();
  if (v > 0 && std::isfinite(v)) return v;
  throw InputError("<command line>", 0, std::string("--") + name, "expected a positive number, found " + u::format_number(v));
}

c::Reliability read_reliability(const po::variables_map& vm) {
  if (vm.count("reliability")) return c::read_reliability_file(vm["reliability"].as<std::string>());
  const std::string cluster = vm["cluster"].as<std::string>();
  if (!vm.count("plan") && std::filesystem::is_regular_file(cluster)) return c::read_reliability_file(cluster);
  return c::default_reliability();
}

c::CampaignOptions read_campaign_options(const po::variables_map& vm, const c::Job& job) {
  c::CampaignOptions o;
  if (vm.count("steps")) o.target_steps = positive_number(vm, "steps");
  if (vm.count("tokens")) {
    if (vm.count("steps")) throw InputError("<command line>", 0, "--tokens", "give --tokens or --steps, not both");
    o.target_steps = std::ceil(positive_number(vm, "tokens") / (job.samples_per_step * job.tokens_per_sample));
  }
  if (vm.count("duration")) o.duration_s = duration_option(vm, "duration");
  o.fault_tolerance = c::parse_fault_tolerance(vm["fault-tolerance"].as<std::string>());
  o.same_batch = vm.count("same-batch") > 0;
  o.spares = vm["spares"].as<int>();
  if (o.spares < 0) throw InputError("<command line>", 0, "--spares", "expected 0 or more, found " + std::to_string(o.spares));
  o.checkpoint_async = vm.count("checkpoint-async") > 0;
  if (vm["checkpoint-interval"].as<std::string>() != "auto") {
    o.checkpoint_interval_s = duration_option(vm, "checkpoint-interval");
    if (o.checkpoint_interval_s <= 0) throw InputError("<command line>", 0, "--checkpoint-interval", "expected auto or a positive duration");
  }
  if (vm.count("checkpoint-write-time")) o.checkpoint_write_s = duration_option(vm, "checkpoint-write-time");
  if (vm.count("checkpoint-load-time")) o.checkpoint_load_s = duration_option(vm, "checkpoint-load-time");
  o.seeds = vm["seeds"].as<int>();
  if (o.seeds < 1 || o.seeds > 100000) throw InputError("<command line>", 0, "--seeds", "expected 1 to 100000, found " + std::to_string(o.seeds));
  o.seed = vm["seed"].as<unsigned long long>();
  return o;
}

c::CostOptions read_cost_options(const po::variables_map& vm, const model::Cluster& cluster) {
  double priced_gpus = 0, usd = 0;
  for (const model::Node& n : cluster.nodes) priced_gpus += n.gpu_count, usd += n.gpu_count * n.price_usd_per_gpu_hour;
  c::CostOptions o = c::default_cost_options(cluster.priced() ? usd / priced_gpus : 0);
  const std::string mode = vm["cost"].as<std::string>();
  if (mode != "rent" && mode != "buy") throw InputError("<command line>", 0, "--cost", "expected rent or buy, found '" + mode + "'");
  o.mode = mode == "rent" ? c::CostOptions::Mode::rent : c::CostOptions::Mode::buy;
  if (vm.count("usd-per-gpu-hour")) o.usd_per_gpu_hour = positive_number(vm, "usd-per-gpu-hour");
  if (vm.count("gpu-price")) o.gpu_price_usd = positive_number(vm, "gpu-price");
  if (vm.count("lifetime")) o.lifetime_s = duration_option(vm, "lifetime");
  if (vm.count("watts-per-gpu")) o.watts_per_gpu = positive_number(vm, "watts-per-gpu");
  if (vm.count("pue")) o.pue = positive_number(vm, "pue");
  if (vm.count("usd-per-kwh")) o.usd_per_kwh = positive_number(vm, "usd-per-kwh");
  return o;
}

// Mean over the runs of a per-run figure.
template <typename F>
double mean(const c::CampaignResult& r, F f) {
  double sum = 0;
  for (const c::RunResult& run : r.runs) sum += f(run);
  return sum / static_cast<double>(r.runs.size());
}

std::string days(double s) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(s >= 10 * 86400 ? 1 : 2);
  if (s >= 2 * 86400) o << s / 86400 << " d";
  else if (s >= 7200) o << s / 3600 << " h";
  else if (s >= 120) o << std::setprecision(1) << s / 60 << " min";
  else return u::human_time_s(s);
  return o.str();
}

Json band_json(const c::Band& b) { return {{"p10", b.p10}, {"p50", b.p50}, {"p90", b.p90}, {"mean", b.mean}, {"mean_ci90", b.mean_ci90}}; }

Json report_json(const c::Job& job, const c::CampaignOptions& o, const c::CampaignResult& r, const c::Cost& cost,
                 const c::CostOptions& co) {
  Json j;
  j["gpus"] = job.gpus;
  j["nodes"] = job.nodes;
  j["replicas"] = job.replicas;
  j["fault_tolerance"] = std::string(c::to_string(o.fault_tolerance));
  j["spares"] = o.spares;
  j["target_steps"] = o.target_steps;
  j["duration_s"] = o.duration_s;
  j["iteration_time_s"] = {{"healthy", job.times.healthy_s}, {"replica_short", job.times.replica_short_s},
                           {"replica_short_same_batch", job.times.replica_short_same_batch_s},
                           {"straggler", job.times.straggler_s}};
  j["job_mtbf_s"] = r.job_mtbf_s;
  j["checkpoint_bytes"] = job.checkpoint.size_bytes;
  j["checkpoint_write_s"] = r.checkpoint_write_s;
  j["checkpoint_load_s"] = r.checkpoint_load_s;
  j["checkpoint_snapshot_s"] = job.checkpoint.snapshot_s;
  j["checkpoint_interval_s"] = r.checkpoint_interval_s;
  j["restart_s"] = r.restart_s;
  j["seeds"] = o.seeds;
  j["finished_runs"] = r.finished_runs;
  j["wall_s"] = band_json(r.wall_s);
  j["goodput"] = band_json(r.goodput);
  j["steps"] = band_json(r.steps);
  j["checkpoints_mean"] = mean(r, [](const c::RunResult& x) { return static_cast<double>(x.checkpoints); });
  j["checkpoint_overhead_s_mean"] = mean(r, [](const c::RunResult& x) { return x.checkpoint_s; });
  j["straggler_s_mean"] = mean(r, [](const c::RunResult& x) { return x.straggler_s; });
  Json causes = Json::object();
  for (int i = 0; i < c::kComponents; ++i) {
    const size_t k = static_cast<size_t>(i);
    causes[std::string(c::to_string(static_cast<c::Component>(i)))] = {
        {"interruptions_mean", mean(r, [k](const c::RunResult& x) { return static_cast<double>(x.interruptions[k]); })},
        {"lost_s_mean", mean(r, [k](const c::RunResult& x) { return x.lost_s[k]; })}};
  }
  j["by_cause"] = std::move(causes);
  j["cost"] = {{"gpus_held", job.gpus + static_cast<double>(o.spares) * job.gpus_per_node},
               {"mode", co.mode == c::CostOptions::Mode::rent ? "rent" : "buy"}, {"usd_p50", cost.usd},
               {"usd_per_hour", cost.usd_per_hour}, {"energy_kwh_p50", cost.energy_kwh}};
  return j;
}

void report_text(std::ostream& out, const partition::Plan& plan, const c::Job& job, const c::CampaignOptions& o,
                 const c::CampaignResult& r, const c::Cost& cost, const c::CostOptions& co, double held_gpus) {
  out << "campaign: " << plan.network.name << " on " << plan.cluster.name << ", " << job.gpus << " GPUs in " << job.nodes
      << " nodes, " << job.replicas << " data-parallel replica" << (job.replicas == 1 ? "" : "s") << ", "
      << c::to_string(o.fault_tolerance) << (o.same_batch ? " (same batch)" : "") << ", " << o.spares << " spare node"
      << (o.spares == 1 ? "" : "s") << "\n";
  out << "  iteration time     " << u::human_time_s(job.times.healthy_s) << " healthy";
  if (o.fault_tolerance == c::FaultTolerance::drop_replica && job.replicas > 1) {
    out << ", " << u::human_time_s(o.same_batch ? job.times.replica_short_same_batch_s : job.times.replica_short_s)
        << " one replica out";
  }
  if (job.reliability.straggler_probability > 0) out << ", " << u::human_time_s(job.times.straggler_s) << " with a straggler";
  out << " (simulated)\n";
  if (o.target_steps > 0) {
    out << "  to train           " << u::format_number(o.target_steps) << " iterations ("
        << u::human_count(o.target_steps * job.samples_per_step * job.tokens_per_sample) << " tokens)\n";
  } else {
    out << "  for                " << days(o.duration_s) << " of wall time\n";
  }
  out << "  job MTBF           " << days(r.job_mtbf_s) << "\n";
  out << std::fixed << std::setprecision(2);
  const double overhead = mean(r, [](const c::RunResult& x) { return x.checkpoint_s; });
  const double wall = mean(r, [](const c::RunResult& x) { return x.wall_s; });
  out << "  checkpoint         " << u::human_bytes(job.checkpoint.size_bytes) << ", write "
      << u::human_time_s(r.checkpoint_write_s) << (o.checkpoint_async ? " (asynchronous)" : "") << ", load "
      << u::human_time_s(r.checkpoint_load_s) << "; every " << days(r.checkpoint_interval_s) << " of compute"
      << (o.checkpoint_interval_s > 0 ? "" : " (Daly)") << ", overhead " << 100 * overhead / wall << " %\n";
  const c::Reliability& rel = job.reliability;
  out << "  restart            detection " << days(rel.detection_s) << " + relaunch " << days(rel.relaunch_s)
      << " + communicator set-up " << u::human_time_s(rel.comm_setup_s_per_rank * job.gpus)
      << " + load " << u::human_time_s(r.checkpoint_load_s) << " (+ repair " << days(rel.repair_s) << " or spare swap "
      << u::human_time_s(rel.spare_swap_s) << " for hardware)\n\n";
  out << "  over " << o.seeds << " run" << (o.seeds == 1 ? "" : "s") << std::setw(o.seeds == 1 ? 14 : 13) << "p10"
      << std::setw(12) << "p50" << std::setw(12) << "p90" << "\n";
  if (o.target_steps > 0) {
    out << "  time to train      " << std::setw(12) << days(r.wall_s.p10) << std::setw(12) << days(r.wall_s.p50)
        << std::setw(12) << days(r.wall_s.p90) << "\n";
  } else {
    out << "  iterations trained " << std::setw(12) << std::setprecision(0) << r.steps.p10 << std::setw(12)
        << r.steps.p50 << std::setw(12) << r.steps.p90 << std::setprecision(2) << "\n";
  }
  out << "  goodput            " << std::setw(10) << 100 * r.goodput.p10 << " %" << std::setw(10) << 100 * r.goodput.p50
      << " %" << std::setw(10) << 100 * r.goodput.p90 << " %   (mean " << 100 * r.goodput.mean << " % +- "
      << 100 * r.goodput.mean_ci90 << ")\n";
  if (r.finished_runs < o.seeds) out << "  NOT FINISHED       " << o.seeds - r.finished_runs << " runs stopped after 10 years\n";
  out << "\n  by cause (mean per run)   interruptions    time lost\n";
  for (int i = 0; i < c::kComponents; ++i) {
    const size_t k = static_cast<size_t>(i);
    out << "    " << std::left << std::setw(22) << c::to_string(static_cast<c::Component>(i)) << std::right
        << std::setw(14) << std::setprecision(1)
        << mean(r, [k](const c::RunResult& x) { return static_cast<double>(x.interruptions[k]); }) << std::setw(13)
        << days(mean(r, [k](const c::RunResult& x) { return x.lost_s[k]; })) << "\n";
  }
  out << "    " << std::left << std::setw(22) << "checkpoints" << std::right << std::setw(14) << std::setprecision(0)
      << mean(r, [](const c::RunResult& x) { return static_cast<double>(x.checkpoints); }) << std::setw(13)
      << days(overhead) << "\n";
  out << "    " << std::left << std::setw(22) << "stragglers" << std::right << std::setw(14) << "-" << std::setw(13)
      << days(mean(r, [](const c::RunResult& x) { return x.straggler_s; })) << "\n";
  out << "\n  cost (" << (co.mode == c::CostOptions::Mode::rent ? "rent" : "buy") << ", p50)      "
      << std::setprecision(1) << cost.usd / 1e6 << " M USD, " << std::setprecision(0) << cost.usd_per_hour
      << " USD/h for " << held_gpus << " GPUs";
  if (co.mode == c::CostOptions::Mode::buy) out << ", " << std::setprecision(0) << cost.energy_kwh / 1e3 << " MWh";
  out << "\n";
}

}  // namespace

void campaign_options(po::options_description& options) {
  add_plan_options(options, PlanCommand::plan);
  options.add_options()
      ("plan", po::value<std::string>(), "a plan file instead of the plan options")
      ("tokens", po::value<double>(), "tokens to train")
      ("steps", po::value<double>(), "iterations to train")
      ("duration", po::value<std::string>(), "wall time to run instead (e.g. 54d), or a limit")
      ("fault-tolerance", po::value<std::string>()->default_value("restart"), "restart | drop-replica")
      ("same-batch", "drop-replica: the others take a missing replica's micro-batches")
      ("spares", po::value<int>()->default_value(0), "spare nodes that replace a failed node at once")
      ("checkpoint-interval", po::value<std::string>()->default_value("auto"), "compute time between checkpoints, or auto (Daly)")
      ("checkpoint-async", "training waits only for the GPU-to-host snapshot")
      ("checkpoint-write-time", po::value<std::string>(), "instead of size / storage bandwidth")
      ("checkpoint-load-time", po::value<std::string>(), "instead of size / storage bandwidth")
      ("reliability", po::value<std::string>(), "a YAML file whose reliability: section to use")
      ("job-mtbf", po::value<std::string>(), "scale every failure rate so the job's MTBF is this")
      ("seeds", po::value<int>()->default_value(10), "Monte Carlo runs")
      ("seed", po::value<unsigned long long>()->default_value(1), "the first run's seed")
      ("cost", po::value<std::string>()->default_value("rent"), "rent | buy")
      ("usd-per-gpu-hour", po::value<double>(), "rent price (default: the cluster's, else cited)")
      ("gpu-price", po::value<double>(), "buy: USD per GPU")
      ("lifetime", po::value<std::string>(), "buy: amortisation period (e.g. 2000d)")
      ("watts-per-gpu", po::value<double>(), "buy: power per GPU, its server's share included")
      ("pue", po::value<double>(), "buy: facility power over IT power")
      ("usd-per-kwh", po::value<double>(), "buy: electricity price")
      ("svg", po::value<std::string>(), "draw progress against time here");
}

int run_campaign(const std::vector<std::string>& args, std::ostream& out) {
  po::options_description options("campaign options");
  po::variables_map vm;
  if (!parse_command_options("campaign", args, options, vm, out)) return 0;
  partition::Plan plan;
  if (vm.count("plan")) {
    plan = read_plan_file(vm["plan"].as<std::string>(), "--plan");
    partition::require_valid(plan);
  } else {
    plan = plan_from_options(vm).plan;
    require_valid_or_advise(plan, vm);
  }
  if (vm.count("svg")) check_writable(vm["svg"].as<std::string>(), "--svg");
  c::Job job = c::describe_job(plan, read_reliability(vm));
  if (vm.count("job-mtbf")) {
    const double want_s = duration_option(vm, "job-mtbf");
    if (want_s <= 0) throw InputError("<command line>", 0, "--job-mtbf", "expected a positive duration");
    const double scale = want_s * c::job_failure_rate_per_s(job.reliability, job.gpus, job.nodes);
    for (double& m : job.reliability.mtbf_s) m *= scale;
  }
  const c::CampaignOptions o = read_campaign_options(vm, job);
  const c::CostOptions co = read_cost_options(vm, plan.cluster);
  if (!(o.target_steps > 0) && !(o.duration_s > 0)) {
    throw InputError("<command line>", 0, "--tokens", "expected what to train (--tokens or --steps) or a --duration");
  }
  const bool drops = o.fault_tolerance == c::FaultTolerance::drop_replica;
  c::measure_states(plan, read_calibration_option(vm, plan.cluster), job, {drops, drops && o.same_batch});
  const c::CampaignResult r = c::simulate_campaign(job, o);
  const double held_gpus = job.gpus + static_cast<double>(o.spares) * job.gpus_per_node;
  const c::Cost cost = c::campaign_cost(co, held_gpus, r.wall_s.p50);
  if (vm.count("svg")) {
    const std::string title = plan.network.name + " on " + std::to_string(job.gpus) + " GPUs, " +
                              std::string(c::to_string(o.fault_tolerance)) + ": run 1 of " + std::to_string(o.seeds);
    write_file(vm["svg"].as<std::string>(), c::progress_svg(r, o.target_steps, title), "--svg");
  }
  if (vm.count("json")) {
    Json j = report_json(job, o, r, cost, co);
    if (drops) j["restart_goodput"] = band_json(r.restart_goodput);
    print_json(out, j);
  } else {
    report_text(out, plan, job, o, r, cost, co, held_gpus);
    if (drops) {
      out << std::fixed << std::setprecision(2) << "\n  restart instead     goodput " << 100 * r.restart_goodput.p10
          << " / " << 100 * r.restart_goodput.p50 << " / " << 100 * r.restart_goodput.p90
          << " % (p10 / p50 / p90, the same seeds and states, the job restarted at each failure)\n";
    }
    if (vm.count("svg")) out << "\nwrote " << vm["svg"].as<std::string>() << "\n";
  }
  return 0;
}

}  // namespace hetflow::tools
