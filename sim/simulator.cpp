// The in-process simulation: one SimGrid actor per device stream walks that stream's program;
// a task starts when its data dependencies are done (condition variables) and the previous
// task of its stream has finished. Compute tasks execute on the device's host; transfers are
// mailbox communications over the platform's routes; collectives run their algorithm's
// point-to-point steps, so they share links with everything else.
#include "sim/simulator.hpp"

#include <simgrid/s4u.hpp>
#include <xbt/log.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>

#include "model/error.hpp"
#include "partition/cost_model.hpp"
#include "sim/platform.hpp"

namespace hetflow::sim {

namespace sg = simgrid::s4u;
using partition::Collective;
using partition::Plan;
using partition::Task;
using partition::TaskKind;

namespace {

struct StreamActor {
  int device = -1;
  int stream = -1;
  // The actor holds its own mutex for its whole life (the condition variable's wait needs
  // one); wakers only notify. Simcalls are handled in order, so a notification can never
  // slip between the waiter's check and its wait.
  sg::MutexPtr mutex;
  std::unique_lock<sg::Mutex> held;
  sg::ConditionVariablePtr ready;
  int waiting_on = -1;   // the task it waits for, -1 when running
  int current = -1;      // the task it is at (for stall reports)
  bool finished = false;
  std::string failure;   // why it stopped early
};

class Simulation {
 public:
  Simulation(const Plan& plan, const model::Cluster& cluster, const SimOptions& options)
      : plan_(plan), cluster_(cluster), options_(options),
        cost_(cluster, plan.layout.precision, options.calibration) {
    cost_.set_free_communication(options.free_communication);
  }

  SimResult run() {
    const auto wall_start = std::chrono::steady_clock::now();
    std::vector<double> speeds;
    for (int d = 0; d < cost_.device_count(); ++d) speeds.push_back(nominal_speed(d));
    size_t streams = 0;
    for (const auto& device : plan_.programs) streams += device.size();
    start_engine(streams);
    spec_ = platform_spec(cluster_, speeds);
    platform_ = instantiate_platform(spec_);
    const auto t_platform = std::chrono::steady_clock::now();
    prepare_dependencies();
    const auto t_dependencies = std::chrono::steady_clock::now();
    add_stragglers_and_faults();
    for (size_t d = 0; d < plan_.programs.size(); ++d) {
      for (const partition::StreamProgram& program : plan_.programs[d]) {
        if (program.tasks.empty()) continue;
        const auto s = static_cast<size_t>(program.stream);
        auto actor = std::make_unique<StreamActor>();
        actor->device = static_cast<int>(d);
        actor->stream = program.stream;
        actor->mutex = sg::Mutex::create();
        actor->ready = sg::ConditionVariable::create();
        const int index = static_cast<int>(actors_.size());
        for (int t : program.tasks) owner_[static_cast<size_t>(t)] = index;
        actors_.push_back(std::move(actor));
        sg::Actor::create(plan_.device_names[d] + ":" + plan_.streams[s], platform_.hosts[d],
                          [this, index] { run_stream(index); });
      }
    }
    const auto t_setup = std::chrono::steady_clock::now();
    sg::Engine::get_instance()->run();
    const auto t_run = std::chrono::steady_clock::now();
    // Actors that ended or were killed still "hold" their mutex; unlocking from outside an
    // actor is not allowed, so let the locks go without unlocking.
    for (auto& actor : actors_) actor->held.release();
    SimResult result = collect();
    if (std::getenv("HETFLOW_SIM_PHASES")) {
      const auto t_end = std::chrono::steady_clock::now();
      auto s = [](auto a, auto b) { return std::chrono::duration<double>(b - a).count(); };
      std::fprintf(stderr, "sim phases: setup %.2f s (platform %.2f, dependencies %.2f, actors %.2f), run %.2f s, collect %.2f s\n",
                   s(wall_start, t_setup), s(wall_start, t_platform), s(t_platform, t_dependencies), s(t_dependencies, t_setup),
                   s(t_setup, t_run), s(t_run, t_end));
    }
    result.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
    return result;
  }

