// How the engine runs a plan: a thread per device stream. Each thread walks its program,
// iteration after iteration; before a task it sleeps on its device's condition variable until
// the task's unfinished-input count for that iteration is zero. Dependencies never cross
// devices (partition::RunGraph refuses such plans: devices meet only through transfers and
// collectives, which the back end matches), so one mutex per device guards that device's
// counters, tensors and stream states. The calling thread is the watchdog: it polls the
// count of completed task instances and stops the run when it stops moving.
#include "exec/engine.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>

#include "exec/interrupt.hpp"
#include "model/units.hpp"
#include "partition/run_graph.hpp"
#include "partition/task_order.hpp"
#include "traces/message_times.hpp"
#include "traces/task_event.hpp"

namespace hetflow::exec {

namespace {

using partition::Plan;
using partition::Task;
using partition::TaskKind;
using partition::Tensor;
using Clock = std::chrono::steady_clock;

enum class Phase { waiting, running, finished };

constexpr const char* kNotInAProgram = "some tasks are in no device's program and never ran";

struct StreamState {  // guarded by its device's mutex
  int task = -1;
  int iteration = 0;
  Phase phase = Phase::waiting;
  std::string waiting_for;  // what the back end said it waits for
};

struct DeviceState {
  std::mutex mutex;
  std::condition_variable wake;
  std::vector<StreamState> streams;  // one per StreamProgram of the device
  DeviceMemoryUse memory;
  double live_bytes = 0, allocated_bytes = 0;
};

struct HostBuffer {
  std::unique_ptr<std::byte[]> data;
  size_t size_bytes = 0;
  Buffer view() const { return {data.get(), size_bytes}; }
};

// Task ids grouped by a tensor field (producer or free_after), as compressed rows.
struct TensorsByTask {
  std::vector<int> begin, tensors;
  std::span<const int> of(int task) const {
    const auto t = static_cast<size_t>(task);
    return {tensors.data() + begin[t], static_cast<size_t>(begin[t + 1] - begin[t])};
  }
};

TensorsByTask transient_by(const Plan& plan, int Tensor::*field) {
  TensorsByTask out;
  out.begin.assign(plan.tasks.size() + 1, 0);
  auto counted = [&](const Tensor& t) {
    return !partition::is_persistent(t.kind) && t.*field >= 0 && static_cast<size_t>(t.*field) < plan.tasks.size();
  };
  for (const Tensor& t : plan.tensors) {
    if (counted(t)) ++out.begin[static_cast<size_t>(t.*field) + 1];
  }
  for (size_t i = 0; i < plan.tasks.size(); ++i) out.begin[i + 1] += out.begin[i];
  out.tensors.resize(static_cast<size_t>(out.begin.back()));
  std::vector<int> fill(out.begin.begin(), out.begin.end() - 1);
  for (size_t i = 0; i < plan.tensors.size(); ++i) {
    if (counted(plan.tensors[i])) out.tensors[static_cast<size_t>(fill[static_cast<size_t>(plan.tensors[i].*field)]++)] = static_cast<int>(i);
  }
  return out;
}


class Context final : public TaskContext {
 public:
  Context(DeviceState& device, StreamState& stream, Clock::time_point start)
      : device_(device), stream_(stream), start_(start) {}
  void waiting_for(std::string what) override {
    std::lock_guard lock(device_.mutex);
    stream_.waiting_for = std::move(what);
  }
  double now_s() const override { return std::chrono::duration<double>(Clock::now() - start_).count(); }

