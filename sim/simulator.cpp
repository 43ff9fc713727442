// The in-process simulation: one SimGrid actor per device. It keeps every stream of its
// device going at once: a stream's next task starts as soon as the task before it on that
// stream has finished and its data dependencies are done (all on the same device: devices
// only meet through transfers and collectives). Compute tasks execute on the device's host;
// transfers are mailbox communications on per-peer channels over the platform's routes;
// collectives run their algorithm's point-to-point steps, so they share links with
// everything else. The actor sleeps in one wait_any over whatever its streams have in
// flight: no condition variables, no actor per stream.
#include "sim/simulator.hpp"

#include <simgrid/s4u.hpp>
#include <simgrid/version.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <span>
#include <unordered_map>

#include "model/error.hpp"
#include "partition/collective_steps.hpp"
#include "partition/cost_model.hpp"
#include "partition/estimate.hpp"
#include "partition/loading.hpp"
#include "partition/run_graph.hpp"
#include "sim/amounts.hpp"
#include "sim/mailbox_steps.hpp"
#include "sim/needed_hosts.hpp"
#include "sim/off_device_work.hpp"
#include "sim/platform.hpp"
#include "traces/message_times.hpp"
#include "traces/task_event.hpp"

namespace hetflow::sim {

namespace sg = simgrid::s4u;
using partition::Collective;
using partition::Plan;
using partition::Task;
using partition::TaskKind;

namespace {

struct Stream {
  const std::vector<int>* tasks = nullptr;
  int stream = -1;
  size_t next = 0;        // index of the head task in the program
  int iteration = 0;      // of the head task
  bool running = false;   // the head task has activities in flight
  bool collective = false;  // ... and it is a collective, stepping through `steps`
  bool local_work = false;  // ... and it is a collective's own read first (its Task::memory_bytes)
  std::string failure;    // why it stopped early
  // When the head task is a collective: its steps, the current one, what is outstanding.
  std::vector<MailboxStep> steps;
  size_t step = 0;
  int outstanding = 0;
  // When the head task is a compute task that some successors wait for only in part
  // (OrderEdge::fraction): the parts of its work where they are released, ending with 1, the
  // part now running, and the task's whole work in FLOPs at the host's speed.
  std::vector<double> cuts;
  size_t cut = 0;
  double work_flops = 0;
  // The head compute task's in-task collective messages (Plan::inside), the next one, and
  // whether `steps` are one of them.
  std::span<const partition::InTaskCall> calls;
  size_t call = 0;
  bool in_call = false;
  // A message that overlaps the work (InTaskCall::overlaps): its index in `calls` while its
  // steps run beside the work (-1: none), and whether the work has reached its `until` and
  // waits for it.
  int async_call = -1;
  bool waiting_async = false;
};

// What a device has in flight: each activity with the stream whose head task it serves, and
// whether it is a step of a message that overlaps the task's work (Stream::async_call).
struct InFlight {
  std::vector<sg::ActivityPtr> activities;
  std::vector<size_t> stream;
  std::vector<char> async;

  void add(sg::ActivityPtr a, size_t s, bool overlapped = false) {
    activities.push_back(std::move(a));
    stream.push_back(s);
    async.push_back(overlapped ? 1 : 0);
  }
  void remove(size_t i) {
    activities[i] = activities.back();
    activities.pop_back();
    stream[i] = stream.back();
    stream.pop_back();
    async[i] = async.back();
    async.pop_back();
  }
};

struct Device {
  int id = -1;
  std::vector<Stream> streams;
};

class Simulation {
 public:
  Simulation(const Plan& plan, const SimOptions& options)
      : plan_(plan), options_(options), cost_(plan.cluster, plan.layout.precision, options.calibration),
        tasks_(plan.tasks.size()), iterations_(std::max(1, plan.iterations())) {
    cost_.set_free_communication(options.free_communication);
  }

