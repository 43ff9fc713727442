// The campaign's event loop. State: the clock, steps trained and the last durable
// checkpoint's, the phase (computing, checkpointing, recovering, paused), replicas up,
// spares and nodes in repair. Events: failures (one exponential process for the whole job,
// its class drawn by rate), the current phase's end, repairs done, replicas rejoining,
// asynchronous checkpoints becoming durable.
#include "campaign/campaign.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>
#include <random>
#include <set>

#include "model/error.hpp"

namespace hetflow::campaign {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Uniform and exponential draws from a fixed engine with our own transforms: the standard
// library's distributions differ between implementations, and a seed must mean one run.
class Random {
 public:
  explicit Random(std::uint64_t seed) : engine_(seed) {}
  double uniform() { return (static_cast<double>(engine_() >> 11) + 1) * 0x1.0p-53; }  // (0, 1]
  double exponential(double rate) { return rate > 0 ? -std::log(uniform()) / rate : kInf; }

 private:
  std::mt19937_64 engine_;
};

enum class EventKind { phase_end, failure, repaired, rejoin, durable };
struct Event {
  double time_s = 0;
  EventKind kind = EventKind::phase_end;
  long tag = 0;       // phase_end: phase generation; durable: checkpoint epoch; rejoin: cause
  double value = 0;   // durable: the steps it holds
  bool operator>(const Event& o) const { return time_s != o.time_s ? time_s > o.time_s : kind > o.kind; }
};

enum class Phase { compute, checkpoint, snapshot, recovery, pause, stalled, done };

class Run {
 public:
  Run(const Job& job, const CampaignOptions& options, double interval_s, std::uint64_t seed, bool record)
      : job_(job), o_(options), interval_s_(interval_s), random_(seed), record_(record) {
    rates_ = failure_rates_per_s(job.reliability, job.gpus, job.nodes);
    for (double r : rates_) total_rate_ += r;
    up_ = job.replicas;
    spares_ = o_.spares;
    write_s_ = o_.checkpoint_write_s >= 0 ? o_.checkpoint_write_s : job.checkpoint.write_s;
    load_s_ = o_.checkpoint_load_s >= 0 ? o_.checkpoint_load_s : job.checkpoint.load_s;
    drop_ = o_.fault_tolerance == FaultTolerance::drop_replica && job.replicas > 1;
  }

  RunResult go() {
    stop_s_ = o_.duration_s > 0 ? std::min(o_.duration_s, o_.max_wall_s) : o_.max_wall_s;
    events_.push({random_.exponential(total_rate_), EventKind::failure});
    start_compute();
    while (phase_ != Phase::done) {
      const Event e = events_.top();
      events_.pop();
      if (e.time_s > stop_s_) {
        advance(stop_s_);
        result_.finished = o_.duration_s > 0 && stop_s_ == o_.duration_s;
        break;
      }
      if (e.kind == EventKind::phase_end && e.tag != generation_) continue;
      advance(e.time_s);
      switch (e.kind) {
        case EventKind::phase_end: end_phase(); break;
        case EventKind::failure: failure(); break;
        case EventKind::repaired: repaired(e.time_s); break;
        case EventKind::rejoin: rejoin(static_cast<Component>(e.tag)); break;
        case EventKind::durable:
          if (e.tag == epoch_) {
            durable_steps_ = std::max(durable_steps_, e.value);
            ++result_.checkpoints;
            mark(Mark::checkpoint);
          }
          break;
      }
      point();
    }
    result_.wall_s = t_;
    result_.steps = steps_;
    result_.useful_s = steps_ * job_.times.healthy_s;
    result_.goodput = t_ > 0 ? result_.useful_s / t_ : 0;
    return result_;
  }

 private:
  // --- progress ---
  // Full global batches per second of compute in the current state.
  double rate() const {
    const StateTimes& s = job_.times;
    const int R = job_.replicas;
    const double nodes_up = static_cast<double>(job_.nodes) * up_ / R;
    const double q = 1 - std::pow(1 - job_.reliability.straggler_probability, nodes_up);
    const double m = 1 + q * (s.straggler_s / s.healthy_s - 1);
    if (up_ == R) return 1 / (s.healthy_s * m);
    if (o_.same_batch) {
      // The extra micro-batches grow as R/u - 1 = (R - u)/u; the simulated state has 1/(R - 1).
      const double step = s.healthy_s + (s.replica_short_same_batch_s - s.healthy_s) * (R - up_) / up_ * (R - 1);
      return 1 / (step * m);
    }
    return static_cast<double>(up_) / R / (s.replica_short_s * m);
  }
  double straggler_multiplier() const {
    const double nodes_up = static_cast<double>(job_.nodes) * up_ / job_.replicas;
    const double q = 1 - std::pow(1 - job_.reliability.straggler_probability, nodes_up);
    return 1 + q * (job_.times.straggler_s / job_.times.healthy_s - 1);
  }