 private:
  DeviceState& device_;
  StreamState& stream_;
  Clock::time_point start_;
};

class Run {
 public:
  Run(const Plan& plan, Backend& backend, const EngineOptions& options)
      : plan_(plan), backend_(backend), options_(options), graph_(plan), tasks_(plan.tasks.size()),
        iterations_(options.iterations > 0 ? options.iterations : plan.iterations()),
        first_(options.first_iteration),
        ranks_(options.ranks != nullptr && !options.ranks->alone() ? options.ranks : nullptr) {
    if (iterations_ < 1) throw PlanError("the plan runs no iteration (layout.iterations < 1)");
    if (first_ < 0) throw InputError("<options>", 0, "first_iteration", "expected an iteration >= 0");
    if (!(options.watchdog_s > 0)) throw InputError("<options>", 0, "watchdog_s", "expected a positive time");
    if (!(options.max_buffer_bytes >= 0)) throw InputError("<options>", 0, "max_buffer_bytes", "expected >= 0");
    for (size_t t = 0; t < plan.tensors.size(); ++t) {
      const Tensor& tensor = plan.tensors[t];
      if (tensor.device < 0 || tensor.device >= plan.device_count()) {
        throw PlanError("tensor " + std::to_string(t) + " is on device " + std::to_string(tensor.device) +
                        ", which the plan does not have");
      }
    }
    allocates_ = transient_by(plan, &Tensor::producer);
    frees_ = transient_by(plan, &Tensor::free_after);
    const size_t instances = tasks_ * static_cast<size_t>(iterations_);
    remaining_.resize(instances);
    for (int i = 0; i < iterations_; ++i) {
      const std::vector<int> inputs = graph_.inputs(i);
      std::copy(inputs.begin(), inputs.end(), remaining_.begin() + static_cast<std::ptrdiff_t>(index(0, i)));
    }
    done_.assign(instances, 0);
    start_s_.assign(instances, 0);
    end_s_.assign(instances, 0);
    carried_bytes_.assign(instances, -1);
    messages_ = traces::MessageTimes(plan, iterations_);
    transient_.resize(plan.tensors.size() * static_cast<size_t>(iterations_));
    persistent_.resize(plan.tensors.size());
    for (size_t d = 0; d < plan.programs.size(); ++d) {
      devices_.push_back(std::make_unique<DeviceState>());
      devices_.back()->streams.resize(plan.programs[d].size());
    }
    devices_.resize(static_cast<size_t>(plan.device_count()));
    for (const Task& t : plan.tasks) local_tasks_ += local(t.device) ? 1 : 0;
    iteration_done_ = std::make_unique<std::atomic<long long>[]>(static_cast<size_t>(iterations_));
    iteration_end_s_ = std::make_unique<std::atomic<double>[]>(static_cast<size_t>(iterations_));
    for (auto& d : devices_) {
      if (!d) d = std::make_unique<DeviceState>();
    }
    if (ranks_ != nullptr) {
      ranks_->check_devices(plan.device_count());
      ranks_->begin_run();  // before the back end makes its lanes
    }
    backend_.prepare(plan);  // first: it may size the buffers (Backend::buffer_bytes)
    // Persistent tensors, and transient ones nothing produces, live for the whole run.
    for (size_t t = 0; t < plan.tensors.size(); ++t) {
      const Tensor& tensor = plan.tensors[t];
      if (!partition::is_persistent(tensor.kind) && tensor.producer >= 0) continue;
      if (!local(tensor.device)) continue;
      try {
        persistent_[t] = allocate(static_cast<int>(t));
      } catch (const std::bad_alloc&) {  // named here: main's generic message cannot say which
        throw Error("out of memory for the host buffer of tensor " + std::to_string(t) + " (" +
                    std::string(partition::to_string(tensor.kind)) + " on device " + std::to_string(tensor.device) +
                    ", " + model::units::human_bytes(static_cast<double>(buffer_size(static_cast<int>(t)))) +
                    "), which lives for the whole run (see --max-buffer)");
      }
      DeviceState& d = *devices_[static_cast<size_t>(tensor.device)];
      d.memory.persistent_bytes += tensor.bytes;
      d.allocated_bytes += static_cast<double>(persistent_[t].size_bytes);
      d.memory.peak_allocated_bytes = d.allocated_bytes;
    }
  }

