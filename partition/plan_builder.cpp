// Layout -> plan. Reads top to bottom as the training iteration it builds: each virtual
// worker's compute in schedule order, the transfers between its chunks, then gradient
// synchronisation and the optimizer. This file holds the driver and what the parts share.
#include "partition/plan_builder.hpp"

#include <algorithm>
#include <charconv>
#include <set>

#include "model/error.hpp"
#include "partition/loading.hpp"
#include "partition/memory.hpp"
#include "partition/plan_builder_detail.hpp"
#include "partition/task_order.hpp"
#include "partition/tp_calls.hpp"

namespace hetflow::partition {

namespace builder {

ChunkWork chunk_work(const model::Network& net, const Layout& layout, const Stage& s, int tensor,
                     const ExpertShare& experts) {
  ChunkWork w;
  // Under context parallelism a device computes, stashes and sends its 1/C of the tokens.
  const double mbs = layout.micro_batch_size / static_cast<double>(layout.size(Axis::context));
  const double e = model::element_bytes(layout.precision);
  const double seq = net.architecture ? net.architecture->seq : 0;
  for (int i = s.layer_begin; i < s.layer_end; ++i) {
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    const double t = l.tp_splittable ? tensor : 1;
    // An MoE layer's routed experts compute the copies the worker's expert rank takes.
    const double scale = l.experts > 0 && experts.load != 1 && l.forward_flops > 0
                             ? rank_forward_flops(l, seq, experts.load) / l.forward_flops
                             : 1.0;
    w.forward_flops += l.forward_flops * scale * mbs / t;
    w.backward_flops += l.backward_flops * scale * mbs / t;
    if (layout.recompute == Recompute::full) w.recompute_flops += l.forward_flops * scale * mbs / t;
    if (layout.recompute == Recompute::selective) w.recompute_flops += l.attention_core_flops * mbs / t;
    w.stash_bytes += stashed_bytes_per_microbatch(l, net, layout, tensor);
    // An expert rank keeps the copies it computes: more of them at a load above an even share.
    if (experts.load != 1) w.stash_bytes += (experts.load - 1) * routed_stash_bytes_per_microbatch(l, net, layout, tensor);
    w.largest_layer_bytes = std::max(w.largest_layer_bytes, layer_activation_bytes(l, layout) / t * mbs);
    if (tensor > 1 && l.tp_splittable) {
      const bool rerun = l.forward_flops > 0;  // by full recomputation
      const auto add = [&](double elems, int collectives, Traffic& all, Traffic& rerun_only) {
        if (elems <= 0) return;
        const Traffic traffic{elems * mbs * e, std::max(1, collectives)};
        all.add(traffic);
        if (rerun) rerun_only.add(traffic);
      };
      // (Under sequence parallelism a pass's g is a reduce-scatter; the LM head's loss
      // all-reduces are not one, and are not planned there yet.)
      if (!(layout.sequence_parallel && l.kind == "head")) {
        add(l.tp_allreduce_elems, l.tp_allreduces, w.tp_forward, w.tp_rerun_forward);
      }
      add(l.tp_backward_allreduce_elems, l.tp_backward_allreduces, w.tp_backward, w.tp_rerun_backward);
    }
  }
  w.context_bytes = context_gathered_bytes(net, layout, s.layer_begin, s.layer_end, tensor);
  w.weight_bytes = (params_per_device(net, s.layer_begin, s.layer_end, tensor) -
                    expert_params_elsewhere(net, s.layer_begin, s.layer_end, experts.held, tensor)) * e;
  w.output_bytes = net.cut_bytes(static_cast<size_t>(s.layer_end)) * mbs;
  w.input_bytes = net.cut_bytes(static_cast<size_t>(s.layer_begin)) * mbs;
  return w;
}

TpPass tp_pass(const ChunkWork& work, bool backward, bool sequence_parallel, Recompute recompute) {
  const Traffic& g = work.tp_forward;
  const Traffic& f = work.tp_backward;
  Traffic gather, reduce;
  if (!backward) {
    reduce.add(g);
    if (sequence_parallel) gather.add(f);
  } else {
    reduce.add(f);
    if (sequence_parallel) {
      gather.add(g);  // the output gradient's shards
      gather.add(f);  // f's inputs again, for the weight gradients
    }
    if (recompute == Recompute::full) {  // the checkpointed forward runs its collectives again
      reduce.add(work.tp_rerun_forward);
      if (sequence_parallel) gather.add(work.tp_rerun_backward);
    }
  }
  return {gather.bytes, reduce.bytes, std::max(1, gather.messages), std::max(1, reduce.messages)};
}

bool tp_collectives(const ChunkWork& work, int tensor) {
  return tensor > 1 && (work.tp_forward.bytes > 0 || work.tp_backward.bytes > 0);
}

Builder::Builder(const model::Cluster& cluster, const model::Network& net, const Layout& layout, const CostModel& cost,
                 Plan& plan)
    : cluster_(cluster), net_(net), layout_(layout), cost_(cost), schedule_(schedule_by_name(layout.schedule)), plan_(plan) {}

void Builder::build() {
  check_layout();
  plan_.cluster = cluster_;
  plan_.network = net_;
  plan_.layout = layout_;
  for (const model::Device& d : cluster_.devices()) plan_.device_names.push_back(d.name);
  plan_.coords = layout_.device_coords(plan_.device_count());
  plan_.programs.resize(plan_.device_names.size());
  compute_stream_ = stream("compute");

  // Persistent tensors: each device's weights and gradient buffer per chunk it runs.
  const auto devices = plan_.device_names.size();
  weights_.resize(devices);
  grads_.resize(devices);
  chunks_of_device_.resize(devices);
  shard_params_.resize(devices);
  gathers_.resize(devices);
  const double grad_bytes_per_param = layout_.gradient_element_bytes();
  // Folded (Layout::folded): worker 0 alone gets tasks and tensors, or its context group.
  plan_.layout.folded = layout_.folded && layout_.workers.size() > static_cast<size_t>(layout_.size(Axis::context)) *
                                                                         static_cast<size_t>(layout_.experts.parallel);
  experts_ = expert_split(net_, layout_);
  const size_t built = built_workers();
  for (size_t w = 0; w < layout_.workers.size(); ++w) {
    const VirtualWorker& vw = layout_.workers[w];
    programs_.push_back(w < built ? schedule_.build(static_cast<int>(vw.ranks.size()), vw.microbatches, layout_.virtual_stages)
                                  : RankPrograms{});
    std::vector<ChunkWork> works;
    std::vector<int> degrees;
    std::vector<size_t> bases;
    size_t slots = 0;  // one per chunk, micro-batch and tensor rank
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      const int t = vw.tensor_of(k);
      degrees.push_back(t);
      bases.push_back(slots);
      slots += static_cast<size_t>(vw.microbatches) * static_cast<size_t>(t);
      const ExpertShare share = expert_share(experts_, layout_, static_cast<int>(w));
      works.push_back(chunk_work(net_, layout_, s, t, share));
      if (w >= built) continue;
      const auto& devices_of_rank = vw.ranks[static_cast<size_t>(s.rank)];
      for (size_t j = 0; j < devices_of_rank.size(); ++j) {
        const int d = devices_of_rank[j];
        // Rank j's shard (partition/shard.hpp): what its weight and gradient buffers hold,
        // or under ZeRO this replica's share of it (plan_builder_zero.cpp).
        const double elsewhere = expert_params_elsewhere(net_, s.layer_begin, s.layer_end, share.held, t);
        const double whole = part_params(net_, s.layer_begin, s.layer_end, SplitPart::rank(static_cast<int>(j), t)) - elsewhere;
        // Under expert parallelism the experts held are sharded over the replicas holding them.
        const double held = share.held < 0 ? 0 : routed_expert_params(net_, s.layer_begin, s.layer_end, t) - elsewhere;
        const double own = zero_stage() > 0 ? zero_own(layout_, whole, held, static_cast<int>(w),
                                                       zero_parts(replicas(static_cast<int>(k), static_cast<int>(j))))
                                            : whole;
        const double params = zero_stage() >= 3 ? own : whole, grads = zero_stage() >= 2 ? own : whole;
        const auto dd = static_cast<size_t>(d);
        shard_params_[dd] += own;
        weights_[dd].push_back(tensor(TensorKind::weight, d, params * model::element_bytes(layout_.precision),
                                      {static_cast<std::int64_t>(params)}, layout_.precision));
        grads_[dd].push_back(tensor(TensorKind::weight_grad, d, grads * grad_bytes_per_param,
                                    {static_cast<std::int64_t>(grads)},
                                    layout_.fp32_grad_accumulation ? model::Precision::fp32 : layout_.precision));
        chunks_of_device_[dd].push_back(static_cast<int>(k));
      }
    }
    work_.push_back(std::move(works));
    degrees_.push_back(std::move(degrees));
    slot_base_.push_back(std::move(bases));
    ops_.emplace_back(slots * 3);
    for (auto* v : {&inputs_, &output_grads_, &input_slices_, &grad_slices_}) v->emplace_back(slots, -1);
  }
  reserve();
  // The passes, with the in-rank axes' collectives inside them; then the phases of the axes
  // across ranks and across workers, in that order (axis_registry.hpp).
  for (size_t w = 0; w < built; ++w) add_compute(static_cast<int>(w));
  if (layout_.offload.activations &&
      std::none_of(plan_.tasks.begin(), plan_.tasks.end(), [](const Task& t) { return t.kind == TaskKind::to_host; })) {
    throw InputError(kOptions, 0, "offload_activations",
                     "has nothing to offload: every backward follows its own forward at once (schedule " +
                         layout_.schedule + " without a pipeline); a stash leaves only where other passes run "
                         "before its backward");
  }
  for (const AxisScope scope : {AxisScope::across_ranks, AxisScope::across_workers}) {
    for (const AxisRules& axis : axis_table()) {
      if (axis.scope == scope && axis.build != nullptr) axis.build(*this);
    }
  }
  add_loading(plan_);  // the input path's load tasks, where the cluster has one
  plan_.finish();
  add_memory();
}

void Builder::check_layout() const {
  const int layers = static_cast<int>(net_.layers.size());
  if (layout_.workers.empty()) throw InputError("<layout>", 0, "workers", "expected at least one virtual worker");
  if (layout_.micro_batch_size < 1) throw InputError("<layout>", 0, "micro_batch_size", "expected at least 1 sample");
  if (layout_.iterations < 1) throw InputError("<layout>", 0, "iterations", "expected at least 1 iteration");
  if (layout_.size(Axis::tensor) < 1) throw InputError("<layout>", 0, "tensor", "expected at least 1");
  for (const model::Layer& l : net_.layers) {
    if (l.tp_splittable && l.tp_units > 0 && l.tp_units % layout_.size(Axis::tensor) != 0) {
      throw InputError(kOptions, 0, "tensor",
                       "expected a divisor of the " + std::to_string(l.tp_units) + " attention heads (or KV groups) of " +
                           l.name + ", found " + std::to_string(layout_.size(Axis::tensor)));
    }
  }
  std::set<int> used;
  for (size_t w = 0; w < layout_.workers.size(); ++w) {
    const VirtualWorker& vw = layout_.workers[w];
    const std::string where = "workers[" + std::to_string(w) + "]";
    const int p = static_cast<int>(vw.ranks.size());
    if (p < 1) throw InputError("<layout>", 0, where + ".ranks", "expected at least one pipeline rank");
    if (static_cast<int>(vw.stages.size()) != p * layout_.virtual_stages) {
      throw InputError("<layout>", 0, where + ".stages",
                       "expected " + std::to_string(p * layout_.virtual_stages) + " chunks (ranks x virtual stages), found " +
                           std::to_string(vw.stages.size()));
    }
    for (size_t r = 0; r < vw.ranks.size(); ++r) {
      const auto& rank = vw.ranks[r];
      const std::string field = where + ".ranks[" + std::to_string(r) + "]";
      if (rank.empty() || static_cast<int>(rank.size()) > layout_.size(Axis::tensor)) {
        throw InputError("<layout>", 0, field,
                         "expected 1 to `tensor` (" + std::to_string(layout_.size(Axis::tensor)) + ") devices, found " +
                             std::to_string(rank.size()));
      }
      for (const model::Layer& l : net_.layers) {
        if (l.tp_splittable && l.tp_units > 0 && l.tp_units % static_cast<int>(rank.size()) != 0) {
          throw InputError("<layout>", 0, field,
                           "its " + std::to_string(rank.size()) + " devices (tensor parallel) must divide the " +
                               std::to_string(l.tp_units) + " attention heads (or KV groups) of " + l.name);
        }
      }
      for (int d : rank) {
        if (d < 0 || d >= cluster_.device_count()) throw InputError("<layout>", 0, where + ".ranks", "device out of range");
        if (!used.insert(d).second) {
          throw InputError("<layout>", 0, where + ".ranks", "device " + std::to_string(d) + " is used twice");
        }
      }
    }
    int next = 0;
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const Stage& s = vw.stages[k];
      if (s.layer_begin != next || s.layer_end <= s.layer_begin || s.layer_end > layers ||
          s.rank != static_cast<int>(k) % p) {
        throw InputError("<layout>", 0, where + ".stages[" + std::to_string(k) + "]",
                         "chunks must cover the layers in order, each non-empty, chunk k on rank k % p");
      }
      next = s.layer_end;
    }
    if (next != layers) throw InputError("<layout>", 0, where + ".stages", "chunks do not cover every layer");
    if (vw.microbatches < 1) throw InputError("<layout>", 0, where + ".microbatches", "expected at least 1");
  }
  if (layout_.folded) check_fold();
  if (layout_.largest_tensor() != layout_.size(Axis::tensor)) {
    throw InputError("<layout>", 0, "tensor",
                     "expected the largest rank's device count, " + std::to_string(layout_.largest_tensor()) + ", found " +
                         std::to_string(layout_.size(Axis::tensor)));
  }
  if (!layout_.uniform_tensor()) check_mixed_tensor();
  check_axes(layout_);
  check_context();
  check_zero();
  check_experts(net_, layout_);  // (expert_shard.hpp)
}