  // Moves the clock to `to`, crediting progress and charging the time to what it went to.
  void advance(double to) {
    const double dt = to - t_;
    if (dt <= 0) return;
    switch (phase_) {
      case Phase::compute: {
        const double gained = dt * rate();
        steps_ += gained;
        compute_since_checkpoint_s_ += dt;
        step_elapsed_s_ += dt;
        const double m = straggler_multiplier();
        result_.straggler_s += dt * (1 - 1 / m);
        const double rest = dt / m - gained * job_.times.healthy_s;  // replicas out: fewer samples per second
        if (!down_.empty()) {
          for (Component c : down_) result_.lost_s[static_cast<size_t>(c)] += rest / static_cast<double>(down_.size());
        }
        break;
      }
      case Phase::checkpoint:
      case Phase::snapshot: result_.checkpoint_s += dt; break;
      case Phase::recovery:
      case Phase::pause:
      case Phase::stalled: result_.lost_s[static_cast<size_t>(cause_)] += dt; break;
      case Phase::done: break;
    }
    t_ = to;
  }

  void set_phase(Phase p, double duration_s) {
    phase_ = p;
    phase_end_s_ = t_ + duration_s;
    ++generation_;
    if (std::isfinite(phase_end_s_)) events_.push({phase_end_s_, EventKind::phase_end, generation_});
  }

  void start_compute() {
    step_elapsed_s_ = 0;
    const double r = rate();
    const double to_checkpoint = std::max(0.0, interval_s_ - compute_since_checkpoint_s_);
    const double to_target = o_.target_steps > 0 ? std::max(0.0, (o_.target_steps - steps_) / r) : kInf;
    set_phase(Phase::compute, std::min(to_checkpoint, to_target));
  }

  void end_phase() {
    switch (phase_) {
      case Phase::compute:
        if (o_.target_steps > 0 && steps_ >= o_.target_steps * (1 - 1e-12)) {
          steps_ = o_.target_steps;
          phase_ = Phase::done;
          result_.finished = true;
          return;
        }
        compute_since_checkpoint_s_ = 0;
        snapshot_steps_ = steps_;
        if (o_.checkpoint_async) {
          set_phase(Phase::snapshot, job_.checkpoint.snapshot_s);
        } else {
          set_phase(Phase::checkpoint, write_s_);
        }
        return;
      case Phase::checkpoint:
        durable_steps_ = snapshot_steps_;
        ++result_.checkpoints;
        mark(Mark::checkpoint);
        break;
      case Phase::snapshot: events_.push({t_ + write_s_, EventKind::durable, ++epoch_, snapshot_steps_}); break;
      case Phase::recovery:
      case Phase::pause: mark(Mark::resumed); break;
      case Phase::stalled:
      case Phase::done: return;
    }
    start_compute();
  }

  // --- failures ---
  Component draw_cause() {
    double u = random_.uniform() * total_rate_;
    for (int i = 0; i < kComponents; ++i) {
      u -= rates_[static_cast<size_t>(i)];
      if (u <= 0) return static_cast<Component>(i);
    }
    return Component::software;
  }

  // When a node replacing a failed one is ready: a spare now, else the first node out of
  // repair (the failed node's own repair is one of them). `t_` is when the failure is known.
  double replacement_ready_s(double known_s) {
    pending_repairs_.insert(t_ + job_.reliability.repair_s);
    events_.push({t_ + job_.reliability.repair_s, EventKind::repaired});
    if (spares_ > 0) {
      --spares_;
      return known_s + job_.reliability.spare_swap_s;
    }
    const auto first = pending_repairs_.begin();
    const double ready = std::max(known_s, *first);
    pending_repairs_.erase(first);
    return ready;
  }

  void repaired(double time_s) {
    const auto it = pending_repairs_.find(time_s);
    if (it == pending_repairs_.end()) return;  // already taken into the job
    pending_repairs_.erase(it);
    ++spares_;
  }

  void rollback(Component c) {
    result_.lost_s[static_cast<size_t>(c)] += (steps_ - durable_steps_) * job_.times.healthy_s;
    steps_ = durable_steps_;
    compute_since_checkpoint_s_ = 0;
    ++epoch_;  // a snapshot still being written is lost with the job
  }