  RunResult run() {
    if (ranks_ != nullptr) ranks_->barrier();  // the ranks start together
    start_ = Clock::now();
    if (ranks_ != nullptr) clock_offset_s_ = ranks_->clock_offset_s([this] { return now_s(); });
    std::vector<std::thread> threads;
    try {
      for (size_t d = 0; d < plan_.programs.size(); ++d) {
        if (!local(static_cast<int>(d))) continue;
        for (size_t s = 0; s < plan_.programs[d].size(); ++s) {
          if (plan_.programs[d][s].tasks.empty()) continue;
          threads.emplace_back([this, d, s] {
            stream_main(static_cast<int>(d), s);
            thread_exited();
          });
        }
      }
    } catch (const std::exception& e) {  // (a thread limit): the run stops as on any failure
      {
        std::lock_guard lock(error_mutex_);
        if (error_.empty()) error_ = "could not start stream thread " + std::to_string(threads.size() + 1) + ": " + e.what();
      }
      stop_all();
    }
    watch(threads.size());
    for (std::thread& t : threads) t.join();
    return result();
  }

 private:
  bool local(int device) const { return ranks_ == nullptr || ranks_->owner(device, plan_.device_count()) == ranks_->rank(); }

  size_t index(int task, int iteration) const {
    return static_cast<size_t>(iteration) * tasks_ + static_cast<size_t>(task);
  }
  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  size_t buffer_size(int tensor) const {
    const std::optional<size_t> exact = backend_.buffer_bytes(tensor);
    return exact ? *exact : static_cast<size_t>(std::min(plan_.tensor(tensor).bytes, options_.max_buffer_bytes));
  }

  HostBuffer allocate(int tensor) const {
    HostBuffer b;
    b.size_bytes = buffer_size(tensor);
    b.data = std::make_unique<std::byte[]>(b.size_bytes);  // zeroed: runs are bitwise reproducible
    return b;
  }

  Buffer buffer(int tensor, int iteration) const {
    const auto t = static_cast<size_t>(tensor);
    if (partition::is_persistent(plan_.tensors[t].kind) || plan_.tensors[t].producer < 0) return persistent_[t].view();
    return transient_[static_cast<size_t>(iteration) * plan_.tensors.size() + t].view();
  }

  // Under the device's lock: the task's product gets its buffers; the task's views are filled.
  void acquire(DeviceState& d, int task, int iteration, std::vector<Buffer>& reads, std::vector<Buffer>& writes) {
    for (int t : allocates_.of(task)) {
      const Tensor& tensor = plan_.tensor(t);
      HostBuffer& b = transient_[static_cast<size_t>(iteration) * plan_.tensors.size() + static_cast<size_t>(t)];
      if (b.data) continue;
      b = allocate(t);
      d.live_bytes += tensor.bytes;
      d.allocated_bytes += static_cast<double>(b.size_bytes);
      d.memory.peak_transient_bytes = std::max(d.memory.peak_transient_bytes, d.live_bytes);
      d.memory.peak_allocated_bytes = std::max(d.memory.peak_allocated_bytes, d.allocated_bytes);
    }
    reads.clear();
    writes.clear();
    for (int t : plan_.reads(task)) reads.push_back(buffer(t, iteration));
    for (int t : plan_.writes(task)) writes.push_back(buffer(t, iteration));
  }

  // Under the device's lock, after the task: the tensors it is the last user of go.
  void release(DeviceState& d, int task, int iteration) {
    for (int t : frees_.of(task)) {
      HostBuffer& b = transient_[static_cast<size_t>(iteration) * plan_.tensors.size() + static_cast<size_t>(t)];
      if (!b.data && b.size_bytes == 0) continue;
      d.live_bytes -= plan_.tensor(t).bytes;
      d.allocated_bytes -= static_cast<double>(b.size_bytes);
      b = HostBuffer{};
    }
  }