// Context parallelism (Layout::axes): groups of C consecutive workers that split a decoder's
// sequences in 2C chunks (Megatron's requirement that 2C divide the sequence) and run alike,
// pass for pass, since every pass meets its peers' inside it; their gradients are summed
// with the data axis's all-reduce.
void Builder::check_context() const {
  const int c = layout_.size(Axis::context);
  if (c < 1) throw InputError(kOptions, 0, "context", "expected at least 1, found " + std::to_string(c));
  if (c == 1) return;
  if (!net_.architecture) {
    throw InputError(kOptions, 0, "context", "splits a decoder's sequences; network " + net_.name +
                                                 " is not a decoder built from an architecture");
  }
  if (net_.architecture->seq % (2 * c) != 0) {
    throw InputError(kOptions, 0, "context", "expected 2 x context (" + std::to_string(2 * c) +
                                                 " load-balanced chunks) to divide the sequence of " +
                                                 std::to_string(net_.architecture->seq) + " tokens, found context " +
                                                 std::to_string(c));
  }
  if (layout_.sync.kind != SyncKind::allreduce) {
    throw InputError(kOptions, 0, "context", "needs all-reduce synchronisation (a context group's workers sum their "
                                             "gradients), found " + std::string(to_string(layout_.sync.kind)));
  }
  if (layout_.workers.size() % static_cast<size_t>(c) != 0) {
    throw InputError("<layout>", 0, "workers", "expected a multiple of the context size " + std::to_string(c) +
                                                   " (groups of consecutive workers), found " +
                                                   std::to_string(layout_.workers.size()));
  }
  for (size_t w = 0; w < layout_.workers.size(); ++w) {
    const VirtualWorker& vw = layout_.workers[w], &first = layout_.workers[w - w % static_cast<size_t>(c)];
    bool alike = vw.stages == first.stages && vw.microbatches == first.microbatches && vw.ranks.size() == first.ranks.size();
    for (size_t r = 0; alike && r < vw.ranks.size(); ++r) alike = vw.ranks[r].size() == first.ranks[r].size();
    if (!alike) {
      throw InputError("<layout>", 0, "workers[" + std::to_string(w) + "]",
                       "expected the chunks, micro-batches and rank sizes of worker " +
                           std::to_string(w - w % static_cast<size_t>(c)) +
                           ", the first of its context group: a group's workers run every pass together");
    }
  }
}

