// What a benchmark's work cost the machine, from getrusage: CPU seconds (user + system) of
// this process and of the children it has waited for (the simulator forks one per
// simulation), and minor page faults of both. On a machine shared with other work the
// wall-clock time swings with the load; CPU time counts only this work's own cycles, and
// the page faults say how much of it was the kernel handing out fresh memory.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/resource.h>

namespace hetflow::bench {

struct Usage {
  double cpu_s = 0;         // user + system, this process and its waited-for children
  double minor_faults = 0;  // this process's and its waited-for children's
};

inline Usage usage_now() {
  Usage u;
  for (const int who : {RUSAGE_SELF, RUSAGE_CHILDREN}) {
    struct rusage r {};
    ::getrusage(who, &r);
    u.cpu_s += static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
               1e-6 * static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec);
    u.minor_faults += static_cast<double>(r.ru_minflt);
  }
  return u;
}

// Sums the usage of the timed parts of a benchmark (start() ... stop(), around the work) and
// reports it per iteration as the counters cpu_s and faults.
class UsageMeter {
 public:
  void start() { at_ = usage_now(); }
  void stop() {
    const Usage now = usage_now();
    total_.cpu_s += now.cpu_s - at_.cpu_s;
    total_.minor_faults += now.minor_faults - at_.minor_faults;
  }
  void report(benchmark::State& state) const {
    const double n = static_cast<double>(state.iterations());
    state.counters["cpu_s"] = n > 0 ? total_.cpu_s / n : 0;
    state.counters["faults"] = n > 0 ? total_.minor_faults / n : 0;
  }

 private:
  Usage at_, total_;
};

// Runs `work` once untimed, then once per iteration, with the usage counters: the first run
// of a process faults in the memory the allocator hands back to later ones (a first-touch
// cost that made a benchmark of one iteration swing by a third).
template <class Work>
void run_warm(benchmark::State& state, Work work) {
  benchmark::DoNotOptimize(work());
  UsageMeter usage;
  usage.start();
  for (auto _ : state) benchmark::DoNotOptimize(work());
  usage.stop();
  usage.report(state);
}

}  // namespace hetflow::bench