  void stream_main(int device, size_t s) {
    DeviceState& d = *devices_[static_cast<size_t>(device)];
    StreamState& state = d.streams[s];
    const partition::StreamProgram& program = plan_.programs[static_cast<size_t>(device)][s];
    std::vector<Buffer> reads, writes;
    std::string refused;
    for (int i = 0; i < iterations_; ++i) {
      for (int task : program.tasks) {
        {
          std::unique_lock lock(d.mutex);
          state.task = task;
          state.iteration = i;
          state.phase = Phase::waiting;
          state.waiting_for.clear();
          d.wake.wait(lock, [&] { return stop_.load() || remaining_[index(task, i)] <= 0; });
          if (stop_.load()) return;
          state.phase = Phase::running;
          try {
            acquire(d, task, i, reads, writes);
          } catch (const std::bad_alloc&) {
            refused = "out of memory for the host buffers of the tensors it writes (see --max-buffer)";
          }
        }
        if (!refused.empty()) {  // (fail() takes every device's lock)
          fail(task, i, refused);
          return;
        }
        Context context(d, state, start_);
        context.task = task;
        context.iteration = first_ + i;
        context.messages = messages_.of(task, i);
        context.spec = &plan_.task(task);
        context.reads = reads;
        context.writes = writes;
        const size_t at = index(task, i);
        start_s_[at] = now_s();
        try {
          backend_.run(context);
          end_s_[at] = now_s();
          carried_bytes_[at] = context.carried_bytes;
          if (options_.on_task_end) options_.on_task_end(TaskView{task, first_ + i, reads, writes});
        } catch (const Stopped&) {
          return;
        } catch (const std::exception& e) {
          fail(task, i, e.what());
          return;
        } catch (...) {
          fail(task, i, "an exception that is not a std::exception");
          return;
        }
        {
          std::lock_guard lock(d.mutex);
          done_[at] = 1;
          for (const auto& next : graph_.successors(task)) {
            if (next.offset >= iterations_ - i) continue;  // beyond the run
            --remaining_[index(next.task, i + next.offset)];
          }
          release(d, task, i);
          state.waiting_for.clear();
        }
        d.wake.notify_all();
        completed_.fetch_add(1, std::memory_order_relaxed);
        if (iteration_done_[static_cast<size_t>(i)].fetch_add(1) + 1 == local_tasks_) {
          iteration_end_s_[static_cast<size_t>(i)].store(std::max(now_s(), 1e-9));  // (0 says: not yet)
        }
      }
    }
    std::lock_guard lock(d.mutex);
    state.phase = Phase::finished;
  }

  void fail(int task, int iteration, const std::string& what) {
    {
      std::lock_guard lock(error_mutex_);
      if (error_.empty() && !stop_.load()) {
        error_ = partition::describe_task(plan_, task) + ", iteration " + std::to_string(first_ + iteration) + ": " + what;
      }
    }
    stop_all();
  }

  void stop_all() {
    stop_.store(true);
    backend_.stop();
    for (auto& d : devices_) {
      { std::lock_guard lock(d->mutex); }  // a thread between its check and its sleep sees stop_
      d->wake.notify_all();
    }
  }