// Folding: every virtual worker a replica of worker 0 (the same ranks and chunks, micro-batches
// and device types, position by position), synchronised by ring all-reduce, on a cluster
// where replicas share no links but by symmetry.
void Builder::check_fold() const {
  if (layout_.sync.kind != SyncKind::allreduce || layout_.sync.algorithm != CollectiveAlgorithm::ring) {
    throw InputError(kOptions, 0, "fold", "folds data-parallel replicas synchronised by ring all-reduce only");
  }
  // One simulated replica sees the traffic of the others only where it shares their links'
  // loads by symmetry: at its own GPU links and NICs. Links that replicas' flows share
  // besides (an oversubscribed fabric, a NIC or PCIe uplink several GPUs use, a WAN) would
  // carry traffic a folded simulation does not have.
  const auto refuse = [](const std::string& why) {
    throw InputError(kOptions, 0, "fold", why + ": the replicas' traffic would share links one simulated replica cannot stand for");
  };
  if (cluster_.regions.size() > 1) refuse("the cluster has several regions");
  if (layout_.offload.any()) {
    throw InputError(kOptions, 0, "fold", "does not fold a plan that offloads: the replicas on a node share its CPUs "
                                          "and PCIe bridges, which one simulated replica cannot stand for");
  }
  for (const model::Region& r : cluster_.regions) {
    if (r.fabric.kind == model::FabricKind::fat_tree && r.fabric.oversubscription > 1) {
      refuse("region " + r.name + "'s fat tree is oversubscribed " + std::to_string(r.fabric.oversubscription) + ":1");
    }
  }
  for (const model::Node& n : cluster_.nodes) {
    if (n.nic.count < n.gpu_count) refuse("node " + n.name + " has fewer NICs than GPUs");
    if (n.intra.uplink_bandwidth_bytes_per_s > 0) refuse("node " + n.name + "'s GPUs share a PCIe uplink");
  }
  const VirtualWorker& first = layout_.workers.front();
  const std::vector<model::Device> devices = cluster_.devices();  // once: it is rebuilt on each call
  for (size_t w = 1; w < layout_.workers.size(); ++w) {
    const VirtualWorker& vw = layout_.workers[w];
    bool same = vw.stages == first.stages && vw.microbatches == first.microbatches && vw.ranks.size() == first.ranks.size();
    for (size_t r = 0; same && r < vw.ranks.size(); ++r) {
      same = vw.ranks[r].size() == first.ranks[r].size();
      for (size_t i = 0; same && i < vw.ranks[r].size(); ++i) {
        same = cluster_.device_gpu(devices[static_cast<size_t>(vw.ranks[r][i])]).name ==
               cluster_.device_gpu(devices[static_cast<size_t>(first.ranks[r][i])]).name;
      }
    }
    if (!same) {
      throw InputError(kOptions, 0, "fold",
                       "virtual worker " + std::to_string(w) +
                           " is not a replica of worker 0 (its stages, micro-batches or device types differ): only "
                           "identical replicas fold");
    }
  }
}