 private:
  // Nominal host speed: the GPU's peak at the run's precision times its calibrated efficiency.
  // Executions are sized from the cost model's duration, so overheads and roofline limits are
  // kept and a straggler's slower speed stretches them.
  double nominal_speed(int device) const { return cost_.peak_flops_per_s(device); }

  void prepare_dependencies() {
    const size_t n = plan_.tasks.size();
    remaining_.assign(n, 0);
    successors_.assign(n, {});
    owner_.assign(n, -1);
    done_.assign(n, 0);
    start_.assign(n, 0);
    end_.assign(n, 0);
    for (auto [it, end] = boost::edges(plan_.graph); it != end; ++it) {
      const auto from = boost::source(*it, plan_.graph), to = boost::target(*it, plan_.graph);
      successors_[from].push_back(static_cast<int>(to));
      ++remaining_[to];
    }
    if (options_.free_communication) {
      // No communication at all: a receive simply waits for its send.
      std::map<int, int> send_of;
      for (size_t t = 0; t < n; ++t) {
        if (plan_.tasks[t].kind == TaskKind::send) send_of[plan_.tasks[t].group] = static_cast<int>(t);
      }
      for (size_t t = 0; t < n; ++t) {
        if (plan_.tasks[t].kind == TaskKind::recv) {
          successors_[static_cast<size_t>(send_of.at(plan_.tasks[t].group))].push_back(static_cast<int>(t));
          ++remaining_[t];
        }
      }
    }
    arrived_.assign(plan_.collectives.size(), 0);
    // Each channel's mailbox, looked up once: "<src>><dst>:<tag>".
    mailbox_of_.assign(n, nullptr);
    for (size_t t = 0; t < n; ++t) {
      const Task& task = plan_.tasks[t];
      if (task.kind != TaskKind::send && task.kind != TaskKind::recv) continue;
      const std::string tag = channel_tag(plan_.streams[static_cast<size_t>(task.stream)]);
      mailbox_of_[t] = task.kind == TaskKind::send ? channel(task.device, task.peer, tag) : channel(task.peer, task.device, tag);
    }
  }

  void add_stragglers_and_faults() {
    for (const Straggler& s : options_.stragglers) set_straggler(platform_, s.device, s.factor, s.from_s);
    for (const Fault& f : options_.faults) {
      sg::Actor::create("fault", platform_.hosts.front(), [this, f] {
        sg::Actor::self()->daemonize();  // a fault after the run has ended does not prolong it
        sg::this_actor::sleep_until(f.at_s);
        if (f.device >= 0) {
          failed_devices_.push_back(f);
          platform_.hosts[static_cast<size_t>(f.device)]->turn_off();
        } else {
          failed_links_.push_back(f);
          platform_.links[static_cast<size_t>(spec_.link_index(f.link))]->turn_off();
        }
      });
    }
  }

  void run_stream(int index) {
    StreamActor& a = *actors_[static_cast<size_t>(index)];
    a.held = std::unique_lock<sg::Mutex>(*a.mutex);
    try {
      for (int task : plan_.program(a.device, a.stream)) {
        a.current = task;
        wait_until(a, [this, task] { return remaining_[static_cast<size_t>(task)] == 0; }, task);
        execute(a, task);
        complete(task);
      }
      a.finished = true;
      a.current = -1;
    } catch (const simgrid::NetworkFailureException& e) {
      a.failure = std::string("a link on its route failed at ") + std::to_string(sg::Engine::get_clock()) + " s";
    } catch (const simgrid::Exception& e) {
      a.failure = std::string("stopped at ") + std::to_string(sg::Engine::get_clock()) + " s: " + e.what();
    }
  }

  template <typename Ready>
  void wait_until(StreamActor& a, Ready ready, int task) {
    if (ready()) return;
    a.waiting_on = task;
    while (!ready()) a.ready->wait(a.held);
    a.waiting_on = -1;
  }