  void failure() {
    events_.push({t_ + random_.exponential(total_rate_), EventKind::failure});
    const Component c = draw_cause();
    if (drop_) {
      drop_failure(c);
    } else {
      restart_failure(c);
    }
  }

  void restart_failure(Component c) {
    ++result_.interruptions[static_cast<size_t>(c)];
    mark(Mark::failure, c);
    if (phase_ != Phase::recovery) rollback(c);
    const Reliability& r = job_.reliability;
    const double known_s = t_ + r.detection_s;
    const double ready_s = needs_repair(c) ? replacement_ready_s(known_s) : known_s;
    cause_ = c;
    set_phase(Phase::recovery, ready_s - t_ + restart_s(job_, load_s_));
  }

  void drop_failure(Component c) {
    // The failed unit is in a replica still training with probability up / R.
    if (up_ == 0 || random_.uniform() * job_.replicas > up_) return;
    ++result_.interruptions[static_cast<size_t>(c)];
    mark(Mark::failure, c);
    const Reliability& r = job_.reliability;
    // The step in flight is lost for every replica.
    if (phase_ == Phase::compute) {
      const double step_s = 1 / rate();
      const double partial = std::fmod(step_elapsed_s_, step_s) * rate();
      steps_ -= partial;
      result_.lost_s[static_cast<size_t>(c)] += partial * job_.times.healthy_s;
    } else if (phase_ == Phase::checkpoint || phase_ == Phase::snapshot) {
      compute_since_checkpoint_s_ = interval_s_;  // write it again once going
    }
    --up_;
    result_.max_replicas_down = std::max(result_.max_replicas_down, job_.replicas - up_);
    const double known_s = t_ + r.detection_s;
    const double ready_s = needs_repair(c) ? replacement_ready_s(known_s) : known_s;
    const double per_replica_ranks = static_cast<double>(job_.gpus) / job_.replicas;
    events_.push({ready_s + r.relaunch_s + r.comm_setup_s_per_rank * per_replica_ranks, EventKind::rejoin,
                  static_cast<long>(c)});
    down_.push_back(c);
    if (up_ == 0) {  // nobody left holding the state: back to the checkpoint when one returns
      rollback(c);
      cause_ = c;
      set_phase(Phase::stalled, kInf);
      return;
    }
    pause(c, r.detection_s + r.comm_setup_s_per_rank * job_.replicas);
  }

  // The survivors stop while the data-parallel groups are rebuilt; pauses that overlap merge.
  void pause(Component c, double duration_s) {
    const double end_s = phase_ == Phase::pause ? std::max(phase_end_s_, t_ + duration_s) : t_ + duration_s;
    cause_ = c;
    set_phase(Phase::pause, end_s - t_);
  }

  void rejoin(Component c) {
    const auto it = std::find(down_.begin(), down_.end(), c);
    if (it != down_.end()) down_.erase(it);
    ++up_;
    const Reliability& r = job_.reliability;
    if (phase_ == Phase::stalled) {
      cause_ = c;
      set_phase(Phase::recovery, load_s_ + r.comm_setup_s_per_rank * job_.gpus);
      return;
    }
    if (phase_ == Phase::recovery) return;
    // Joining waits for a step boundary: the in-flight step finishes, then the groups grow.
    pause(c, r.comm_setup_s_per_rank * job_.replicas);
  }

  // --- records ---
  void point() {
    if (record_) result_.progress.emplace_back(t_, steps_);
  }
  void mark(Mark::Kind kind, Component c = Component::gpu) {
    if (record_) result_.marks.push_back({kind, t_, c});
  }

  const Job& job_;
  const CampaignOptions& o_;
  double interval_s_;
  Random random_;
  bool record_;
  std::array<double, kComponents> rates_{};
  double total_rate_ = 0;
  bool drop_ = false;
  double write_s_ = 0, load_s_ = 0;
  double stop_s_ = 0;

  double t_ = 0;
  double steps_ = 0;
  double durable_steps_ = 0;
  double snapshot_steps_ = 0;
  double compute_since_checkpoint_s_ = 0;
  double step_elapsed_s_ = 0;
  Phase phase_ = Phase::compute;
  double phase_end_s_ = 0;
  long generation_ = 0;
  long epoch_ = 0;
  Component cause_ = Component::gpu;
  int up_ = 1;
  int spares_ = 0;
  std::vector<Component> down_;
  std::multiset<double> pending_repairs_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  RunResult result_;
};

}  // namespace

double restart_s(const Job& job, double load_s) {
  const Reliability& r = job.reliability;
  return r.relaunch_s + r.comm_setup_s_per_rank * job.gpus + load_s;
}