// Ranks of different tensor-parallel degrees: what the plan cannot express is refused.
void Builder::check_mixed_tensor() const {
  if (layout_.sequence_parallel) {
    throw InputError("<layout>", 0, "sequence_parallel",
                     "needs the same tensor-parallel degree in every rank (sequence shards would differ between "
                     "neighbouring stages); give every rank " + std::to_string(layout_.size(Axis::tensor)) + " devices");
  }
  // A layer that is not tensor parallel is replicated on every device of its rank; copies
  // held at different degrees cannot be summed piecewise (each worker would count t times).
  const auto replicated = [&](int l) {
    const model::Layer& layer = net_.layers[static_cast<size_t>(l)];
    return !layer.tp_splittable && layer.params + layer.tied_params > 0;
  };
  const bool data_parallel = layout_.sync.kind == SyncKind::allreduce && layout_.workers.size() > 1;
  std::vector<int> degree_of_layer(net_.layers.size(), 0), worker_of_layer(net_.layers.size(), 0);
  for (size_t w = 0; w < layout_.workers.size(); ++w) {
    const VirtualWorker& vw = layout_.workers[w];
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const int t = vw.tensor_of(k);
      for (int l = vw.stages[k].layer_begin; l < vw.stages[k].layer_end; ++l) {
        if (!replicated(l)) continue;
        const std::string layer = net_.layers[static_cast<size_t>(l)].name;
        const std::string field = "workers[" + std::to_string(w) + "].ranks[" + std::to_string(vw.stages[k].rank) + "]";
        int& seen = degree_of_layer[static_cast<size_t>(l)];
        if (data_parallel && seen > 0 && seen != t) {
          throw InputError("<layout>", 0, field,
                           layer + " is not tensor parallel (every device of a rank holds all of it) and is held on " +
                               std::to_string(t) + " devices here but on " + std::to_string(seen) + " in workers[" +
                               std::to_string(worker_of_layer[static_cast<size_t>(l)]) +
                               "]: its data-parallel all-reduce needs the same degree in every virtual worker");
        }
        if (seen == 0) {
          seen = t;
          worker_of_layer[static_cast<size_t>(l)] = static_cast<int>(w);
        }
        if (layout_.sync.kind == SyncKind::allreduce && k > 0 && net_.layers[static_cast<size_t>(l)].tied_params > 0 &&
            t != vw.tensor_of(0)) {
          throw InputError("<layout>", 0, field,
                           layer + " is not tensor parallel and shares parameters with layer 0, which its first rank "
                                   "holds on " + std::to_string(vw.tensor_of(0)) + " devices but this rank on " +
                               std::to_string(t) + ": their all-reduce needs the same degree");
        }
      }
    }
  }
}