  void wake(int task) {
    const int owner = owner_[static_cast<size_t>(task)];
    if (owner < 0) return;
    StreamActor& a = *actors_[static_cast<size_t>(owner)];
    if (a.waiting_on == task) a.ready->notify_all();
  }

  void complete(int task) {
    done_[static_cast<size_t>(task)] = 1;
    for (int s : successors_[static_cast<size_t>(task)]) {
      if (--remaining_[static_cast<size_t>(s)] == 0) wake(s);
    }
  }

  void execute(StreamActor& a, int id) {
    const Task& t = plan_.tasks[static_cast<size_t>(id)];
    start_[static_cast<size_t>(id)] = sg::Engine::get_clock();
    switch (t.kind) {
      case TaskKind::forward:
      case TaskKind::backward:
      case TaskKind::backward_weight:
      case TaskKind::optimizer: {
        const double duration = cost_.compute_time_s(t.device, t.flops, t.memory_bytes);
        if (duration > 0) {
          sg::this_actor::execute(duration * nominal_speed(t.device));
          ++activities_;
        }
        break;
      }
      case TaskKind::send:
        if (!options_.free_communication) transfer_send(t, id);
        break;
      case TaskKind::recv:
        if (!options_.free_communication) transfer_recv(t, id);
        break;
      case TaskKind::collective:
        run_collective(a, t, id);
        break;
    }
    end_[static_cast<size_t>(id)] = sg::Engine::get_clock();
  }

  // --- point-to-point ---
  static std::string channel_tag(const std::string& stream) {
    const size_t colon = stream.find(':');
    return colon == std::string::npos ? stream : stream.substr(colon + 1);
  }

  sg::Mailbox* channel(int src, int dst, const std::string& tag) {
    return sg::Mailbox::by_name(std::to_string(src) + ">" + std::to_string(dst) + ":" + tag);
  }


  void transfer_send(const Task& t, int id) {
    sg::Mailbox* box = mailbox_of_[static_cast<size_t>(id)];
    sg::CommPtr comm = box->put_init(&payload_, static_cast<uint64_t>(t.bytes));
    comm->start();
    comm->wait();
    ++activities_;
    (void)id;
  }

  void transfer_recv(const Task& t, int id) {
    sg::Mailbox* box = mailbox_of_[static_cast<size_t>(id)];
    int* received = nullptr;
    sg::CommPtr comm = box->get_async<int>(&received);
    comm->wait();
    start_[static_cast<size_t>(id)] = comm->get_start_time();
    (void)t;
  }

  // --- collectives ---
  void run_collective(StreamActor& a, const Task& t, int id) {
    const Collective& c = plan_.collectives[static_cast<size_t>(t.group)];
    const auto it = std::find(c.tasks.begin(), c.tasks.end(), id);
    const int me = static_cast<int>(it - c.tasks.begin());
    if (options_.free_communication || c.devices.size() < 2 || c.bytes <= 0) {
      // Instantaneous, but still a rendezvous: everyone leaves when the last one arrives.
      if (++arrived_[static_cast<size_t>(t.group)] == static_cast<int>(c.devices.size())) {
        for (int other : c.tasks) {
          if (other != id) {
            collective_released_.insert(other);
            wake(other);
          }
        }
      } else {
        wait_until(a, [this, id] { return collective_released_.count(id) > 0; }, id);
      }
      return;
    }
    const std::string scope = std::to_string(t.stream);
    switch (c.algorithm) {
      case partition::AllReduceAlgorithm::ring:
        ring(c.devices, me, 2 * (static_cast<int>(c.devices.size()) - 1), c.bytes / c.devices.size(), "ring" + scope);
        break;
      case partition::AllReduceAlgorithm::tree:
        tree(c.devices, me, c.bytes, "tree" + scope);
        break;
      case partition::AllReduceAlgorithm::hierarchical:
        hierarchical(c.devices, me, c.bytes, "hier" + scope);
        break;
    }
  }