  // The calling thread: wait for the stream threads, stopping the run when nothing completes
  // for watchdog_s. Under mpirun every rank polls a sum over the ranks of (task instances
  // completed, ranks done, ranks failed, ranks stalled): progress anywhere feeds the
  // watchdog, a failure or stall anywhere stops every rank, and all leave together once
  // every rank is done.
  void watch(size_t threads) {
    long long seen = -1;
    auto last_progress = Clock::now();
    const double poll_s = std::min(ranks_ != nullptr ? 0.01 : 0.05, options_.watchdog_s / 4);
    const auto poll = std::chrono::duration<double>(poll_s);
    std::vector<long long> total;
    for (;;) {
      bool exited = false;
      {
        std::unique_lock lock(exit_mutex_);
        exited = exit_wake_.wait_for(lock, poll, [&] { return exited_ == threads; });
      }
      long long completed = completed_.load(std::memory_order_relaxed);
      report_progress();
      if (ranks_ == nullptr) {
        if (exited) return;
        check_interrupt();
      } else {
        check_interrupt();  // before `failed` is read: the other ranks stop with this one
        bool failed = false, stalled = false;
        {
          std::lock_guard lock(error_mutex_);
          failed = !error_.empty() && !stalled_;
          stalled = stalled_;
        }
        const long long mine[] = {completed, exited ? 1 : 0, failed ? 1 : 0, stalled ? 1 : 0};
        if (exited) std::this_thread::sleep_for(poll / 4);  // nothing to wait on here: don't spin
        if (!ranks_->poll_sum(mine, total)) continue;
        if (total[1] == ranks_->size()) return;
        if (total[3] > 0 && !stop_.load()) {
          stall();  // another rank's watchdog fired: say where this rank's streams are
          continue;
        }
        if (total[2] > 0 && !stop_.load()) stop_all();  // another rank failed; its error is the run's
        completed = total[0];
      }
      if (stop_.load()) continue;  // a failure: the threads are ending
      if (completed != seen) {
        seen = completed;
        last_progress = Clock::now();
      } else if (std::chrono::duration<double>(Clock::now() - last_progress).count() >= options_.watchdog_s) {
        stall();
      }
    }
  }

  // Where this process's devices are: the first iteration not all of whose local instances
  // ended (one ends when its last instance's thread has stored the time).
  RunProgress progress() {
    RunProgress p;
    p.iterations = iterations_;
    p.iteration_tasks = local_tasks_;
    while (progress_iteration_ < iterations_ && iteration_end_s_[static_cast<size_t>(progress_iteration_)].load() > 0) {
      ++progress_iteration_;
    }
    p.iteration = progress_iteration_;
    if (p.iteration < iterations_) p.iteration_done = iteration_done_[static_cast<size_t>(p.iteration)].load();
    p.completed = completed_.load(std::memory_order_relaxed);
    p.elapsed_s = now_s();
    if (p.iteration > 0) {
      const double end_s = iteration_end_s_[static_cast<size_t>(p.iteration - 1)].load();
      const double before_s = p.iteration > 1 ? iteration_end_s_[static_cast<size_t>(p.iteration - 2)].load() : 0;
      p.last_iteration_s = std::max(0.0, end_s - before_s);  // (streams may end iterations out of order)
    }
    return p;
  }

  // The watching thread: on_progress every progress_every_s.
  void report_progress() {
    if (!options_.on_progress || now_s() - last_progress_s_ < options_.progress_every_s) return;
    last_progress_s_ = now_s();
    options_.on_progress(progress());
  }

  // The watching thread: a signal stops the run as a failure would, with its own message.
  void check_interrupt() {
    if (options_.interrupt == nullptr || stop_.load()) return;
    const int sig = options_.interrupt->load();
    if (sig == 0) return;
    const RunProgress p = progress();
    const std::string where = p.iteration < p.iterations
                                  ? " during step " + std::to_string(first_ + p.iteration + 1) +
                                        (first_ == 0 ? " of " + std::to_string(p.iterations) : "")
                                  : "";
    {
      std::lock_guard lock(error_mutex_);
      if (error_.empty()) {
        error_ = "interrupted by " + signal_name(sig) + where;
        interrupted_ = sig;
      }
    }
    stop_all();
  }

  // (A failure that came first keeps its own message: the stall is its consequence.)
  void stall() {
    std::string lines = stuck_streams();
    {
      std::lock_guard lock(error_mutex_);
      if (error_.empty()) {
        stall_lines_ = lines;
        error_ = stall_header() + lines;
        stalled_ = true;
      }
    }
    stop_all();
  }