// Room for what the iteration will hold, counted from the layout: a million tasks grown one
// reallocation at a time would be copied twenty times over.
void Builder::reserve() {
  size_t tasks = 0, tensors = 0;
  for (const VirtualWorker& vw : layout_.workers) {
    for (size_t k = 0; k < vw.stages.size(); ++k) {
      const auto t = static_cast<size_t>(vw.tensor_of(k));
      const size_t ops = static_cast<size_t>(vw.microbatches) * t;
      tasks += ops * (schedule_.splits_backward ? 3 : 2) * (t > 1 ? 3 : 1) + ops * 4;  // compute (+TP), transfers
      tensors += ops * 8;
    }
  }
  for (const Segment& s : data_parallel_segments(net_, layout_)) {
    for (const Segment::Piece& p : s.pieces) tasks += static_cast<size_t>(p.buckets) * layout_.workers.size();
  }
  tasks += plan_.device_names.size();
  plan_.tasks.reserve(tasks);
  plan_.ref_begin.reserve(tasks);
  plan_.read_count.reserve(tasks);
  plan_.write_count.reserve(tasks);
  plan_.refs.reserve(tasks * 2);
  plan_.tensors.reserve(tensors);
}

int Builder::stream(const std::string& name) {
  const auto it = stream_ids_.find(name);
  if (it != stream_ids_.end()) return it->second;
  plan_.streams.push_back(name);
  const int id = static_cast<int>(plan_.streams.size()) - 1;
  stream_ids_.emplace(name, id);
  return id;
}

