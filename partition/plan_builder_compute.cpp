// The compute of one virtual worker: F, B and W tasks in each rank's schedule order, the
// tensors they read and write, and the in-rank axes' collectives inside them: the tensor
// axis's
// (partition/tp_calls.hpp: Megatron's per-layer all-reduces, or under sequence parallelism
// its all-gathers and reduce-scatters, each at its point of the pass's work). A pass's calls
// of one kind and size are one in-task collective whose messages are the calls
// (Collective::at); each pays its own latency at its own size, as Megatron's synchronous
// collectives on the compute stream do one after another, and the plan stays small.
// Once a step a chunk's last backward also sums the gains every rank holds whole
// (summed_gain_elems), or every backward where ZeRO reduce-scatters each pass's gradients
// (a rank's gain gradients must be whole before they are scattered). A pass without calls (one device, or the forward of a chunk of the
// embedding alone without sequence parallelism) has none.
#include <algorithm>

#include "partition/plan_builder_detail.hpp"
#include "partition/tp_calls.hpp"

namespace hetflow::partition::builder {

size_t Builder::slot(int w, int stage, int mb, int j) const {
  return slot_base_[static_cast<size_t>(w)][static_cast<size_t>(stage)] +
         static_cast<size_t>(mb) * static_cast<size_t>(degree(w, stage)) + static_cast<size_t>(j);
}

bool Builder::tp_collectives(int w, int stage) const {
  return builder::tp_collectives(work_[static_cast<size_t>(w)][static_cast<size_t>(stage)], degree(w, stage));
}

bool Builder::sharded(int w, int stage) const { return layout_.sequence_parallel && tp_collectives(w, stage); }

// Boundary tensors exist before the tasks that touch them, since a rank's consumer may be
// built before its producer (interleaved chunks). Transfers carry 1/t of a boundary under
// tensor parallelism (Megatron's scatter/gather), t the receiving rank's degree: a
// sequence-parallel chunk takes its shard as it is; any other chunk all-gathers the slices
// back into the whole activation. Between ranks of degrees t1 (sending) and t2, receiving
// rank j gets its slice from sending rank j % t1: every sending rank holds the whole tensor
// (its pass ended in an all-reduce), so the slices add up to it on every receiving rank, and
// sending ranks j >= t2 send nothing (their copy is not kept).
void Builder::prepare_boundaries(int w) {
  const VirtualWorker& vw = worker(w);
  const int stages = static_cast<int>(vw.stages.size());
  for (int s = 0; s + 1 < stages; ++s) {
    const double bytes = work_[static_cast<size_t>(w)][static_cast<size_t>(s)].output_bytes;
    const int t_s = degree(w, s), t_next = degree(w, s + 1);
    const bool sharded_s = sharded(w, s), sharded_next = sharded(w, s + 1);
    for (int mb = 0; mb < vw.microbatches; ++mb) {
      for (int j = 0; j < std::max(t_s, t_next); ++j) {
        // Forward: chunk s's output becomes chunk s+1's input; backward: chunk s+1's input
        // gradient becomes chunk s's output gradient.
        for (const bool forward : {true, false}) {
          const int from = forward ? s : s + 1, to = forward ? s + 1 : s;
          const int t_from = forward ? t_s : t_next, t_to = forward ? t_next : t_s;
          const bool sharded_from = forward ? sharded_s : sharded_next, sharded_to = forward ? sharded_next : sharded_s;
          const TensorKind kind = forward ? TensorKind::activation : TensorKind::activation_grad;
          const OpKind producer = forward ? OpKind::F : OpKind::B;
          int produced = -1;
          if (j < t_from && j < t_to) {
            produced = activation_tensor(kind, device_of(w, from, j), sharded_from ? bytes / t_from : bytes);
            op(w, from, mb, producer, j).output = produced;
          }
          if (j >= t_to) continue;
          const int i = j < t_from ? j : j % t_from;  // the sending rank (its tensor made above: i <= j)
          const int src = device_of(w, from, i), dst = device_of(w, to, j);
          int consumed = i == j ? produced : op(w, from, mb, producer, i).output, slice = -1;
          if (src != dst) {
            if (t_to > 1 && !sharded_to) slice = activation_tensor(kind, dst, bytes / t_to);
            consumed = activation_tensor(kind, dst, sharded_to ? bytes / t_to : bytes);
          }
          const size_t at = slot(w, to, mb, j);
          auto& wholes = forward ? inputs_ : output_grads_;
          auto& slices = forward ? input_slices_ : grad_slices_;
          wholes[static_cast<size_t>(w)][at] = consumed;
          slices[static_cast<size_t>(w)][at] = slice;
        }
      }
    }
  }
}

void Builder::add_compute(int w) {
  prepare_boundaries(w);
  const VirtualWorker& vw = worker(w);
  const int p = static_cast<int>(vw.ranks.size());
  std::vector<int> last_b(vw.stages.size(), -1);  // per chunk: the micro-batch of its last B
  // Where ZeRO scatters each pass's gradients, each B sums its own gains before they go.
  const bool each_pass = zero_scatters_each_pass(layout_);
  for (int r = 0; r < p; ++r) {
    const std::vector<ScheduledOp>& program = programs_[static_cast<size_t>(w)][static_cast<size_t>(r)];
    for (size_t i = 0; i < program.size(); ++i) {
      const ScheduledOp& o = program[i];
      const int stage = o.chunk * p + r;
      if (o.kind == OpKind::F) {
        // Activation offload moves a stash out unless its backward comes next (a pipeline's
        // last stage, mostly): there a copy out and back would only delay that backward.
        add_forward(w, stage, o.microbatch, layout_.offload.activations && stash_leaves(program, i));
      } else {
        add_backward(w, stage, o.microbatch, o.kind);
        if (o.kind != OpKind::B) continue;
        last_b[static_cast<size_t>(stage)] = o.microbatch;
        if (each_pass) add_summed_gains(w, stage, o.microbatch);
      }
    }
  }
  for (size_t stage = 0; stage < vw.stages.size() && !each_pass; ++stage) {
    if (last_b[stage] >= 0) add_summed_gains(w, static_cast<int>(stage), last_b[stage]);
  }
}

// The calls of a pass inside its compute tasks, axis by in-pass axis (axis_registry.hpp): one
// in-task collective per kind and size, in the order the pass first performs it. An in-rank
// axis's group is the rank's devices (`computes`); a context group's is one per tensor rank
// across the group's workers, made once its last worker has built the pass (workers are
// built in order), so that its tasks are every member's; an expert group's likewise.
void Builder::add_in_task_calls(int w, int stage, int mb, bool backward, const std::vector<int>& computes) {
  const int t = degree(w, stage), context = layout_.size(Axis::context);
  const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
  PassShape shape;
  shape.layer_begin = s.layer_begin;
  shape.layer_end = s.layer_end;
  shape.tensor = t;
  shape.backward = backward;
  shape.sequence_parallel = layout_.sequence_parallel;
  shape.split_backward = schedule_.splits_backward;
  shape.recompute = layout_.recompute;
  shape.context = context;
  shape.context_comm = layout_.context_comm;
  shape.experts = layout_.experts.parallel;
  shape.expert_kept = experts_.dispatch.kept;
  shape.expert_load = expert_share(experts_, layout_, w).load;
  shape.micro_batch = layout_.micro_batch_size;
  const double bytes_per_elem = layout_.micro_batch_size * model::element_bytes(layout_.precision);
  const AddCall add = [&](const AxisRules& axis, const PassCallGroup& g, const std::string& name,
                          const std::vector<int>& devices, const std::vector<int>& tasks) {
    Collective& c = plan_.collectives[add_in_task(axis, g.kind, name, devices, 0, tasks)];
    c.at = g.points;
    c.until = g.until;
    c.messages = static_cast<int>(g.points.size());
    c.bytes = g.elems * bytes_per_elem * static_cast<double>(g.points.size());
  };
  for (const AxisRules& axis : axis_table()) {
    if (axis.pass_calls == nullptr) continue;
    if (axis.scope == AxisScope::in_rank && t > 1) {
      for (const PassCallGroup& g : group_calls(axis.pass_calls(net_, shape))) {
        add(axis, g, group_name(axis, w, stage), group_devices(axis, w, stage), computes);
      }
    } else if (axis.scope == AxisScope::in_context_group && context > 1 && w % context == context - 1) {
      const int first = w - (context - 1);
      const std::vector<PassCallGroup> groups = group_calls(axis.pass_calls(net_, shape));
      for (int j = 0; j < t; ++j) {
        std::vector<int> devices, tasks;
        for (int c = first; c <= w; ++c) {
          devices.push_back(device_of(c, stage, j));
          tasks.push_back(op(c, stage, mb, backward ? OpKind::B : OpKind::F, j).task);
        }
        const std::string name = std::string(axis.group_prefix) + " d" + std::to_string(first / context) + " r" +
                                 std::to_string(worker(w).stages[static_cast<size_t>(stage)].rank) + " t" + std::to_string(j);
        for (const PassCallGroup& g : groups) add(axis, g, name, devices, tasks);
      }
    } else if (axis.scope == AxisScope::in_expert_group && shape.experts > 1 &&
               expert_rank(w, context, shape.experts) == shape.experts - 1) {
      add_expert_group_calls(axis, w, stage, mb, backward, group_calls(axis.pass_calls(net_, shape)), add);
    }
  }
}

// An expert group's all-to-alls, made once its last worker has built the pass: one group per
// tensor rank across the group's workers (their context rank alike), each message in the
// routing's parts.
void Builder::add_expert_group_calls(const AxisRules& axis, int w, int stage, int mb, bool backward,
                                     const std::vector<PassCallGroup>& groups, const AddCall& add) {
  if (groups.empty()) return;
  const int context = layout_.size(Axis::context), ep = layout_.experts.parallel;
  const std::vector<int> members = expert_group(w, static_cast<int>(layout_.workers.size()) / context, context, ep);
  for (int j = 0; j < degree(w, stage); ++j) {
    std::vector<int> devices, tasks;
    for (const int m : members) {
      devices.push_back(device_of(m, stage, j));
      tasks.push_back(op(m, stage, mb, backward ? OpKind::B : OpKind::F, j).task);
    }
    const std::string name = std::string(axis.group_prefix) + " d" + std::to_string(members.front() / context) + " r" +
                             std::to_string(worker(w).stages[static_cast<size_t>(stage)].rank) + " t" + std::to_string(j) +
                             " c" + std::to_string(w % context);
    for (const PassCallGroup& g : groups) {
      add(axis, g, name, devices, tasks);
      plan_.collectives.back().algorithm = layout_.experts.dispatch;
      plan_.collectives.back().parts = experts_.dispatch.parts;
    }
  }
}

// At the end of a chunk's last backward of a step (or, zero_scatters_each_pass, of each): the
// gains every member of an in-rank group holds whole, summed over the group
// (exec/decoder.cpp's sum_replicated_gains).
void Builder::add_summed_gains(int w, int stage, int mb) {
  const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
  for (const AxisRules& axis : axis_table()) {
    if (axis.scope != AxisScope::in_rank || axis.step_elems == nullptr) continue;
    const double elems = axis.step_elems(net_, s.layer_begin, s.layer_end, degree(w, stage), layout_.sequence_parallel);
    if (elems <= 0) continue;
    std::vector<int> computes;
    for (int j = 0; j < degree(w, stage); ++j) computes.push_back(op(w, stage, mb, OpKind::B, j).task);
    const size_t c = add_in_task(axis, CollectiveKind::all_reduce, group_name(axis, w, stage), group_devices(axis, w, stage),
                                 elems * model::element_bytes(layout_.precision), computes);
    plan_.collectives[c].at = {1};
    plan_.collectives[c].messages = 1;
  }
}

std::string Builder::tp_name(int w, int stage) const { return group_name(axis_rules(Axis::tensor), w, stage); }

std::string Builder::group_name(const AxisRules& axis, int w, int stage) const {
  return std::string(axis.group_prefix) + " w" + std::to_string(w) + " r" +
         std::to_string(worker(w).stages[static_cast<size_t>(stage)].rank);
}

// The tensor axis is the only in-rank axis yet, and its group is the rank's device group.
std::vector<int> Builder::group_devices(const AxisRules&, int w, int stage) const { return rank_devices(w, stage); }

size_t Builder::add_in_task(const AxisRules& axis, CollectiveKind kind, const std::string& group_name,
                            const std::vector<int>& devices, double bytes, const std::vector<int>& computes) {
  Collective c;
  c.kind = kind;
  c.algorithm = CollectiveAlgorithm::ring;
  c.purpose = axis.call_purpose(kind);
  c.communicator = communicator(axis.role, group_name, devices);
  c.bytes = bytes;
  c.messages = 0;
  c.tasks = computes;
  plan_.collectives.push_back(std::move(c));
  return plan_.collectives.size() - 1;
}

// What a pass's compute reads on each rank: the tensor that arrived, rebuilt first by an
// all-gather when it came in 1/t slices (Megatron's scatter/gather). Under sequence
// parallelism the arrived shard itself: the pass gathers what it needs inside its task.
std::vector<int> Builder::gather_inputs(const std::string& tp_name, const std::vector<int>& devices,
                                        const std::vector<int>& arrived, const std::vector<int>& slices, double whole_bytes,
                                        const Task& like) {
  if (slices[0] >= 0) {
    const auto gather = add_collective(CollectiveKind::all_gather, CollectiveAlgorithm::ring, tp_name, devices, whole_bytes,
                                       Purpose::tensor_parallel, compute_stream_, like, slices, arrived);
    for (size_t j = 0; j < devices.size(); ++j) set_free_after(slices[j], gather[j]);
  }
  return arrived;
}

void Builder::add_forward(int w, int stage, int mb, bool offload) {
  const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
  const std::vector<int> devices = rank_devices(w, stage);
  const int t = degree(w, stage);
  const Task like = base_task(TaskKind::forward, devices[0], w, stage, mb);
  std::vector<int> input(static_cast<size_t>(t)), slices(static_cast<size_t>(t));
  const size_t at = slot(w, stage, mb, 0);  // rank j's: at + j
  for (int j = 0; j < t; ++j) {
    input[static_cast<size_t>(j)] = inputs_[static_cast<size_t>(w)][at + static_cast<size_t>(j)];
    slices[static_cast<size_t>(j)] = input_slices_[static_cast<size_t>(w)][at + static_cast<size_t>(j)];
  }
  const std::vector<int> compute_input = gather_inputs(tp_name(w, stage), devices, input, slices, work.input_bytes, like);
  std::vector<int> computes;
  for (int j = 0; j < t; ++j) {
    const int d = devices[static_cast<size_t>(j)];
    OpRecord& rec = op(w, stage, mb, OpKind::F, j);
    Task task = base_task(TaskKind::forward, d, w, stage, mb);
    task.flops = work.forward_flops;
    task.memory_bytes = work.weight_bytes + work.stash_bytes;
    const std::vector<int> params = pass_params(w, stage, mb, OpKind::F, j);
    std::vector<int> reads = params;
    if (compute_input[static_cast<size_t>(j)] >= 0) reads.push_back(compute_input[static_cast<size_t>(j)]);
    rec.stash = activation_tensor(TensorKind::stash, d, work.stash_bytes);
    std::vector<int> writes{rec.stash};
    // Context parallelism: the keys and values each layer gathers, one layer at a time.
    const int gathered = work.context_bytes > 0 ? activation_tensor(TensorKind::workspace, d, work.context_bytes) : -1;
    if (gathered >= 0) writes.push_back(gathered);
    // The output is whole on every rank when the task ends (its last all-reduce is inside
    // it), or under sequence parallelism the rank's shard.
    if (rec.output >= 0) writes.push_back(rec.output);
    rec.task = rec.done = plan_.add_task(task, reads, writes);
    computes.push_back(rec.task);
    read_params(params, rec.task);
    set_free_after(gathered, rec.task);
    if (compute_input[static_cast<size_t>(j)] >= 0) set_free_after(compute_input[static_cast<size_t>(j)], rec.task);
    if (offload) offload_stash(d, w, stage, mb, rec);
  }
  add_in_task_calls(w, stage, mb, false, computes);
}

void Builder::add_backward(int w, int stage, int mb, OpKind kind) {
  const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
  const std::vector<int> devices = rank_devices(w, stage);
  const int t = degree(w, stage);
  const bool split = schedule_.splits_backward;
  if (kind == OpKind::W) {  // the weight gradient: the stash and the output gradient, nothing more
    for (int j = 0; j < t; ++j) {
      const int d = devices[static_cast<size_t>(j)];
      const OpRecord& f = op(w, stage, mb, OpKind::F, j);
      const OpRecord& b = op(w, stage, mb, OpKind::B, j);
      Task task = base_task(TaskKind::backward_weight, d, w, stage, mb);
      task.flops = work.backward_flops / 2;
      task.memory_bytes = work.weight_bytes + work.stash_bytes;
      std::vector<int> reads{f.stash};
      if (b.input >= 0) reads.push_back(b.input);
      std::vector<int> writes;
      add_gradient_target(w, stage, mb, j, reads, writes);
      const int id = plan_.add_task(task, reads, writes);
      plan_.add_order(b.task, id);  // after its B, whose gradients it needs
      set_free_after(f.stash, id);
      set_free_after(b.input, id);
      OpRecord& rec = op(w, stage, mb, OpKind::W, j);
      rec.task = rec.done = id;
    }
    return;
  }
  const Task like = base_task(TaskKind::backward, devices[0], w, stage, mb);
  std::vector<int> grad(static_cast<size_t>(t)), slices(static_cast<size_t>(t));
  const size_t at = slot(w, stage, mb, 0);  // rank j's: at + j
  for (int j = 0; j < t; ++j) {
    grad[static_cast<size_t>(j)] = output_grads_[static_cast<size_t>(w)][at + static_cast<size_t>(j)];
    slices[static_cast<size_t>(j)] = grad_slices_[static_cast<size_t>(w)][at + static_cast<size_t>(j)];
  }
  const std::vector<int> compute_grad = gather_inputs(tp_name(w, stage), devices, grad, slices, work.output_bytes, like);
  // The input gradient is written by the compute: without sequence parallelism whole on
  // every rank when it ends (the first layer's f all-reduce comes before its replicated norm
  // and the residual add), under sequence parallelism the rank's shard (the first layer's f
  // reduce-scatter likewise), both inside the task.
  std::vector<int> computes;
  for (int j = 0; j < t; ++j) {
    const int d = devices[static_cast<size_t>(j)];
    OpRecord& rec = op(w, stage, mb, OpKind::B, j);
    OpRecord& f = op(w, stage, mb, OpKind::F, j);
    prefetch_stash(d, w, stage, mb, f);  // (activation offload: its stash back from the host)
    rec.input = compute_grad[static_cast<size_t>(j)];
    Task task = base_task(TaskKind::backward, d, w, stage, mb);
    task.flops = (split ? work.backward_flops / 2 : work.backward_flops) + work.recompute_flops;
    task.recompute_flops = work.recompute_flops;
    task.memory_bytes = work.weight_bytes + work.stash_bytes;
    const std::vector<int> params = pass_params(w, stage, mb, OpKind::B, j);
    std::vector<int> reads = params;
    reads.push_back(f.stash);
    if (rec.input >= 0) reads.push_back(rec.input);
    std::vector<int> writes;
    // (Split, B still adds the norms' gradients: under ZeRO 2 and 3 to the whole buffer W adds to.)
    if (!split || zero_stage() >= 2) add_gradient_target(w, stage, mb, j, reads, writes);
    int scratch = -1, gathered = -1;
    if (layout_.recompute == Recompute::full) {  // the forward redone one layer at a time
      scratch = activation_tensor(TensorKind::workspace, d, work.largest_layer_bytes);
      writes.push_back(scratch);
    }
    if (work.context_bytes > 0) {  // a layer's gathered keys and values, and their gradients
      gathered = activation_tensor(TensorKind::workspace, d, 2 * work.context_bytes);
      writes.push_back(gathered);
    }
    if (rec.output >= 0) writes.push_back(rec.output);
    rec.task = rec.done = plan_.add_task(task, reads, writes);
    computes.push_back(rec.task);
    read_params(params, rec.task);
    set_free_after(scratch, rec.task);
    set_free_after(gathered, rec.task);
    if (!split) {
      set_free_after(f.stash, rec.task);
      set_free_after(rec.input, rec.task);
    }
  }
  add_in_task_calls(w, stage, mb, true, computes);
}

}  // namespace hetflow::partition::builder