  void thread_exited() {
    {
      std::lock_guard lock(exit_mutex_);
      ++exited_;
    }
    exit_wake_.notify_one();
  }

  std::string stall_header() const {
    return "no task completed for " + model::units::human_time_s(options_.watchdog_s) + " (watchdog); the run stopped with:";
  }

  // Per stuck stream of this rank: where it is and what it waits for, a line each. Reads each
  // device under its lock.
  std::string stuck_streams() {
    std::string out;
    int shown = 0, stuck = 0;
    for (size_t dev = 0; dev < plan_.programs.size(); ++dev) {
      DeviceState& d = *devices_[dev];
      std::lock_guard lock(d.mutex);
      for (size_t s = 0; s < d.streams.size(); ++s) {
        const StreamState& st = d.streams[s];
        if (st.phase == Phase::finished || st.task < 0) continue;
        ++stuck;
        if (++shown > 16) continue;
        out += "\n  device " + std::to_string(dev) + " (" + plan_.device_names[dev] + "): " +
               partition::describe_task(plan_, st.task) + ", iteration " + std::to_string(first_ + st.iteration);
        if (st.phase == Phase::running) {
          out += st.waiting_for.empty() ? ": running" : ": waits for " + st.waiting_for;
        } else {
          out += ": waits for " + unfinished_inputs(st.task, st.iteration);
        }
      }
    }
    if (shown > 16) out += "\n  ... and " + std::to_string(stuck - 16) + " more stuck streams";
    return out;
  }

  // The inputs of a task instance not done yet (the caller holds its device's lock).
  std::string unfinished_inputs(int task, int iteration) const {
    std::string out;
    for (auto [it, end] = boost::edges(plan_.graph); it != end; ++it) {
      if (static_cast<int>(boost::target(*it, plan_.graph)) != task) continue;
      const int from = static_cast<int>(boost::source(*it, plan_.graph));
      const partition::Dependency& dep = plan_.graph[*it];
      const int j = iteration - dep.offset;
      if (j < 0 || done_[index(from, j)]) continue;
      out += out.empty() ? "" : "; ";
      std::string tensors;
      if (dep.data) {
        for (int t : plan_.reads(task)) {
          const Tensor& tensor = plan_.tensor(t);
          if (tensor.producer != from) continue;
          tensors += (tensors.empty() ? "tensor " : ", ") + std::to_string(t) + " (" +
                     std::string(partition::to_string(tensor.kind)) + ", " + model::units::human_bytes(tensor.bytes) + ")";
        }
      }
      out += (tensors.empty() ? "order edge" : tensors) + " from " + partition::describe_task(plan_, from) +
             ", iteration " + std::to_string(first_ + j);
    }
    return out.empty() ? "its inputs (none unfinished: woken late)" : out;
  }