// Groups of one role over the same devices are one communicator; groups of different roles
// never share one (a back end may run them at once, and chooses them by role).
int Builder::communicator(CommRole role, const std::string& name, const std::vector<int>& devices) {
  auto key = std::make_pair(role, devices);
  const auto it = communicator_ids_.find(key);
  if (it != communicator_ids_.end()) return it->second;
  const int id = plan_.add_communicator(Communicator{name, devices, role});
  communicator_ids_.emplace(std::move(key), id);
  return id;
}

int Builder::channel(int src, int dst, const std::string& tag, CommRole role) {
  const auto key = std::make_tuple(src, dst, tag);
  const auto it = channel_ids_.find(key);
  if (it != channel_ids_.end()) return it->second;
  const int a = std::min(src, dst), b = std::max(src, dst);
  const int pair = communicator(role, "pair " + std::to_string(a) + "-" + std::to_string(b), {a, b});
  const int id = plan_.add_channel(Channel{src, dst, tag, pair});
  channel_ids_.emplace(key, id);
  return id;
}

int Builder::device_of(int w, int stage, int j) const {
  const VirtualWorker& vw = worker(w);
  const Stage& s = vw.stages[static_cast<size_t>(stage)];
  return vw.ranks[static_cast<size_t>(s.rank)][static_cast<size_t>(j)];
}