  SimResult run() {
    using clock = std::chrono::steady_clock;
    const auto wall_start = clock::now();
    wall_start_ = last_report_ = wall_start;
    std::vector<double> speeds;
    for (int d = 0; d < cost_.device_count(); ++d) speeds.push_back(cost_.peak_flops_per_s(d));
    start_engine(plan_.programs.size());
    spec_ = platform_spec(cost_.cluster(), speeds);  // its links scaled by the calibration
    if (options_.free_communication) {
      // Free communication: every link instantaneous, so transfers keep their rendezvous
      // (a receive still waits for its send) but take no time.
      for (LinkSpec& l : spec_.links) {
        l.latency_s = 0;
        l.bandwidth_bytes_per_s = 1e18;
      }
    }
    spec_.offload = std::any_of(plan_.tasks.begin(), plan_.tasks.end(), [](const Task& t) {
      return partition::is_host_copy(t.kind) || t.kind == TaskKind::host_optimizer;
    });
    platform_ = instantiate_platform(spec_, {}, needed_hosts(plan_, options_));
    steps_.emplace(plan_, cost_, platform_, options_.coalesce_rings, options_.coalesce_all_to_all);
    const auto t_platform = clock::now();
    prepare();
    std::map<int, std::vector<std::pair<double, double>>> slowdowns;  // per device: (from, factor)
    for (const Straggler& s : options_.stragglers) slowdowns[s.device].emplace_back(s.from_s, s.factor);
    for (auto& [device, changes] : slowdowns) set_slowdowns(platform_, device, std::move(changes));
    add_faults();
    devices_.resize(plan_.programs.size());
    stream_index_.assign(tasks_, -1);
    for (size_t d = 0; d < plan_.programs.size(); ++d) {
      Device& device = devices_[d];
      device.id = static_cast<int>(d);
      for (const partition::StreamProgram& program : plan_.programs[d]) {
        if (program.tasks.empty()) continue;
        for (int t : program.tasks) stream_index_[static_cast<size_t>(t)] = static_cast<int>(device.streams.size());
        Stream stream;
        stream.tasks = &program.tasks;
        stream.stream = program.stream;
        device.streams.push_back(std::move(stream));
      }
      if (device.streams.empty()) continue;
      sg::Actor::create(plan_.device_names[d], platform_.hosts[d], [this, d] { run_device(devices_[d]); });
    }
    const auto t_setup = clock::now();
    sg::Engine::get_instance()->run();
    const auto t_run = clock::now();
    SimResult result = collect();
    if (std::getenv("HETFLOW_SIM_PHASES") != nullptr) {
      auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
      std::fprintf(stderr, "sim phases: platform %.2f s, actors %.2f s, run %.2f s, collect %.2f s\n",
                   s(wall_start, t_platform), s(t_platform, t_setup), s(t_setup, t_run), s(t_run, clock::now()));
    }
    result.wall_s = std::chrono::duration<double>(clock::now() - wall_start).count();
    return result;
  }

 private:
  // --- set-up ---

  // A channel's mailbox is "src>dst:tag" (a collective's: sim/mailbox_steps.hpp).
  static sg::Mailbox* mailbox(int src, int dst, const std::string& tag) {
    return sg::Mailbox::by_name(std::to_string(src) + ">" + std::to_string(dst) + ":" + tag);
  }

  // Inputs of every task per iteration, successors and transfer partners: partition::RunGraph.
  void prepare() {
    if (plan_.layout.folded) load_shares_ = partition::load_shares(plan_);
    const size_t n = tasks_;
    graph_.emplace(plan_);
    remaining_.resize(static_cast<size_t>(iterations_));
    done_.assign(n * static_cast<size_t>(iterations_), 0);
    start_.assign(n * static_cast<size_t>(iterations_), 0);
    end_.assign(n * static_cast<size_t>(iterations_), 0);
    messages_ = traces::MessageTimes(plan_, iterations_);
    // Refuse a collective its steps would refuse now, not inside a running actor.
    for (const Collective& c : plan_.collectives) partition::check_collective(partition::collective_spec(plan_, c));
    check_amounts(plan_, cost_, options_);
    // Each channel's mailbox, looked up once.
    mailbox_of_.assign(n, nullptr);
    std::vector<sg::Mailbox*> channel_box;
    for (const partition::Channel& c : plan_.channels) channel_box.push_back(mailbox(c.src, c.dst, c.tag));
    for (size_t t = 0; t < n; ++t) {
      const Task& task = plan_.tasks[t];
      if (task.kind == TaskKind::send || task.kind == TaskKind::recv) {
        mailbox_of_[t] = channel_box[static_cast<size_t>(task.channel)];
      }
    }
  }