FaultTolerance parse_fault_tolerance(const std::string& text) {
  if (text == "restart") return FaultTolerance::restart;
  if (text == "drop-replica") return FaultTolerance::drop_replica;
  throw InputError("<command line>", 0, "--fault-tolerance", "expected restart or drop-replica, found '" + text + "'");
}

std::string_view to_string(FaultTolerance f) { return f == FaultTolerance::restart ? "restart" : "drop-replica"; }

double checkpoint_interval_s(const Job& job, const CampaignOptions& options) {
  // A checkpoint is taken between iterations: at most one per iteration.
  if (options.checkpoint_interval_s > 0) return std::max(options.checkpoint_interval_s, job.times.healthy_s);
  const double write_s = options.checkpoint_write_s >= 0 ? options.checkpoint_write_s : job.checkpoint.write_s;
  // An asynchronous checkpoint costs training only its snapshot.
  const double cost_s = options.checkpoint_async ? job.checkpoint.snapshot_s : write_s;
  return std::max(job.times.healthy_s, daly_interval_s(cost_s, 1 / job_failure_rate_per_s(job.reliability, job.gpus, job.nodes)));
}

RunResult run_campaign(const Job& job, const CampaignOptions& options, std::uint64_t seed, bool record) {
  return Run(job, options, checkpoint_interval_s(job, options), seed, record).go();
}

Band band_of(std::vector<double> values) {
  Band b;
  if (values.empty()) return b;
  std::sort(values.begin(), values.end());
  const auto at = [&](double p) {
    const double x = p * static_cast<double>(values.size() - 1);
    const size_t i = static_cast<size_t>(x);
    const double f = x - static_cast<double>(i);
    return i + 1 < values.size() ? values[i] * (1 - f) + values[i + 1] * f : values[i];
  };
  b.p10 = at(0.1);
  b.p50 = at(0.5);
  b.p90 = at(0.9);
  double sum = 0;
  for (double v : values) sum += v;
  b.mean = sum / static_cast<double>(values.size());
  if (values.size() > 1) {
    double ss = 0;
    for (double v : values) ss += (v - b.mean) * (v - b.mean);
    const double sd = std::sqrt(ss / static_cast<double>(values.size() - 1));
    b.mean_ci90 = 1.645 * sd / std::sqrt(static_cast<double>(values.size()));
  }
  return b;
}

CampaignResult simulate_campaign(const Job& job, const CampaignOptions& options) {
  if (!(options.target_steps > 0) && !(options.duration_s > 0)) {
    throw InputError("<command line>", 0, "--steps", "expected what to train (--tokens or --steps) or a --duration");
  }
  if (options.seeds < 1) {
    throw InputError("<command line>", 0, "--seeds", "expected at least 1, found " + std::to_string(options.seeds));
  }
  CampaignResult c;
  c.checkpoint_interval_s = checkpoint_interval_s(job, options);
  c.checkpoint_write_s = options.checkpoint_write_s >= 0 ? options.checkpoint_write_s : job.checkpoint.write_s;
  c.checkpoint_load_s = options.checkpoint_load_s >= 0 ? options.checkpoint_load_s : job.checkpoint.load_s;
  c.restart_s = restart_s(job, c.checkpoint_load_s);
  c.job_mtbf_s = 1 / job_failure_rate_per_s(job.reliability, job.gpus, job.nodes);
  c.healthy_iteration_s = job.times.healthy_s;
  std::vector<double> walls, goodputs, steps;
  for (int k = 0; k < options.seeds; ++k) {
    c.runs.push_back(run_campaign(job, options, options.seed + static_cast<std::uint64_t>(k), k == 0));
    walls.push_back(c.runs.back().wall_s);
    goodputs.push_back(c.runs.back().goodput);
    steps.push_back(c.runs.back().steps);
    c.finished_runs += c.runs.back().finished ? 1 : 0;
  }
  c.wall_s = band_of(walls);
  c.goodput = band_of(goodputs);
  c.steps = band_of(steps);
  if (options.fault_tolerance == FaultTolerance::drop_replica) {
    CampaignOptions restart = options;
    restart.fault_tolerance = FaultTolerance::restart;
    std::vector<double> restart_goodputs;
    for (int k = 0; k < options.seeds; ++k) {
      restart_goodputs.push_back(run_campaign(job, restart, options.seed + static_cast<std::uint64_t>(k), false).goodput);
    }
    c.restart_goodput = band_of(restart_goodputs);
  }
  return c;
}

}  // namespace hetflow::campaign