  // `steps` ring steps: send a chunk to the next participant while receiving one from the
  // previous (reduce-scatter then all-gather: 2(n-1) steps of S/n for an all-reduce).
  void ring(const std::vector<int>& group, int me, int steps, double chunk_bytes, const std::string& tag) {
    const int n = static_cast<int>(group.size());
    if (n < 2 || steps <= 0) return;
    const int self = group[static_cast<size_t>(me)];
    const int next = group[static_cast<size_t>((me + 1) % n)];
    const int prev = group[static_cast<size_t>((me + n - 1) % n)];
    sg::Mailbox* out = channel(self, next, tag);
    sg::Mailbox* in = channel(prev, self, tag);
    for (int s = 0; s < steps; ++s) {
      sg::CommPtr put = out->put_init(&payload_, static_cast<uint64_t>(chunk_bytes));
      put->start();
      int* received = nullptr;
      sg::CommPtr get = in->get_async<int>(&received);
      put->wait();
      get->wait();
      ++activities_;
    }
  }

  // Reduce up a binary tree, then broadcast down, both pipelined in chunks (as NCCL does).
  void tree(const std::vector<int>& group, int me, double bytes, const std::string& tag) {
    constexpr int kChunks = 4;
    const int n = static_cast<int>(group.size());
    const int self = group[static_cast<size_t>(me)];
    const double chunk = bytes / kChunks;
    std::vector<int> children;
    for (int c : {2 * me + 1, 2 * me + 2}) {
      if (c < n) children.push_back(group[static_cast<size_t>(c)]);
    }
    const int parent = me > 0 ? group[static_cast<size_t>((me - 1) / 2)] : -1;
    auto send = [&](int to) {
      sg::CommPtr put = channel(self, to, tag)->put_init(&payload_, static_cast<uint64_t>(chunk));
      put->start();
      ++activities_;
      return put;
    };
    auto receive = [&](int from) {
      int* received = nullptr;
      channel(from, self, tag)->get_async<int>(&received)->wait();
    };
    std::vector<sg::CommPtr> pending;
    for (int k = 0; k < kChunks; ++k) {  // reduce
      for (int child : children) receive(child);
      if (parent >= 0) pending.push_back(send(parent));
    }
    for (int k = 0; k < kChunks; ++k) {  // broadcast
      if (parent >= 0) receive(parent);
      for (int child : children) pending.push_back(send(child));
    }
    for (auto& p : pending) p->wait();
  }

  // Intra-node ring reduce-scatter, inter-node ring all-reduce of each slice among the
  // devices with the same local index, intra-node ring all-gather.
  void hierarchical(const std::vector<int>& group, int me, double bytes, const std::string& tag) {
    std::vector<int> nodes;
    std::map<int, std::vector<int>> local;
    for (int d : group) {
      if (local.count(cost_.node_of(d)) == 0) nodes.push_back(cost_.node_of(d));
      local[cost_.node_of(d)].push_back(d);
    }
    const int self = group[static_cast<size_t>(me)];
    const std::vector<int>& mine = local[cost_.node_of(self)];
    const int local_index = static_cast<int>(std::find(mine.begin(), mine.end(), self) - mine.begin());
    const int k = static_cast<int>(mine.size());
    ring(mine, local_index, k - 1, bytes / k, tag + "a");
    std::vector<int> peers;
    for (int node : nodes) {
      const auto& g = local[node];
      if (static_cast<int>(g.size()) > local_index) peers.push_back(g[static_cast<size_t>(local_index)]);
    }
    const int position = static_cast<int>(std::find(peers.begin(), peers.end(), self) - peers.begin());
    const int nn = static_cast<int>(peers.size());
    ring(peers, position, 2 * (nn - 1), bytes / k / nn, tag + "b");
    ring(mine, local_index, k - 1, bytes / k, tag + "c");
  }