  // Under mpirun: rank 0 takes every rank's completed instances (times on its clock), device
  // memory and error; every rank then gets rank 0's verdict.
  void merge_ranks() {
    std::vector<std::byte> mine;
    for (size_t t = 0; t < tasks_; ++t) {
      if (!local(plan_.tasks[t].device)) continue;
      for (int i = 0; i < iterations_; ++i) {
        const size_t at = index(static_cast<int>(t), i);
        if (!done_[at]) continue;
        put(mine, static_cast<std::uint64_t>(at));
        put(mine, start_s_[at] + clock_offset_s_);
        put(mine, end_s_[at] + clock_offset_s_);
        put(mine, carried_bytes_[at]);
        for (const traces::MessageTimes::Span& m : messages_.of(static_cast<int>(t), i)) {
          put(mine, m.start_s < 0 ? m : traces::MessageTimes::Span{m.start_s + clock_offset_s_, m.end_s + clock_offset_s_, m.bytes});
        }
      }
    }
    put(mine, ~std::uint64_t{0});
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (local(static_cast<int>(d))) {
        put(mine, static_cast<std::uint64_t>(d));
        put(mine, devices_[d]->memory);
      }
    }
    put(mine, ~std::uint64_t{0});
    put_string(mine, error_);
    put(mine, static_cast<char>(stalled_));
    put_string(mine, stall_lines_);
    put(mine, interrupted_);
    const std::vector<std::vector<std::byte>> all = ranks_->gather(mine);
    std::vector<std::byte> verdict;
    if (ranks_->rank() == 0) {
      std::string first_error, lines;
      bool stalled = false;
      int interrupted = 0;  // the signal of the rank whose error is the run's
      for (size_t r = 0; r < all.size(); ++r) {
        ByteReader in(all[r]);
        for (auto at = in.get<std::uint64_t>(); at != ~std::uint64_t{0}; at = in.get<std::uint64_t>()) {
          if (at >= done_.size()) throw Error("rank " + std::to_string(r) + " reported a task instance the plan lacks");
          done_[at] = 1;
          start_s_[at] = in.get<double>();
          end_s_[at] = in.get<double>();
          carried_bytes_[at] = in.get<double>();
          const auto task = static_cast<int>(at % tasks_), iteration = static_cast<int>(at / tasks_);
          for (traces::MessageTimes::Span& m : messages_.of(task, iteration)) m = in.get<traces::MessageTimes::Span>();
        }
        for (auto d = in.get<std::uint64_t>(); d != ~std::uint64_t{0}; d = in.get<std::uint64_t>()) {
          if (d >= devices_.size()) throw Error("rank " + std::to_string(r) + " reported a device the plan lacks");
          devices_[d]->memory = in.get<DeviceMemoryUse>();
        }
        const std::string error = in.get_string();
        const bool rank_stalled = in.get<char>() != 0;
        const std::string rank_lines = in.get_string();
        const int rank_interrupted = in.get<int>();
        if (rank_stalled) {
          stalled = true;
          lines += rank_lines;
        } else if (first_error.empty() && !error.empty()) {
          first_error = "rank " + std::to_string(r) + ": " + error;
          interrupted = rank_interrupted;
        }
      }
      if (!first_error.empty()) stalled = false;  // a rank's failure explains the others' stall
      if (!stalled && first_error.empty() && std::count(done_.begin(), done_.end(), 1) != static_cast<std::ptrdiff_t>(done_.size())) {
        first_error = kNotInAProgram;
      }
      put_string(verdict, stalled ? stall_header() + lines : first_error);
      put(verdict, static_cast<char>(stalled));
      put(verdict, interrupted);
    }
    const std::vector<std::byte> agreed = ranks_->broadcast(verdict);
    ByteReader in(agreed);
    error_ = in.get_string();
    stalled_ = in.get<char>() != 0;
    interrupted_ = in.get<int>();
  }