std::vector<int> Builder::rank_devices(int w, int stage) const {
  const VirtualWorker& vw = worker(w);
  return vw.ranks[static_cast<size_t>(vw.stages[static_cast<size_t>(stage)].rank)];
}

int Builder::chunk_index(int device, int stage) const {
  const auto& chunks = chunks_of_device_[static_cast<size_t>(device)];
  return static_cast<int>(std::find(chunks.begin(), chunks.end(), stage) - chunks.begin());
}

// A chunk's ops lie together: per micro-batch, F, B and W, each for tensor ranks 0..t-1.
OpRecord& Builder::op(int w, int stage, int mb, OpKind kind, int j) {
  const auto t = static_cast<size_t>(degree(w, stage));
  const size_t first = slot_base_[static_cast<size_t>(w)][static_cast<size_t>(stage)] + static_cast<size_t>(mb) * t;
  return ops_[static_cast<size_t>(w)][first * 3 + static_cast<size_t>(kind) * t + static_cast<size_t>(j)];
}

Task Builder::base_task(TaskKind kind, int device, int w, int stage, int mb) const {
  Task t;
  t.kind = kind;
  t.device = device;
  t.stream = compute_stream_;
  t.worker = w;
  t.stage = stage;
  t.microbatch = mb;
  if (stage >= 0) {
    const Stage& s = worker(w).stages[static_cast<size_t>(stage)];
    t.layer_begin = s.layer_begin;
    t.layer_end = s.layer_end;
  }
  return t;
}

Task Builder::communication(Task like, TaskKind kind, Purpose purpose, int device, double bytes) {
  like.kind = kind;
  like.purpose = purpose;
  like.device = device;
  like.bytes = bytes;
  like.flops = like.recompute_flops = like.memory_bytes = 0;
  like.channel = like.collective = -1;
  return like;
}

int Builder::tensor(TensorKind kind, int device, double bytes, std::vector<std::int64_t> shape, model::Precision dtype) {
  Tensor t;
  t.kind = kind;
  t.device = device;
  t.bytes = bytes;
  t.shape = std::move(shape);
  t.dtype = dtype;
  return plan_.add_tensor(t);
}

