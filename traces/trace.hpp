#pragma once
// The one trace format of hetflow: what ran where and when. The simulator and the executor
// both write it; replay and calibration read it. One event per task (a transfer gives an
// event on each side), and one per message of an in-task collective, within its task's: a
// compute task's own time is its event's less its messages'.
#include <string>
#include <vector>

#include "partition/plan.hpp"

namespace hetflow::traces {

struct Event {
  int task = -1;          // task id in the plan
  int device = -1;
  std::string stream;     // the plan's stream name: "compute", "comm", "send>3:act", ...
  partition::TaskKind kind = partition::TaskKind::forward;  // the task's kind, as the plan says
  partition::Purpose purpose = partition::Purpose::compute;  // why its bytes move (compute for compute)
  int iteration = 0;
  int stage = -1;
  int microbatch = -1;
  int peer = -1;          // send/recv: the other device
  int group = -1;         // send/recv: the plan's channel; collective: the plan's collective
  // An in-task collective's message (kind collective, purpose the collective's): its index in
  // plan.inside(task), task being the compute task that runs it and whose event holds this
  // one's time; -1 for the event of a task itself.
  int message = -1;
  // Such a message that overlaps its task's work (partition::Collective::until): how long,
  // from its start, the work went on beside it; the rest the work waited for it. 0 for one
  // that holds the work, and for every other event.
  double overlap_s = 0;
  double start_s = 0;
  double end_s = 0;
  double bytes = 0;
  double flops = 0;
  bool operator==(const Event&) const = default;
};

struct Trace {
  std::string source;                    // "sim" or "exec-cpu" / "exec-cuda"
  std::string plan;                      // what ran: "<network> on <cluster>"
  std::string fingerprint;               // the plan's fingerprint (partition::plan_fingerprint)
  // How compute tasks ran: empty for the simulator; "proxy" where an executor ran FLOP-matched
  // stand-ins (timing is real, the arithmetic is not the model's), "real" for the model's math.
  std::string compute;
  std::vector<std::string> device_names;  // index = device id
  // A run that stopped short (interrupted, stalled, failed): why, in one line; empty for a
  // trace of everything the run was to do. Such a trace holds the task instances that completed.
  std::string partial;
  // A partial trace's: the iterations its run was to have (its plan's fingerprint counts
  // them; its events stop short). 0 for a complete trace, whose events say.
  int planned_iterations = 0;
  std::vector<Event> events;             // in sort_events order
  bool operator==(const Trace&) const = default;
};

// Sorts events (stably) by (start_s, device, stream, task, kind): the canonical order, so equal
// runs give byte-identical files. Writers keep the order they are given.
void sort_events(Trace& trace);

}  // namespace hetflow::traces