  RunResult result() {
    for (size_t d = 0; d < devices_.size(); ++d) {  // (every thread has joined)
      if (!local(static_cast<int>(d))) continue;
      if (const auto bytes = backend_.model_peak_bytes(static_cast<int>(d))) devices_[d]->memory.peak_model_bytes = *bytes;
    }
    if (ranks_ != nullptr) merge_ranks();
    RunResult r;
    r.wall_s = now_s();
    r.error = error_;
    r.stalled = stalled_;
    r.interrupted = interrupted_;
    r.completed = error_.empty();
    r.trace.source = "exec-" + backend_.name();
    r.trace.compute = backend_.compute();
    r.trace.plan = plan_.network.name + " on " + plan_.cluster.name;
    r.trace.fingerprint = plan_.fingerprint;
    r.trace.device_names = plan_.device_names;
    for (int i = 0; i < iterations_; ++i) {
      for (size_t t = 0; t < tasks_; ++t) {
        const size_t at = index(static_cast<int>(t), i);
        if (!done_[at]) continue;
        ++r.task_instances;
        traces::Event e = traces::task_event(plan_, static_cast<int>(t), first_ + i);
        e.start_s = start_s_[at];
        const int partner = graph_.partner(static_cast<int>(t));  // a transfer starts when both sides are there
        if (partner >= 0 && done_[index(partner, i)]) e.start_s = std::max(e.start_s, start_s_[index(partner, i)]);
        e.end_s = std::max(end_s_[at], e.start_s);
        if (carried_bytes_[at] >= 0) e.bytes = carried_bytes_[at];  // what ran, where the back end says
        r.trace.events.push_back(std::move(e));
        const size_t own = r.trace.events.size();
        messages_.append_events(plan_, static_cast<int>(t), i, r.trace.events);
        for (size_t k = own; k < r.trace.events.size(); ++k) r.trace.events[k].iteration += first_;
      }
    }
    if (ranks_ == nullptr && r.completed && r.task_instances != static_cast<long long>(tasks_) * iterations_) {
      r.completed = false;
      r.error = kNotInAProgram;
    }
    if (!r.completed) {  // the file says so: what reads it (replay, timeline) knows what is missing
      r.trace.partial = r.error.substr(0, r.error.find('\n'));
      r.trace.planned_iterations = first_ + iterations_;
    }
    traces::sort_events(r.trace);
    for (auto& d : devices_) r.memory.push_back(d->memory);
    return r;
  }

  const Plan& plan_;
  Backend& backend_;
  const EngineOptions& options_;
  partition::RunGraph graph_;
  size_t tasks_;
  int iterations_;
  int first_;                    // the number of iteration 0 outside (EngineOptions::first_iteration)
  Ranks* ranks_;                 // null: every device runs here
  double clock_offset_s_ = 0;    // this rank's clock to rank 0's
  TensorsByTask allocates_, frees_;
  std::vector<int> remaining_;  // per instance (iteration x task): inputs not done; device lock
  std::vector<char> done_;      // per instance; device lock
  std::vector<double> start_s_, end_s_;  // per instance; written by its thread, read after join
  std::vector<double> carried_bytes_;    // per instance: TaskContext::carried_bytes; likewise
  traces::MessageTimes messages_;        // TaskContext::messages; likewise
  std::vector<HostBuffer> transient_;    // per (iteration, tensor); device lock
  std::vector<HostBuffer> persistent_;   // per tensor; allocated before the threads start
  std::vector<std::unique_ptr<DeviceState>> devices_;
  Clock::time_point start_;
  std::atomic<bool> stop_{false};
  std::atomic<long long> completed_{0};
  long long local_tasks_ = 0;  // task instances of one iteration on this process's devices
  std::unique_ptr<std::atomic<long long>[]> iteration_done_;  // per iteration: its local instances completed
  std::unique_ptr<std::atomic<double>[]> iteration_end_s_;    // per iteration: when its last local one ended; 0: not yet
  int progress_iteration_ = 0;   // the watching thread's: iterations before it have ended
  double last_progress_s_ = -1e9;  // the watching thread's: when on_progress was last called
  std::mutex error_mutex_;
  std::string error_;
  bool stalled_ = false;
  int interrupted_ = 0;      // the signal that stopped the run (error_mutex_)
  std::string stall_lines_;  // this rank's stuck streams, when stalled
  std::mutex exit_mutex_;
  std::condition_variable exit_wake_;
  size_t exited_ = 0;
};

}  // namespace

RunResult run_plan(const Plan& plan, Backend& backend, const EngineOptions& options) {
  if (plan.layout.folded) {
    throw PlanError("the plan is folded: it holds the tasks of one data-parallel replica for all of them, which a "
                    "simulation can stand for but a run cannot; plan it without --fold to run it");
  }
  Run run(plan, backend, options);
  return run.run();
}

}  // namespace hetflow::exec