// Activations and their gradients: [micro-batch, elements per sample] at the layout's precision.
int Builder::activation_tensor(TensorKind kind, int device, double bytes) {
  const double per_sample = bytes / model::element_bytes(layout_.precision) / layout_.micro_batch_size;
  return tensor(kind, device, bytes, {layout_.micro_batch_size, static_cast<std::int64_t>(per_sample)},
                layout_.precision);
}

std::vector<int> Builder::add_collective(CollectiveKind kind, CollectiveAlgorithm algorithm, const std::string& group_name,
                                         const std::vector<int>& devices, double bytes, Purpose purpose, int stream_id,
                                         Task like, const std::vector<int>& reads, const std::vector<int>& writes,
                                         size_t with_tasks) {
  Collective c;
  c.kind = kind;
  c.algorithm = algorithm;
  c.purpose = purpose;
  c.bytes = bytes;
  c.communicator = communicator(role_of(purpose), group_name, devices);
  const int index = static_cast<int>(plan_.collectives.size());
  c.tasks.reserve(devices.size());
  for (size_t i = 0; i < devices.size() && i < with_tasks; ++i) {
    Task t = communication(like, TaskKind::collective, purpose, devices[i], bytes);
    t.stream = stream_id;
    t.collective = index;
    const bool r = i < reads.size() && reads[i] >= 0, w = i < writes.size() && writes[i] >= 0;
    c.tasks.push_back(plan_.add_task(t, std::span<const int>(reads.data() + i, r ? 1 : 0),
                                     std::span<const int>(writes.data() + i, w ? 1 : 0)));
  }
  plan_.collectives.push_back(std::move(c));
  return plan_.collectives.back().tasks;
}

// "send>DST:TAG" or "recv<SRC:TAG", spelled in one reused buffer: a plan has a million
// transfers, and temporaries per name cost as much as the rest of a transfer.
int Builder::transfer_stream(const char* prefix, int peer, const std::string& tag) {
  std::string& name = stream_name_;
  name.assign(prefix);
  char digits[16];
  name.append(digits, std::to_chars(digits, digits + sizeof digits, peer).ptr);
  name += ':';
  name += tag;
  return stream(name);
}

std::pair<int, int> Builder::add_transfer(int src, int dst, const std::string& tag, double bytes, Purpose purpose,
                                          const Task& like, int sent_tensor, int received_tensor) {
  const int ch = channel(src, dst, tag, role_of(purpose));
  Task s = communication(like, TaskKind::send, purpose, src, bytes);
  s.channel = ch;
  s.stream = transfer_stream("send>", dst, tag);
  Task r = s;
  r.kind = TaskKind::recv;
  r.device = dst;
  r.stream = transfer_stream("recv<", src, tag);
  std::vector<int> sent, received;
  if (sent_tensor >= 0) sent.push_back(sent_tensor);
  if (received_tensor >= 0) received.push_back(received_tensor);
  const int send_id = plan_.add_task(s, sent, {});
  const int recv_id = plan_.add_task(r, {}, received);
  return {send_id, recv_id};
}

void Builder::set_free_after(int tensor_id, int task) {
  if (tensor_id >= 0) plan_.tensor(tensor_id).free_after = task;
}

// Peak memory per device from the tensors' lifetimes in the plan's canonical order.
void Builder::add_memory() {
  const TaskOrder order = order_tasks(plan_);
  plan_.memory = memory_from_lifetimes(plan_, order.task_sequence(), [this](int d) { return cost_.memory_capacity_bytes(d); });
}

}  // namespace builder

Plan build_plan(const model::Cluster& cluster, const model::Network& network, const Layout& layout,
                const CostModel& cost) {
  Plan plan;  // built in place: a Boost graph is copied, not moved
  builder::Builder(cluster, network, layout, cost, plan).build();
  return plan;
}

}  // namespace hetflow::partition
