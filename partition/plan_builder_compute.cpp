// The compute of one virtual worker: F, B and W tasks in each rank's schedule order, the
// tensors they read and write, and the tensor-parallel collectives around them:
//   tensor parallel:      F = compute, all-reduce of the partial sums; B = compute, then the
//                         all-reduces it ran (f), as traffic without data.
//   + sequence parallel:  F = all-gather, compute on the rank's input shard, reduce-scatter
//                         of the partial sums into output shards (Korthikanti et al.);
//                         B = all-gather, compute from the output-gradient shard into the
//                         input-gradient shard, reduce-scatter. The all-gathers, and the
//                         backward's reduce-scatter, move what the compute moves between its
//                         layers (the norms' outputs, their gradients): traffic without data.
// A chunk's tensor-parallel all-reduces (two per transformer layer and pass) are one
// collective task carrying their whole volume as that many messages (Collective::messages):
// each pays its own latency at its own size, as Megatron's synchronous all-reduces on the
// compute stream do one after another, and the plan stays small. Sequence parallelism's
// gathers and scatters likewise (two of each per layer and pass): their messages move the
// i-th m-th of every rank's sequence shard, so the shards land where one collective puts them.
// A pass without traffic (the forward of a chunk of the LM head alone, the backward of one of
// the embedding alone) has no collective.
#include <algorithm>

#include "partition/plan_builder_detail.hpp"

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
  for (int r = 0; r < p; ++r) {
    for (const ScheduledOp& o : programs_[static_cast<size_t>(w)][static_cast<size_t>(r)]) {
      const int stage = o.chunk * p + r;
      if (o.kind == OpKind::F) {
        add_forward(w, stage, o.microbatch);
      } else {
        add_backward(w, stage, o.microbatch, o.kind);
      }
    }
  }
}

// What a pass's compute reads on each rank: the tensor that arrived, rebuilt first by an
// all-gather when it came in 1/t slices (Megatron's scatter/gather). Under sequence
// parallelism the arrived shard itself, after the pass's all-gathers: traffic without data
// (the compute gathers its norms' outputs), which waits for the shard by an order edge
// (OpRecord::gather, connect).
std::vector<int> Builder::gather_inputs(int w, int stage, const std::string& tp_name, const std::vector<int>& devices,
                                        const std::vector<int>& arrived, const std::vector<int>& slices, double whole_bytes,
                                        const Task& like) {
  const auto t = devices.size();
  if (slices[0] >= 0) {
    const auto gather = add_collective(CollectiveKind::all_gather, CollectiveAlgorithm::ring, tp_name, devices, whole_bytes,
                                       Purpose::tensor_parallel, compute_stream_, like, slices, arrived);
    for (size_t j = 0; j < t; ++j) set_free_after(slices[j], gather[j]);
  }
  if (!sharded(w, stage)) return arrived;
  const bool backward = like.kind == TaskKind::backward;
  const TpPass pass = tp_pass_of(w, stage, backward);
  if (pass.gather_bytes <= 0) return arrived;
  const auto gather = add_collective(CollectiveKind::all_gather, CollectiveAlgorithm::ring, tp_name, devices,
                                     pass.gather_bytes, Purpose::sequence_parallel, compute_stream_, like, {}, {});
  plan_.collectives.back().messages = pass.gather_messages;
  for (size_t j = 0; j < t; ++j) {
    op(w, stage, like.microbatch, backward ? OpKind::B : OpKind::F, static_cast<int>(j)).gather = gather[j];
  }
  return arrived;
}

// A pass's tensor-parallel traffic (tp_pass): its layers' all-reduces, or sequence-parallel
// gathers and scatters, in as many collectives as Megatron runs.
TpPass Builder::tp_pass_of(int w, int stage, bool backward) const {
  return tp_pass(work_[static_cast<size_t>(w)][static_cast<size_t>(stage)], backward, sharded(w, stage),
                 layout_.recompute);
}

// The collective that ends a tensor-parallel pass: each rank's partial sums all-reduced (or
// reduce-scattered into sequence shards) into its output, or, with no partial sums (a
// backward), the pass's traffic without data. The op is done after it. A pass without
// traffic has none.
void Builder::reduce_partials(int w, int stage, int mb, OpKind kind, const std::string& tp_name,
                              const std::vector<int>& devices, const std::vector<int>& computes,
                              const std::vector<int>& partials, const std::vector<int>& outputs) {
  const TpPass pass = tp_pass_of(w, stage, kind == OpKind::B);
  if (pass.reduce_bytes <= 0) return;
  const Task like = plan_.tasks[static_cast<size_t>(computes[0])];  // a copy: add_collective grows the table
  const bool sp = sharded(w, stage);
  const auto reduce = add_collective(sp ? CollectiveKind::reduce_scatter : CollectiveKind::all_reduce,
                                     CollectiveAlgorithm::ring, tp_name, devices, pass.reduce_bytes,
                                     sp ? Purpose::sequence_parallel : Purpose::tensor_parallel, compute_stream_, like,
                                     partials, outputs);
  plan_.collectives.back().messages = pass.reduce_messages;
  for (size_t j = 0; j < devices.size(); ++j) {
    // Each rank's collective follows its own compute (a data edge when a partial sum flows).
    if (partials[j] < 0) plan_.add_order(computes[j], reduce[j]);
    set_free_after(partials[j], reduce[j]);
    op(w, stage, mb, kind, static_cast<int>(j)).done = reduce[j];
  }
}