  // Unfinished inputs of each task in iteration i, made when first needed.
  std::vector<int>& remaining(int i) {
    std::vector<int>& r = remaining_[static_cast<size_t>(i)];
    if (r.empty()) r = graph_->inputs(i);
    return r;
  }

  void add_faults() {
    for (const Fault& f : options_.faults) {
      sg::Actor::create("fault", platform_.hosts.front(), [this, f] {
        sg::Actor::self()->daemonize();  // a fault after the run has ended does not prolong it
        sg::this_actor::sleep_until(f.at_s);
        if (f.device >= 0) {
          platform_.hosts[static_cast<size_t>(f.device)]->turn_off();
        } else {
          platform_.links[static_cast<size_t>(spec_.link_index(f.link))]->turn_off();
        }
      });
    }
  }

  // --- the device actor ---

  // Only streams that may have become startable are looked at: the one whose task just
  // finished and those whose head's last input just completed (`check`).
  void run_device(Device& d) {
    InFlight flight;
    std::vector<size_t> check(d.streams.size());
    for (size_t s = 0; s < check.size(); ++s) check[s] = s;
    for (;;) {
      for (size_t i = 0; i < check.size(); ++i) {  // start() may append to check
        const size_t s = check[i];
        Stream& stream = d.streams[s];
        if (stream.running || !stream.failure.empty() || stream.iteration >= iterations_) continue;
        const int task = (*stream.tasks)[stream.next];
        if (remaining(stream.iteration)[static_cast<size_t>(task)] > 0) continue;
        start(d, s, task, flight, check);
      }
      check.clear();
      if (flight.activities.empty()) return;  // finished, or stuck on something that cannot come
      ssize_t index = -1;
      try {
        index = sg::Activity::wait_any(flight.activities);
      } catch (const simgrid::NetworkFailureException&) {
        drop_failed(d, flight, "a link on its route failed at " + std::to_string(sg::Engine::get_clock()) + " s");
        continue;
      } catch (const simgrid::Exception& e) {
        drop_failed(d, flight, std::string("stopped: ") + e.what());
        continue;
      }
      const size_t s = flight.stream[static_cast<size_t>(index)];
      const bool async = flight.async[static_cast<size_t>(index)] != 0;
      flight.remove(static_cast<size_t>(index));
      finished_activity(d, s, async, flight, check);
    }
  }

