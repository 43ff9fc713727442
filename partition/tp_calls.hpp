#pragma once
// The tensor-parallel collectives one pass of a chunk performs inside its compute task, in
// the order it performs them, each at the point of the pass's work where it comes: the plan's
// in-task collectives (Collective::at), and exactly the sequence exec/decoder.cpp runs.
//
// From each layer's forward calls (model::TpCall, Megatron's f and g):
//   forward:   g all-reduced (sequence parallel: reduce-scattered), f nothing (all-gathered),
//              the loss's combinations all-reduced;
//   backward:  the layer's calls in reverse: g nothing (all-gathered: the output gradient's
//              shards), f's gradient all-reduced (all-gathered again for the weight gradients,
//              then reduce-scattered), the loss nothing; under full recomputation the layer's
//              forward calls first, as its forward runs again.
// An MoE layer under expert parallelism (PassShape::experts > 1, sequence parallel) runs
// Megatron-Core's all-to-all dispatcher instead of its MLP's f and g: the copies the dispatch
// brought all-gathered over the group just after it (all the rank's copies, tokens x top-k x
// load, hidden wide), reduce-scattered just before the combine; a shared expert's f and g
// after the combine. Backward: the scatter's gradient gathered, the gather's reduce-scattered.
// Points are the part of the pass's FLOPs done before the call, layer by layer (a backward
// walks its layers last to first, each layer's own points mirrored); calls at the same point
// keep their order by points a few ulps apart, so that the point alone orders a task's calls.
#include <functional>
#include <vector>

#include "model/network.hpp"
#include "partition/collective.hpp"
#include "partition/layout.hpp"

namespace hetflow::partition {

struct PassCall {
  CollectiveKind kind = CollectiveKind::all_reduce;
  double elems = 0;  // per sample
  double at = 0;     // in [0, 1], strictly increasing along a pass
  // A call the pass overlaps (Collective::until): the point where the pass waits for it, in
  // [at, the next call's at]; -1: it holds the pass at `at` until done.
  double until = -1;
};

struct PassShape {
  int layer_begin = 0, layer_end = 0;  // the chunk's layers
  int tensor = 1;                      // its rank's degree
  bool backward = false;
  bool sequence_parallel = false;
  bool split_backward = false;  // B computes input gradients only (its W the weights')
  Recompute recompute = Recompute::none;
  int context = 1;  // the context group's size: the rank computes 1/context of the tokens
  ContextComm context_comm = ContextComm::all_gather;
  int experts = 1;   // the expert group's size (Layout::experts.parallel)
  double expert_kept = 1;  // the part of the routed copies capacity keeps (ExpertSplit::dispatch)
  double expert_load = 1;  // the copies the rank's experts compute, per even share (ExpertShare::load)
  int micro_batch = 1;     // samples a micro-batch (a call of a micro-batch's elements, not a sample's, divides by it)
};

// The calls of one pass, in order, each moving its tokens' share (1/context); empty when the
// rank has one device. A mixture of experts' layer without expert groups runs as its MLP's
// calls, every rank routing every token, with one more in its backward: the all-reduce of the
// combine weights' (and a shared gate's) gradients, tokens x (top-k + 1 gated), before the
// router's backward.
std::vector<PassCall> pass_tp_calls(const model::Network& net, const PassShape& pass);

// One part of a layer's work in a pass, in the order the pass does them: its forward; in a
// backward, the forward again (recomputation; selective: the attention's) and the backward.
enum class LayerPart { forward, rerun, backward };
// Appends the calls a layer's part performs, each at its point of the part's work in [0, 1].
using LayerCalls = std::function<void(const model::Layer& layer, LayerPart part, std::vector<PassCall>& out)>;
// Every in-pass axis's calls of a pass: each part's calls placed at the part of the pass's
// FLOPs done before them (a layer not split by tensor parallelism does its rerun and its
// backward as one part), then made strictly increasing.
std::vector<PassCall> place_pass_calls(const model::Network& net, const PassShape& pass, const LayerCalls& calls_of);

// Makes the calls' points strictly increasing in their listed order, all within [0, 1]:
// calls at one point keep their order by points a few ulps apart; an overlapped call's
// `until` stays between its point and the next call's.
void strictly_increasing(std::vector<PassCall>& calls);

// A pass's calls of one kind and size: one in-task collective of the plan (Collective::at
// holds `points`), timed by the estimate as `points.size()` messages of `elems`.
struct PassCallGroup {
  CollectiveKind kind = CollectiveKind::all_reduce;
  double elems = 0;  // per sample, per message
  std::vector<double> points;
  std::vector<double> until;  // per point (Collective::until); empty when no call of the group overlaps
};
// The calls grouped by kind and size, in the order the pass first performs each group.
std::vector<PassCallGroup> group_calls(const std::vector<PassCall>& calls);

// Context parallelism's calls (axis_context.cpp): a pass's all-gathers of the sequence's keys
// and values, and in a backward the reduce-scatters of their gradients; or under a ring
// (PassShape::context_comm) the sendrecvs of their blocks, each overlapped with the attention
// on the block before; and in each MoE layer's forward (and its rerun) one all-reduce of the
// router's 2 E statistics of the micro-batch just before the dispatch (the load-balancing
// loss counts the whole sequence's tokens, as Megatron-Core's over its tensor-and-context
// group). Empty for one device.
std::vector<PassCall> pass_context_calls(const model::Network& net, const PassShape& pass);
// Expert parallelism's calls (axis_expert.cpp): in each MoE layer's forward the dispatch
// all-to-all after the router and the combine after the routed experts; in a backward their
// gradients' in reverse order (and under full recomputation the forward's again first);
// each of the rank's tokens' kept copies, per sample. Empty without an expert group.
std::vector<PassCall> pass_expert_calls(const model::Network& net, const PassShape& pass);

// The keys and values of one sequence on one tensor rank of degree `tensor`, per sample.
double context_kv_elems(const model::TransformerConfig& config, int tensor);
// The bytes of keys and values one attention layer of layers [begin, end) holds received for
// a micro-batch under the layout's context parallelism: the whole sequence's gathered, or a
// ring's two blocks (the one the attention computes on, the one arriving); 0 without it or
// without attention.
double context_gathered_bytes(const model::Network& net, const Layout& layout, int layer_begin, int layer_end,
                              int tensor);

// Elements every rank of a chunk's tensor-parallel group sums once a step, in its last
// backward (model::Layer::tp_summed_gains); 0 on one device.
double summed_gain_elems(const model::Network& net, int layer_begin, int layer_end, int tensor, bool sequence_parallel);

}  // namespace hetflow::partition