  SimResult collect() {
    SimResult r;
    r.simulated_s = sg::Engine::get_clock();
    r.activities = activities_;
    r.trace.source = "sim";
    r.trace.plan = plan_.network_name + " on " + plan_.cluster_name;
    r.trace.device_names = plan_.device_names;
    r.completed = true;
    for (size_t t = 0; t < plan_.tasks.size(); ++t) {
      if (!done_[t]) {
        r.completed = false;
        continue;
      }
      const Task& task = plan_.tasks[t];
      traces::Event e;
      e.task = static_cast<int>(t);
      e.device = task.device;
      e.stream = plan_.streams[static_cast<size_t>(task.stream)];
      e.kind = std::string(partition::to_string(task.kind));
      e.purpose = std::string(partition::to_string(task.purpose));
      e.iteration = task.iteration;
      e.stage = task.stage;
      e.microbatch = task.microbatch;
      e.peer = task.peer;
      e.group = task.group;
      e.start_s = start_[t];
      e.end_s = end_[t];
      e.bytes = task.bytes;
      e.flops = task.flops;
      r.trace.events.push_back(std::move(e));
    }
    traces::sort_events(r.trace);
    if (!r.completed) r.stalls = stall_report();
    return r;
  }

  std::vector<std::string> stall_report() const {
    std::vector<std::string> lines;
    for (const Fault& f : failed_devices_) {
      lines.push_back("device " + plan_.device_names[static_cast<size_t>(f.device)] + " failed at " +
                      std::to_string(f.at_s) + " s");
    }
    for (const Fault& f : failed_links_) lines.push_back("link " + f.link + " failed at " + std::to_string(f.at_s) + " s");
    size_t never_ran = 0;
    for (char d : done_) never_ran += d == 0;
    lines.push_back(std::to_string(never_ran) + " of " + std::to_string(plan_.tasks.size()) + " tasks never completed");
    int shown = 0;
    for (const auto& a : actors_) {
      if (a->finished || a->current < 0) continue;
      if (++shown > 12) continue;
      const Task& t = plan_.tasks[static_cast<size_t>(a->current)];
      std::string line = plan_.device_names[static_cast<size_t>(a->device)] + " stream " +
                         plan_.streams[static_cast<size_t>(a->stream)] + ": stuck at " +
                         std::string(partition::to_string(t.kind)) + " #" + std::to_string(a->current) +
                         " (iteration " + std::to_string(t.iteration) +
                         (t.stage >= 0 ? ", stage " + std::to_string(t.stage) : "") +
                         (t.microbatch >= 0 ? ", micro-batch " + std::to_string(t.microbatch) : "") + ")";
      if (!a->failure.empty()) {
        line += ": " + a->failure;
      } else if (a->waiting_on >= 0 && remaining_[static_cast<size_t>(a->waiting_on)] > 0) {
        line += ": waits for " + std::to_string(remaining_[static_cast<size_t>(a->waiting_on)]) + " unfinished input(s)";
      } else if (t.kind == TaskKind::send || t.kind == TaskKind::recv || t.kind == TaskKind::collective) {
        line += ": its peer never arrived";
      }
      lines.push_back(line);
    }
    if (shown > 12) lines.push_back("... and " + std::to_string(shown - 12) + " more stopped streams");
    return lines;
  }

  const Plan& plan_;
  const model::Cluster& cluster_;
  const SimOptions& options_;
  partition::CostModel cost_;
  PlatformSpec spec_;
  Platform platform_;
  std::vector<std::unique_ptr<StreamActor>> actors_;
  std::vector<sg::Mailbox*> mailbox_of_;  // per send/recv task
  std::vector<int> remaining_, owner_;
  std::vector<std::vector<int>> successors_;
  std::vector<char> done_;
  std::vector<double> start_, end_;
  std::vector<int> arrived_;
  std::set<int> collective_released_;
  std::vector<Fault> failed_devices_, failed_links_;
  long long activities_ = 0;
  int payload_ = 0;  // what messages carry: nothing; their simulated size is what matters
};

}  // namespace

SimResult simulate_here(const Plan& plan, const model::Cluster& cluster, const SimOptions& options) {
  for (const Fault& f : options.faults) {
    if (f.device >= cluster.device_count()) throw InputError("<command line>", 0, "--fail-device", "no such device");
  }
  Simulation simulation(plan, cluster, options);
  return simulation.run();
}

}  // namespace hetflow::sim