  // Starts the head task of stream s: its activities go in flight (or it completes at once).
  void start(Device& d, size_t s, int id, InFlight& flight, std::vector<size_t>& check) {
    Stream& stream = d.streams[s];
    const Task& t = plan_.task(id);
    start_[instance(id, stream.iteration)] = sg::Engine::get_clock();
    stream.running = true;
    switch (t.kind) {
      case TaskKind::forward:
      case TaskKind::backward:
      case TaskKind::backward_weight:
      case TaskKind::optimizer: {
        // Sized from the cost model's duration at the host's nominal speed: overheads and
        // roofline limits are kept, and a straggler's slower speed stretches them.
        const size_t at = instance(id, stream.iteration);
        const double duration = at < options_.compute_s.size() && options_.compute_s[at] >= 0
                                    ? options_.compute_s[at]
                                    : cost_.task_compute_time_s(plan_, t);
        stream.calls = plan_.inside(id);
        stream.call = 0;
        if (duration <= 0 && stream.calls.empty()) break;
        stream.work_flops = std::max(0.0, duration) * cost_.peak_flops_per_s(t.device);
        stream.cuts.clear();
        stream.cut = 0;
        for (const auto& next : graph_->successors(id)) {
          if (next.fraction < 1) stream.cuts.push_back(next.fraction);
        }
        for (const partition::InTaskCall& call : stream.calls) {
          stream.cuts.push_back(call.at);
          if (call.overlaps()) stream.cuts.push_back(call.until);  // where the work waits for it
        }
        if (!stream.cuts.empty()) {  // run the work in parts, releasing each successor at its own
          std::sort(stream.cuts.begin(), stream.cuts.end());
          stream.cuts.erase(std::unique(stream.cuts.begin(), stream.cuts.end()), stream.cuts.end());
          if (stream.cuts.back() < 1) stream.cuts.push_back(1);
        }
        const double first = stream.cuts.empty() ? 1 : stream.cuts.front();
        flight.add(sg::this_actor::exec_async(first * stream.work_flops), s);
        ++activities_;
        return;
      }
      case TaskKind::send: {
        const double bytes = options_.free_communication ? 0 : t.bytes;
        flight.add(mailbox_of_[static_cast<size_t>(id)]->put_async(&payload_, static_cast<uint64_t>(bytes)), s);
        ++activities_;
        return;
      }
      case TaskKind::recv:
        flight.add(mailbox_of_[static_cast<size_t>(id)]->get_async<int>(&received_), s);
        return;
      case TaskKind::collective:
        stream.steps = steps_->of(plan_.collective(t.collective), t);
        stream.step = 0;
        // A member's own read first (the gradient norm's sum of squares), on its compute units.
        if (const double local_s = cost_.memory_op_time_s(t.device, t.memory_bytes); local_s > 0) {
          stream.local_work = true;  // (finished_activity starts the steps after it)
          flight.add(sg::this_actor::exec_async(local_s * cost_.peak_flops_per_s(t.device)), s);
          ++activities_;
          return;
        }
        stream.collective = true;
        if (start_step(stream, s, flight)) return;
        break;
      case TaskKind::load:
      case TaskKind::to_host:
      case TaskKind::to_device:
      case TaskKind::host_optimizer:
        if (start_off_device(stream, s, id, flight)) return;
        break;
    }
    complete_head(d, s, check);  // nothing to wait for
  }

  // A task off the GPUs (a load, an offload copy or host step, off_device_work.hpp): its
  // executions at once, the task ending with the last. Tracked as a collective of no steps:
  // the stream completes when `outstanding` reaches 0. False when there is nothing to wait
  // for. A replayed one (SimOptions::compute_s) lasts its measured time on the timer instead:
  // what it did then, contention included.
  bool start_off_device(Stream& stream, size_t s, int id, InFlight& flight) {
    stream.steps.clear();
    stream.step = 0;
    stream.outstanding = 0;
    if (const size_t at = instance(id, stream.iteration); at < options_.compute_s.size() && options_.compute_s[at] >= 0) {
      if (!(options_.compute_s[at] > 0)) return false;
      start_timer(options_.compute_s[at], s, flight);
      stream.outstanding = 1;
      return stream.collective = true;
    }
    for (const OffDeviceWork& w : off_device_work(plan_, plan_.task(id), spec_, platform_, load_shares_)) {
      flight.add(sg::Exec::init()->set_flops_amount(w.amount)->set_host(w.host)->start(), s);
      ++stream.outstanding;
    }
    activities_ += stream.outstanding;
    stream.collective = stream.outstanding > 0;
    return stream.collective;
  }

  // A wait of `seconds` for stream s on the timer host. (Exec::init()->set_host: Host::exec_init
  // runs where the calling actor is, the device.)
  void start_timer(double seconds, size_t s, InFlight& flight, bool async = false) {
    flight.add(sg::Exec::init()->set_flops_amount(seconds * Platform::kTimerRate)->set_host(platform_.timer)
                   ->set_bound(Platform::kTimerRate)->start(), s, async);
    ++activities_;
  }