void Builder::add_forward(int w, int stage, int mb) {
  const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
  const std::vector<int> devices = rank_devices(w, stage);
  const int t = degree(w, stage);
  const std::string tp_name = "tp w" + std::to_string(w) + " r" + std::to_string(worker(w).stages[static_cast<size_t>(stage)].rank);
  const Task like = base_task(TaskKind::forward, devices[0], w, stage, mb);
  std::vector<int> input(static_cast<size_t>(t)), slices(static_cast<size_t>(t));
  const size_t at = slot(w, stage, mb, 0);  // rank j's: at + j
  for (int j = 0; j < t; ++j) {
    input[static_cast<size_t>(j)] = inputs_[static_cast<size_t>(w)][at + static_cast<size_t>(j)];
    slices[static_cast<size_t>(j)] = input_slices_[static_cast<size_t>(w)][at + static_cast<size_t>(j)];
  }
  const std::vector<int> compute_input =
      gather_inputs(w, stage, tp_name, devices, input, slices, work.input_bytes, like);
  // Partial sums when the forward reduces anything (its g traffic).
  const bool collective = tp_collectives(w, stage) && tp_pass_of(w, stage, false).reduce_bytes > 0;
  std::vector<int> computes, partials(static_cast<size_t>(t), -1), outputs(static_cast<size_t>(t), -1);
  for (int j = 0; j < t; ++j) {
    const int d = devices[static_cast<size_t>(j)];
    OpRecord& rec = op(w, stage, mb, OpKind::F, j);
    outputs[static_cast<size_t>(j)] = rec.output;
    Task task = base_task(TaskKind::forward, d, w, stage, mb);
    task.flops = work.forward_flops;
    task.memory_bytes = work.weight_bytes + work.stash_bytes;
    std::vector<int> reads{weight_of(d, stage)};
    if (compute_input[static_cast<size_t>(j)] >= 0) reads.push_back(compute_input[static_cast<size_t>(j)]);
    rec.stash = activation_tensor(TensorKind::stash, d, work.stash_bytes);
    std::vector<int> writes{rec.stash};
    if (collective && work.output_bytes > 0) {
      partials[static_cast<size_t>(j)] = activation_tensor(TensorKind::partial_sum, d, work.output_bytes);
      writes.push_back(partials[static_cast<size_t>(j)]);
    } else if (!collective && rec.output >= 0) {
      writes.push_back(rec.output);
    }
    rec.task = rec.done = plan_.add_task(task, reads, writes);
    computes.push_back(rec.task);
    if (compute_input[static_cast<size_t>(j)] >= 0) set_free_after(compute_input[static_cast<size_t>(j)], rec.task);
  }
  if (collective) reduce_partials(w, stage, mb, OpKind::F, tp_name, devices, computes, partials, outputs);
}

void Builder::add_backward(int w, int stage, int mb, OpKind kind) {
  const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
  const std::vector<int> devices = rank_devices(w, stage);
  const int t = degree(w, stage);
  const bool split = schedule_.splits_backward;
  const std::string tp_name = "tp w" + std::to_string(w) + " r" + std::to_string(worker(w).stages[static_cast<size_t>(stage)].rank);
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
      const int id = plan_.add_task(task, reads, std::vector<int>{grad_of(d, stage)});
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
  const std::vector<int> compute_grad =
      gather_inputs(w, stage, tp_name, devices, grad, slices, work.output_bytes, like);
  // The input gradient is written by the compute: without sequence parallelism whole on
  // every rank when it ends (the first layer's f all-reduce comes before its replicated norm
  // and the residual add), under sequence parallelism the rank's shard (the first layer's f
  // reduce-scatter likewise). So the pass's collective carries f's traffic and no data.
  std::vector<int> computes;
  for (int j = 0; j < t; ++j) {
    const int d = devices[static_cast<size_t>(j)];
    OpRecord& rec = op(w, stage, mb, OpKind::B, j);
    const OpRecord& f = op(w, stage, mb, OpKind::F, j);
    rec.input = compute_grad[static_cast<size_t>(j)];
    Task task = base_task(TaskKind::backward, d, w, stage, mb);
    task.flops = (split ? work.backward_flops / 2 : work.backward_flops) + work.recompute_flops;
    task.recompute_flops = work.recompute_flops;
    task.memory_bytes = work.weight_bytes + work.stash_bytes;
    std::vector<int> reads{weight_of(d, stage), f.stash};
    if (rec.input >= 0) reads.push_back(rec.input);
    std::vector<int> writes;
    if (!split) writes.push_back(grad_of(d, stage));
    int scratch = -1;
    if (layout_.recompute == Recompute::full) {  // the forward redone one layer at a time
      scratch = activation_tensor(TensorKind::workspace, d, work.largest_layer_bytes);
      writes.push_back(scratch);
    }
    if (rec.output >= 0) writes.push_back(rec.output);
    rec.task = rec.done = plan_.add_task(task, reads, writes);
    computes.push_back(rec.task);
    set_free_after(scratch, rec.task);
    if (!split) {
      set_free_after(f.stash, rec.task);
      set_free_after(rec.input, rec.task);
    }
  }
  if (tp_collectives(w, stage)) {
    const std::vector<int> none(static_cast<size_t>(t), -1);
    reduce_partials(w, stage, mb, OpKind::B, tp_name, devices, computes, none, none);
  }
}

}  // namespace hetflow::partition::builder
