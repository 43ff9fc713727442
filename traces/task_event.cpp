#include "traces/task_event.hpp"

#include <algorithm>

namespace hetflow::traces {

Event task_event(const partition::Plan& plan, int task, int iteration) {
  using partition::TaskKind;
  const partition::Task& t = plan.task(task);
  Event e;
  e.task = task;
  e.device = t.device;
  e.stream = plan.stream_name(t.stream);
  e.kind = t.kind;
  e.purpose = t.purpose;
  e.iteration = iteration;
  e.stage = t.stage;
  e.microbatch = t.microbatch;
  const bool transfer = t.kind == TaskKind::send || t.kind == TaskKind::recv;
  e.peer = transfer ? plan.peer(task) : -1;
  e.group = transfer ? t.channel : t.collective;
  e.bytes = t.bytes;
  e.flops = t.flops;
  return e;
}

Event in_task_event(const partition::Plan& plan, int task, int iteration, int k) {
  const partition::InTaskCall& call = plan.inside(task)[static_cast<size_t>(k)];
  const partition::Collective& c = plan.collective(call.collective);
  Event e = task_event(plan, task, iteration);
  e.kind = partition::TaskKind::collective;
  e.purpose = c.purpose;
  e.peer = -1;
  e.group = call.collective;
  e.message = k;
  e.bytes = c.bytes / std::max(1, c.messages);
  e.flops = 0;
  return e;
}

}  // namespace hetflow::traces