  // Issues the current step of stream s's collective (`async`: of its overlapped message);
  // false when there is none left.
  bool start_step(Stream& stream, size_t s, InFlight& flight, bool async = false) {
    // A wait of no time (a ring of no latency) is no step.
    while (stream.step < stream.steps.size() && stream.steps[stream.step].puts.empty() &&
           stream.steps[stream.step].gets.empty() && stream.steps[stream.step].flows.empty() &&
           !(stream.steps[stream.step].delay_s > 0 && !options_.free_communication)) {
      ++stream.step;
    }
    if (stream.step >= stream.steps.size()) return false;
    const MailboxStep& step = stream.steps[stream.step];
    if (step.delay_s > 0 && !options_.free_communication) {
      start_timer(step.delay_s, s, flight, async);
      stream.outstanding = 1;
      return true;
    }
    for (const auto& [box, bytes] : step.puts) {
      const auto size = static_cast<uint64_t>(options_.free_communication ? 0 : bytes);
      if (step.rate_cap > 0) {
        flight.add(box->put_init(&payload_, size)->set_rate(step.rate_cap)->start(), s, async);
      } else {
        flight.add(box->put_async(&payload_, size), s, async);
      }
      ++activities_;
    }
    for (sg::Mailbox* box : step.gets) flight.add(box->get_async<int>(&received_), s, async);
    for (const auto& [from, to, bytes] : step.flows) {
      sg::CommPtr flow = sg::Comm::sendto_init();
      if (step.rate_cap > 0) flow->set_rate(step.rate_cap);
      flow->set_source(platform_.hosts[static_cast<size_t>(from)]);
      flow->set_destination(platform_.hosts[static_cast<size_t>(to)]);
      flow->set_payload_size(static_cast<uint64_t>(options_.free_communication ? 0 : bytes));
      flight.add(flow->start(), s, async);
      ++activities_;
    }
    stream.outstanding = static_cast<int>(step.puts.size() + step.gets.size() + step.flows.size());
    return true;
  }

  void finished_activity(Device& d, size_t s, bool async, InFlight& flight, std::vector<size_t>& check) {
    Stream& stream = d.streams[s];
    if (stream.local_work) {  // a collective's own read is done: its steps
      stream.local_work = false;
      stream.collective = true;
      if (!start_step(stream, s, flight)) complete_head(d, s, check);
      return;
    }
    if (async) {  // a step of the message beside the work: the next, or the message is done
      if (--stream.outstanding > 0) return;
      ++stream.step;
      if (start_step(stream, s, flight, true)) return;
      traces::MessageTimes::Span& span = message(stream, static_cast<size_t>(stream.async_call));
      span.end_s = sg::Engine::get_clock();
      if (!stream.waiting_async) span.overlap_s = span.end_s - span.start_s;  // done before the work needed it
      stream.async_call = -1;
      if (stream.waiting_async) {  // the work waited for it: it goes on
        stream.waiting_async = false;
        continue_compute(d, s, flight, check);
      }
      return;
    }
    if (stream.collective) {
      if (--stream.outstanding > 0) return;
      ++stream.step;
      if (start_step(stream, s, flight)) return;
      if (stream.in_call) {  // an in-task message of a compute task is done: its work goes on
        message(stream, stream.call - 1).end_s = sg::Engine::get_clock();
        stream.collective = stream.in_call = false;
        continue_compute(d, s, flight, check);
        return;
      }
    } else if (!stream.cuts.empty()) {  // a part of a compute task: release who waits for it
      const double done = stream.cuts[stream.cut];
      if (done < 1) release((*stream.tasks)[stream.next], stream.iteration, done, check);
      continue_compute(d, s, flight, check);
      return;
    }
    complete_head(d, s, check);
  }

  // A compute task at point cuts[cut] of its work: first the wait for a message that overlaps
  // the work and is due here, then its in-task messages due here one after another (one that
  // overlaps the work starts beside it), then its next part, or its end.
  void continue_compute(Device& d, size_t s, InFlight& flight, std::vector<size_t>& check) {
    Stream& stream = d.streams[s];
    const double point = stream.cuts[stream.cut];
    if (stream.async_call >= 0 && stream.calls[static_cast<size_t>(stream.async_call)].until <= point) {
      traces::MessageTimes::Span& span = message(stream, static_cast<size_t>(stream.async_call));
      span.overlap_s = sg::Engine::get_clock() - span.start_s;  // the work went on until here
      stream.waiting_async = true;  // (finished_activity comes back here when it is done)
      return;
    }
    while (stream.call < stream.calls.size() && stream.calls[stream.call].at <= point) {
      const partition::InTaskCall& call = stream.calls[stream.call++];
      stream.steps = in_task_steps(call.collective, (*stream.tasks)[stream.next]);
      stream.step = 0;
      message(stream, stream.call - 1) = {sg::Engine::get_clock(), sg::Engine::get_clock(), -1};
      if (call.overlaps()) {
        stream.async_call = static_cast<int>(stream.call - 1);
        if (start_step(stream, s, flight, true)) break;  // (validation: no other message starts before its until)
        stream.async_call = -1;  // nothing to wait for
        continue;
      }
      stream.collective = stream.in_call = true;
      if (start_step(stream, s, flight)) return;
      stream.collective = stream.in_call = false;  // nothing to wait for (no bytes, no latency)
    }
    if (stream.cut + 1 < stream.cuts.size()) {
      ++stream.cut;
      flight.add(sg::this_actor::exec_async((stream.cuts[stream.cut] - point) * stream.work_flops), s);
      ++activities_;
      return;
    }
    complete_head(d, s, check);
  }

  // The times of the stream's in-task message calls[k].
  traces::MessageTimes::Span& message(const Stream& stream, size_t k) {
    return messages_.of((*stream.tasks)[stream.next], stream.iteration)[k];
  }

  // The steps of one message of in-task collective c in task `id`: those of a collective of
  // that one message (all its messages are alike), made once per collective and member.
  const std::vector<MailboxStep>& in_task_steps(int c, int id) {
    const Task& t = plan_.task(id);
    const auto key = static_cast<std::uint64_t>(c) * static_cast<std::uint64_t>(plan_.device_count()) +
                     static_cast<std::uint64_t>(t.device);
    auto found = in_task_steps_.find(key);
    if (found != in_task_steps_.end()) return found->second;
    Collective one = plan_.collective(c);
    one.bytes /= std::max(1, one.messages);
    one.messages = 1;
    Task member = t;
    member.collective = c;
    return in_task_steps_.emplace(key, steps_->of(one, member)).first->second;
  }

  // The successors of iteration i of task id that wait for `fraction` of its work.
  void release(int id, int i, double fraction, std::vector<size_t>& check) {
    for (const auto& next : graph_->successors(id)) {
      if (next.fraction != fraction || next.offset >= iterations_ - i) continue;  // (i + offset may not fit an int)
      if (--remaining(i + next.offset)[static_cast<size_t>(next.task)] == 0) {
        check.push_back(static_cast<size_t>(stream_index_[static_cast<size_t>(next.task)]));
      }
    }
  }

  void complete_head(Device& d, size_t s, std::vector<size_t>& check) {
    Stream& stream = d.streams[s];
    const auto id = static_cast<size_t>((*stream.tasks)[stream.next]);
    const int i = stream.iteration;
    end_[instance(static_cast<int>(id), i)] = sg::Engine::get_clock();
    done_[instance(static_cast<int>(id), i)] = 1;
    if (options_.on_progress && (++completed_ & 1023) == 0) report_progress();
    release(static_cast<int>(id), i, 1, check);  // (those waiting for a part were released with it)
    stream.running = false;
    stream.collective = stream.local_work = false;
    stream.steps.clear();
    stream.cuts.clear();
    stream.cut = 0;
    stream.calls = {};
    stream.call = 0;
    stream.in_call = false;
    stream.async_call = -1;
    stream.waiting_async = false;
    if (++stream.next == stream.tasks->size()) {  // the program again, one iteration later
      stream.next = 0;
      ++stream.iteration;
    }
    check.push_back(s);
  }

  // After a failure: every activity that failed stops its stream, with the reason.
  void drop_failed(Device& d, InFlight& flight, const std::string& why) {
    bool any = false;
    for (size_t i = flight.activities.size(); i-- > 0;) {
      if (flight.activities[i]->get_state() != sg::Activity::State::FAILED) continue;
      d.streams[flight.stream[i]].failure = why;
      flight.remove(i);
      any = true;
    }
    if (!any) {  // cannot tell which: stop everything in flight
      for (size_t s : flight.stream) d.streams[s].failure = why;
      for (const sg::ActivityPtr& a : flight.activities) cancel(a);
      flight = InFlight{};
    }
    // A failed stream's other activities (a collective's step) are abandoned too. They are
    // cancelled first: SimGrid prints a backtrace for a communication dropped while running.
    for (size_t i = flight.activities.size(); i-- > 0;) {
      if (d.streams[flight.stream[i]].failure.empty()) continue;
      cancel(flight.activities[i]);
      flight.remove(i);
    }
  }

  static void cancel(const sg::ActivityPtr& a) {
    const auto state = a->get_state();
    if (state != sg::Activity::State::STARTED && state != sg::Activity::State::STARTING) return;
    try {
      a->cancel();
    } catch (const simgrid::Exception&) {
      // already over: nothing to cancel
    }
  }

  // Reports progress when an interval of host time has passed since the last report.
  void report_progress() {
    const auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - last_report_).count() < options_.progress_interval_s) return;
    last_report_ = now;
    Progress p;
    p.simulated_s = sg::Engine::get_clock();
    p.fraction_done = static_cast<double>(completed_) / static_cast<double>(done_.size());
    p.activities = activities_;
    p.elapsed_s = std::chrono::duration<double>(now - wall_start_).count();
    options_.on_progress(p);
  }

  // --- results ---

  size_t instance(int task, int iteration) const {
    return static_cast<size_t>(iteration) * tasks_ + static_cast<size_t>(task);
  }

  SimResult collect() {
    SimResult r;
    r.simulated_s = sg::Engine::get_clock();
    r.activities = activities_;
    r.trace.source = "sim";
    r.trace.plan = plan_.network.name + " on " + plan_.cluster.name;
    r.trace.fingerprint = plan_.fingerprint;
    r.trace.device_names = plan_.device_names;
    r.completed = true;
    r.trace.events.reserve(done_.size() + messages_.size());
    for (int i = 0; i < iterations_; ++i) {
      for (size_t t = 0; t < tasks_; ++t) {
        const size_t at = instance(static_cast<int>(t), i);
        if (!done_[at]) {
          r.completed = false;
          continue;
        }
        traces::Event e = traces::task_event(plan_, static_cast<int>(t), i);
        e.start_s = start_[at];
        // A transfer starts when both sides are there: the later of the two posts.
        const int partner = graph_->partner(static_cast<int>(t));
        if (partner >= 0 && done_[instance(partner, i)]) e.start_s = std::max(e.start_s, start_[instance(partner, i)]);
        e.end_s = end_[at];
        r.trace.events.push_back(std::move(e));
        messages_.append_events(plan_, static_cast<int>(t), i, r.trace.events);
      }
    }
    traces::sort_events(r.trace);
    if (!r.completed) r.stalls = stall_report();
    return r;
  }

  std::vector<std::string> stall_report() {
    std::vector<std::string> lines;
    for (const Fault& f : options_.faults) {
      lines.push_back((f.device >= 0 ? "device " + plan_.device_name(f.device) : "link " + f.link) +
                      " failed at " + std::to_string(f.at_s) + " s");
    }
    size_t never_ran = 0;
    for (char d : done_) never_ran += d == 0;
    lines.push_back(std::to_string(never_ran) + " of " + std::to_string(done_.size()) + " tasks (" +
                    std::to_string(tasks_) + " per iteration x " + std::to_string(iterations_) + ") never completed");
    int shown = 0, stopped = 0;
    for (const Device& d : devices_) {
      for (const Stream& s : d.streams) {
        if (s.iteration >= iterations_) continue;
        ++stopped;
        if (++shown > 12) continue;
        const int id = (*s.tasks)[s.next];
        const Task& t = plan_.task(id);
        std::string line = plan_.device_name(d.id) + " stream " +
                           plan_.stream_name(s.stream) + ": stuck at " +
                           std::string(partition::to_string(t.kind)) + " #" + std::to_string(id) + " (iteration " +
                           std::to_string(s.iteration) + (t.stage >= 0 ? ", stage " + std::to_string(t.stage) : "") +
                           (t.microbatch >= 0 ? ", micro-batch " + std::to_string(t.microbatch) : "") + ")";
        const int waiting = remaining(s.iteration)[static_cast<size_t>(id)];
        if (!s.failure.empty()) {
          line += ": " + s.failure;
        } else if (!s.running && waiting > 0) {
          line += ": waits for " + std::to_string(waiting) + " unfinished input(s)";
        } else if (t.kind == TaskKind::send || t.kind == TaskKind::recv || t.kind == TaskKind::collective) {
          line += ": its peer never arrived";
        } else {
          line += ": its device stopped";
        }
        lines.push_back(line);
      }
    }
    if (shown > 12) lines.push_back("... and " + std::to_string(stopped - 12) + " more stopped streams");
    return lines;
  }

  const Plan& plan_;
  const SimOptions& options_;
  partition::CostModel cost_;
  size_t tasks_;     // per iteration
  int iterations_;
  PlatformSpec spec_;
  partition::LoadShares load_shares_;  // a folded plan's: what each simulated load stands for
  Platform platform_;
  std::optional<MailboxSteps> steps_;  // each collective's steps, once the platform exists
  std::vector<Device> devices_;
  std::optional<partition::RunGraph> graph_;  // successors, inputs per iteration, transfer partners
  std::vector<std::vector<int>> remaining_;   // per iteration, per task: inputs not yet done
  std::vector<int> stream_index_;     // per task: its stream's index in its device's streams
  std::vector<char> done_;            // per task instance (iteration x task)
  std::vector<double> start_, end_;   // per task instance
  traces::MessageTimes messages_;     // per in-task message instance
  std::vector<sg::Mailbox*> mailbox_of_;  // per send/recv task: its channel's mailbox
  long long activities_ = 0;
  long long completed_ = 0;  // task instances done (counted only when progress is reported)
  std::chrono::steady_clock::time_point wall_start_, last_report_;
  // In-task messages' steps per (collective, device): Simulation::in_task_steps.
  std::unordered_map<std::uint64_t, std::vector<MailboxStep>> in_task_steps_;
  int payload_ = 0;      // what messages carry: nothing; their simulated size is what matters
  int* received_ = nullptr;
};

}  // namespace

std::string engine_version() {
  return "SimGrid " + std::to_string(SIMGRID_VERSION_MAJOR) + "." + std::to_string(SIMGRID_VERSION_MINOR) + "." +
         std::to_string(SIMGRID_VERSION_PATCH);
}

SimResult simulate_here(const Plan& plan, const SimOptions& options) {
  for (const Fault& f : options.faults) {
    if (f.device >= plan.device_count()) throw InputError("<command line>", 0, "--fail-device", "no such device");
  }
  Simulation simulation(plan, options);
  return simulation.run();
}

}  // namespace hetflow::sim
