// Layout -> plan. Reads top to bottom as the training loop it builds: per iteration, each
// virtual worker's compute in schedule order, then the transfers between its chunks, then
// gradient synchronisation and the optimizer.
#include "partition/plan_builder.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>

#include "model/error.hpp"
#include "model/io.hpp"
#include "partition/schedule.hpp"

namespace hetflow::partition {

namespace {

// Per chunk and per device of its rank, for one micro-batch.
struct ChunkWork {
  double forward_flops = 0, backward_flops = 0, recompute_flops = 0;
  double weight_bytes = 0;          // device-memory traffic: weights read once per pass
  double activation_bytes = 0;      // and the chunk's stashed activations
  double tp_allreduce_bytes = 0;    // per pass, per device
  double send_forward_bytes = 0;    // activations to the next chunk, per device
  double send_backward_bytes = 0;   // gradients to the previous chunk, per device
};

ChunkWork chunk_work(const model::Network& net, const Layout& layout, const Stage& s) {
  ChunkWork w;
  const double mbs = layout.micro_batch_size;
  const double e = model::element_bytes(layout.precision);
  for (int i = s.layer_begin; i < s.layer_end; ++i) {
    const model::Layer& l = net.layers[static_cast<size_t>(i)];
    const double t = l.tp_splittable ? layout.tensor : 1;
    w.forward_flops += l.forward_flops * mbs / t;
    w.backward_flops += l.backward_flops * mbs / t;
    if (layout.recompute == Recompute::full) w.recompute_flops += l.forward_flops * mbs / t;
    if (layout.recompute == Recompute::selective) w.recompute_flops += l.attention_core_flops * mbs / t;
    w.activation_bytes += stashed_bytes_per_microbatch(l, net, layout);
    if (layout.tensor > 1 && l.tp_splittable) w.tp_allreduce_bytes += l.tp_allreduce_elems * mbs * e;
  }
  w.weight_bytes = params_per_device(net, s.layer_begin, s.layer_end, layout.tensor) * e;
  // Megatron's scatter-gather optimisation: each tensor-parallel rank sends 1/t of a boundary.
  w.send_forward_bytes = net.cut_bytes(static_cast<size_t>(s.layer_end)) * mbs / layout.tensor;
  w.send_backward_bytes = net.cut_bytes(static_cast<size_t>(s.layer_begin)) * mbs / layout.tensor;
  return w;
}

class Builder {
 public:
  Builder(const model::Cluster& cluster, const model::Network& net, const Layout& layout, const CostModel& cost)
      : cluster_(cluster), net_(net), layout_(layout), cost_(cost), schedule_(schedule_by_name(layout.schedule)) {}

  Plan build() {
    check_layout();
    plan_.cluster_name = cluster_.name;
    plan_.cluster_yaml = model::write_cluster(cluster_);
    plan_.network_name = net_.name;
    plan_.network_layers = static_cast<int>(net_.layers.size());
    plan_.layout = layout_;
    for (const model::Device& d : cluster_.devices()) plan_.device_names.push_back(d.name);
    plan_.programs.resize(plan_.device_names.size());
    compute_stream_ = stream("compute");

    for (const VirtualWorker& w : layout_.workers) {
      programs_.push_back(schedule_.build(static_cast<int>(w.ranks.size()), w.microbatches, layout_.virtual_stages));
      std::vector<ChunkWork> works;
      for (const Stage& s : w.stages) works.push_back(chunk_work(net_, layout_, s));
      work_.push_back(std::move(works));
    }
    for (int it = 0; it < layout_.iterations; ++it) {
      op_done_.assign(layout_.workers.size(), {});
      op_task_.assign(layout_.workers.size(), {});
      for (size_t w = 0; w < layout_.workers.size(); ++w) {
        const size_t slots = layout_.workers[w].stages.size() * static_cast<size_t>(layout_.workers[w].microbatches) * 3 *
                             static_cast<size_t>(layout_.tensor);
        op_done_[w].assign(slots, -1);
        op_task_[w].assign(slots, -1);
      }
      for (size_t w = 0; w < layout_.workers.size(); ++w) add_compute(it, static_cast<int>(w));
      for (size_t w = 0; w < layout_.workers.size(); ++w) add_pipeline_transfers(it, static_cast<int>(w));
      if (layout_.sync.kind == SyncKind::allreduce) {
        add_allreduce_sync(it);
      } else {
        add_parameter_server_sync(it);
      }
    }
    link_pulls();
    add_memory();
    return std::move(plan_);
  }

 private:
  // Slot of one op of one device in op_task_/op_done_: (stage, micro-batch, kind, tensor rank).
  size_t op_slot(int w, int stage, int mb, OpKind kind, int j) const {
    const auto m = static_cast<size_t>(layout_.workers[static_cast<size_t>(w)].microbatches);
    return ((static_cast<size_t>(stage) * m + static_cast<size_t>(mb)) * 3 + static_cast<size_t>(kind)) *
               static_cast<size_t>(layout_.tensor) + static_cast<size_t>(j);
  }

  void check_layout() const {
    const int layers = static_cast<int>(net_.layers.size());
    if (layout_.workers.empty()) throw InputError("<layout>", 0, "workers", "expected at least one virtual worker");
    if (layout_.micro_batch_size < 1) throw InputError("<layout>", 0, "--micro-batch", "expected at least 1 sample");
    if (layout_.iterations < 1) throw InputError("<layout>", 0, "--iterations", "expected at least 1 iteration");
    for (const model::Layer& l : net_.layers) {
      if (l.tp_splittable && l.tp_units > 0 && l.tp_units % layout_.tensor != 0) {
        throw InputError("<command line>", 0, "--tensor",
                         "expected a divisor of the " + std::to_string(l.tp_units) + " attention heads (or KV groups) of " +
                             l.name + ", found " + std::to_string(layout_.tensor));
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
      for (const auto& rank : vw.ranks) {
        if (static_cast<int>(rank.size()) != layout_.tensor) {
          throw InputError("<layout>", 0, where + ".ranks", "expected " + std::to_string(layout_.tensor) + " devices per rank");
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
  }

  int stream(const std::string& name) {
    const auto it = stream_ids_.find(name);
    if (it != stream_ids_.end()) return it->second;
    plan_.streams.push_back(name);
    const int id = static_cast<int>(plan_.streams.size()) - 1;
    stream_ids_.emplace(name, id);
    return id;
  }

  int device_of(int w, int stage, int j) const {
    const VirtualWorker& vw = layout_.workers[static_cast<size_t>(w)];
    const Stage& s = vw.stages[static_cast<size_t>(stage)];
    return vw.ranks[static_cast<size_t>(s.rank)][static_cast<size_t>(j)];
  }

  Task base_task(TaskKind kind, int device, int it, int w, int stage, int mb) const {
    Task t;
    t.kind = kind;
    t.device = device;
    t.stream = compute_stream_;
    t.iteration = it;
    t.worker = w;
    t.stage = stage;
    t.microbatch = mb;
    if (stage >= 0) {
      const Stage& s = layout_.workers[static_cast<size_t>(w)].stages[static_cast<size_t>(stage)];
      t.layer_begin = s.layer_begin;
      t.layer_end = s.layer_end;
    }
    return t;
  }

  // A communication task modelled on `like` (iteration, worker, stage, micro-batch, layers):
  // no compute of its own, `bytes` to move.
  static Task communication(Task like, TaskKind kind, Purpose purpose, int device, double bytes) {
    like.kind = kind;
    like.purpose = purpose;
    like.device = device;
    like.bytes = bytes;
    like.flops = like.recompute_flops = like.memory_bytes = 0;
    return like;
  }

  // A collective over `devices` with one task per device on `stream_id`; returns task ids.
  std::vector<int> add_collective(const std::vector<int>& devices, double bytes, Purpose purpose,
                                  CollectiveAlgorithm algorithm, int stream_id, Task like) {  // by value: add_task reallocates tasks
    Collective c;
    c.algorithm = algorithm;
    c.purpose = purpose;
    c.bytes = bytes;
    c.devices = devices;
    const int group = static_cast<int>(plan_.collectives.size());
    for (int d : devices) {
      Task t = communication(like, TaskKind::collective, purpose, d, bytes);
      t.stream = stream_id;
      t.group = group;
      c.tasks.push_back(plan_.add_task(t));
    }
    plan_.collectives.push_back(std::move(c));
    return plan_.collectives.back().tasks;
  }

  // A send/recv pair on the per-peer channels; returns {send, recv}.
  std::pair<int, int> add_transfer(int src, int dst, double bytes, Purpose purpose, const std::string& tag,
                                   const Task& like) {
    Task s = communication(like, TaskKind::send, purpose, src, bytes);
    s.peer = dst;
    s.group = next_transfer_++;
    s.stream = stream("send>" + std::to_string(dst) + ":" + tag);
    Task r = s;
    r.kind = TaskKind::recv;
    r.device = dst;
    r.peer = src;
    r.stream = stream("recv<" + std::to_string(src) + ":" + tag);
    const int send_id = plan_.add_task(s);
    const int recv_id = plan_.add_task(r);
    return {send_id, recv_id};
  }

  void add_compute(int it, int w) {
    const VirtualWorker& vw = layout_.workers[static_cast<size_t>(w)];
    const int p = static_cast<int>(vw.ranks.size());
    for (int r = 0; r < p; ++r) {
      for (const ScheduledOp& op : programs_[static_cast<size_t>(w)][static_cast<size_t>(r)]) {
        const int stage = op.chunk * p + r;
        const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
        std::vector<int> computes;
        for (int j = 0; j < layout_.tensor; ++j) {
          Task t = base_task(TaskKind::forward, device_of(w, stage, j), it, w, stage, op.microbatch);
          if (op.kind == OpKind::F) {
            t.flops = work.forward_flops;
            t.memory_bytes = work.weight_bytes + work.activation_bytes;
          } else {
            const double backward = schedule_.splits_backward ? work.backward_flops / 2 : work.backward_flops;
            t.kind = op.kind == OpKind::B ? TaskKind::backward : TaskKind::backward_weight;
            t.flops = backward;
            t.memory_bytes = work.weight_bytes + work.activation_bytes;
            if (op.kind == OpKind::B) {
              t.recompute_flops = work.recompute_flops;
              t.flops += work.recompute_flops;
            }
          }
          computes.push_back(plan_.add_task(t));
        }
        std::vector<int> done = computes;
        // Tensor parallelism: the forward's and the input gradient's all-reduces sit on the
        // compute stream; the weight gradient needs none.
        if (layout_.tensor > 1 && work.tp_allreduce_bytes > 0 && op.kind != OpKind::W) {
          std::vector<int> devices;
          for (int j = 0; j < layout_.tensor; ++j) devices.push_back(device_of(w, stage, j));
          done = add_collective(devices, work.tp_allreduce_bytes, Purpose::tensor_parallel, CollectiveAlgorithm::ring,
                                compute_stream_, plan_.tasks[static_cast<size_t>(computes[0])]);
          // Each rank's all-reduce follows its own compute; the collective is the rendezvous.
          for (int j = 0; j < layout_.tensor; ++j) {
            plan_.add_dependency(computes[static_cast<size_t>(j)], done[static_cast<size_t>(j)]);
          }
        }
        for (int j = 0; j < layout_.tensor; ++j) {
          const size_t slot = op_slot(w, stage, op.microbatch, op.kind, j);
          op_task_[static_cast<size_t>(w)][slot] = computes[static_cast<size_t>(j)];
          op_done_[static_cast<size_t>(w)][slot] = done[static_cast<size_t>(j)];
          // Local order: B after its F, W after its B (program order implies it; the edge
          // records the data dependency).
          if (op.kind != OpKind::F) {
            const OpKind before = op.kind == OpKind::B ? OpKind::F : OpKind::B;
            plan_.add_dependency(op_done_[static_cast<size_t>(w)][op_slot(w, stage, op.microbatch, before, j)],
                                 computes[static_cast<size_t>(j)]);
          }
        }
      }
    }
  }

  void add_pipeline_transfers(int it, int w) {
    const VirtualWorker& vw = layout_.workers[static_cast<size_t>(w)];
    const int p = static_cast<int>(vw.ranks.size());
    const int stages = static_cast<int>(vw.stages.size());
    auto& done = op_done_[static_cast<size_t>(w)];
    auto& task = op_task_[static_cast<size_t>(w)];
    // Producer order, rank by rank: each channel carries its tensors in the order they are made.
    for (int r = 0; r < p; ++r) {
      for (const ScheduledOp& op : programs_[static_cast<size_t>(w)][static_cast<size_t>(r)]) {
        const int stage = op.chunk * p + r;
        const ChunkWork& work = work_[static_cast<size_t>(w)][static_cast<size_t>(stage)];
        int consumer_stage = -1;
        double bytes = 0;
        Purpose purpose = Purpose::activation;
        if (op.kind == OpKind::F && stage + 1 < stages) {
          consumer_stage = stage + 1;
          bytes = work.send_forward_bytes;
        } else if (op.kind == OpKind::B && stage > 0) {
          consumer_stage = stage - 1;
          bytes = work.send_backward_bytes;
          purpose = Purpose::gradient;
        }
        if (consumer_stage < 0) continue;
        for (int j = 0; j < layout_.tensor; ++j) {
          const int producer = done[op_slot(w, stage, op.microbatch, op.kind, j)];
          const int consumer = task[op_slot(w, consumer_stage, op.microbatch, op.kind, j)];
          const int src = device_of(w, stage, j), dst = device_of(w, consumer_stage, j);
          if (src == dst || bytes <= 0) {
            plan_.add_dependency(producer, consumer);
            continue;
          }
          Task like = plan_.tasks[static_cast<size_t>(producer)];
          like.iteration = it;
          const auto [send, recv] =
              add_transfer(src, dst, bytes, purpose, purpose == Purpose::activation ? "act" : "grad", like);
          plan_.add_dependency(producer, send);
          plan_.add_dependency(recv, consumer);
        }
      }
    }
  }

  // The last compute task of each device in this iteration (its gradients are complete then).
  std::map<int, int> last_compute_of_devices(int it) const {
    std::map<int, int> last;
    for (const VirtualWorker& vw : layout_.workers) {
      for (const auto& rank : vw.ranks) {
        for (int d : rank) {
          const auto& program = plan_.program(d, compute_stream_);
          for (auto i = program.rbegin(); i != program.rend(); ++i) {
            const Task& t = plan_.tasks[static_cast<size_t>(*i)];
            if (t.iteration == it && (t.kind == TaskKind::backward || t.kind == TaskKind::backward_weight ||
                                      t.kind == TaskKind::collective)) {
              last[d] = *i;
              break;
            }
          }
        }
      }
    }
    return last;
  }

  void add_allreduce_sync(int it) {
    const std::map<int, int> last = last_compute_of_devices(it);
    std::map<int, std::vector<int>> device_syncs;
    const int comm = stream("comm");
    const double grad_bytes_per_param = layout_.fp32_grad_accumulation ? 4.0 : model::element_bytes(layout_.precision);
    // Segments: maximal layer ranges held by the same devices (one per virtual worker) for
    // each tensor rank. Later layers first: their gradients are ready first. Every device
    // sees the collectives in this one global order, so comm streams cannot deadlock.
    const int layers = static_cast<int>(net_.layers.size());
    std::vector<std::vector<int>> holders(static_cast<size_t>(layers));  // per layer, per worker: stage
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      for (size_t k = 0; k < layout_.workers[w].stages.size(); ++k) {
        const Stage& s = layout_.workers[w].stages[k];
        for (int l = s.layer_begin; l < s.layer_end; ++l) holders[static_cast<size_t>(l)].push_back(static_cast<int>(k));
      }
    }
    int end = layers;
    while (end > 0) {
      int begin = end - 1;
      while (begin > 0 && holders[static_cast<size_t>(begin - 1)] == holders[static_cast<size_t>(end - 1)]) --begin;
      const std::vector<int>& stage_of_worker = holders[static_cast<size_t>(end - 1)];
      if (layout_.workers.size() > 1) {
        const double bytes = params_per_device(net_, begin, end, layout_.tensor) * grad_bytes_per_param;
        const int buckets = std::max(1, static_cast<int>(std::ceil(bytes / layout_.sync.bucket_bytes)));
        for (int j = 0; j < layout_.tensor; ++j) {
          std::vector<int> devices;
          for (size_t w = 0; w < layout_.workers.size(); ++w) {
            devices.push_back(device_of(static_cast<int>(w), stage_of_worker[w], j));
          }
          for (int b = 0; b < buckets; ++b) {
            Task like = base_task(TaskKind::collective, devices[0], it, -1, -1, -1);
            like.layer_begin = begin;
            like.layer_end = end;
            const auto tasks = add_collective(devices, bytes / buckets, Purpose::data_parallel,
                                              layout_.sync.algorithm, comm, like);
            for (size_t i = 0; i < devices.size(); ++i) {
              plan_.add_dependency(last.at(devices[i]), tasks[i]);
              device_syncs[devices[i]].push_back(tasks[i]);
            }
          }
        }
      }
      end = begin;
    }
    // The optimizer step: after the device's last gradient and all its all-reduces.
    for (const auto& [device, last_task] : last) {
      const Task& t = plan_.tasks[static_cast<size_t>(last_task)];
      const int w = t.worker >= 0 ? t.worker : worker_of(device);
      Task opt = base_task(TaskKind::optimizer, device, it, w, -1, -1);
      const double params = device_params(device);
      // Adam: ~12 FLOPs per parameter; reads and writes weights, gradients, master copy and
      // two moments: memory bound on every GPU.
      opt.flops = 12 * params;
      opt.memory_bytes = 32 * params;
      const int id = plan_.add_task(opt);
      plan_.add_dependency(last_task, id);
      for (int s : device_syncs[device]) plan_.add_dependency(s, id);
    }
  }

  int worker_of(int device) const {
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      for (const auto& rank : layout_.workers[w].ranks) {
        if (std::find(rank.begin(), rank.end(), device) != rank.end()) return static_cast<int>(w);
      }
    }
    return -1;
  }

  // Parameters on a device: its chunks' layers, split over the tensor-parallel group.
  double device_params(int device) const {
    double params = 0;
    for (const VirtualWorker& vw : layout_.workers) {
      for (const Stage& s : vw.stages) {
        const auto& rank = vw.ranks[static_cast<size_t>(s.rank)];
        if (std::find(rank.begin(), rank.end(), device) != rank.end()) {
          params += params_per_device(net_, s.layer_begin, s.layer_end, layout_.tensor);
        }
      }
    }
    return params;
  }

  void add_parameter_server_sync(int it) {
    const std::vector<int>& server_of = layout_.sync.layer_server;
    if (server_of.size() != net_.layers.size()) {
      throw InputError("<layout>", 0, "sync.layer_server", "expected one server device per layer");
    }
    const double e = model::element_bytes(layout_.precision);
    const std::map<int, int> last = last_compute_of_devices(it);
    std::map<int, std::vector<int>> pushes_to_server;  // server -> recv tasks
    struct Pull { int server, device, w, stage, j; double bytes; };
    std::vector<Pull> pulls;
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      for (size_t k = 0; k < vw.stages.size(); ++k) {
        const Stage& s = vw.stages[k];
        // This chunk's layers, grouped by the server that hosts them.
        std::map<int, double> params_per_server;
        for (int l = s.layer_begin; l < s.layer_end; ++l) {
          params_per_server[server_of[static_cast<size_t>(l)]] += params_per_device(net_, l, l + 1, layout_.tensor);
        }
        for (int j = 0; j < layout_.tensor; ++j) {
          const int device = device_of(static_cast<int>(w), static_cast<int>(k), j);
          for (const auto& [server, params] : params_per_server) {
            if (params <= 0) continue;
            const int producer = last.at(device);
            Task like = base_task(TaskKind::send, device, it, static_cast<int>(w), static_cast<int>(k), -1);
            if (server == device) {
              pushes_to_server[server].push_back(producer);
            } else {
              const auto [send, recv] = add_transfer(device, server, params * e, Purpose::ps_push, "push", like);
              plan_.add_dependency(producer, send);
              pushes_to_server[server].push_back(recv);
            }
            pulls.push_back({server, device, static_cast<int>(w), static_cast<int>(k), j, params * e});
          }
        }
      }
    }
    // One update per server and iteration, on its own stream so it overlaps the server's
    // pipeline work; then the pulls back to every worker device.
    const int ps_stream = stream("ps");
    std::map<int, int> update_of;
    for (const auto& [server, inputs] : pushes_to_server) {
      Task u = base_task(TaskKind::optimizer, server, it, -1, -1, -1);
      u.stream = ps_stream;
      double params = 0;
      for (size_t l = 0; l < server_of.size(); ++l) {
        if (server_of[l] == server) params += params_per_device(net_, static_cast<int>(l), static_cast<int>(l) + 1, 1);
      }
      u.flops = 12 * params;
      u.memory_bytes = 32 * params;
      const int id = plan_.add_task(u);
      for (int in : inputs) plan_.add_dependency(in, id);
      update_of[server] = id;
    }
    for (const Pull& p : pulls) {
      int arrived = update_of.at(p.server);
      if (p.server != p.device) {
        Task like = base_task(TaskKind::recv, p.server, it, p.w, p.stage, -1);
        const auto [send, recv] = add_transfer(p.server, p.device, p.bytes, Purpose::ps_pull, "pull", like);
        plan_.add_dependency(arrived, send);
        arrived = recv;
      }
      // Wave-synchronous parallel: iteration it + D + 1 of this worker needs these weights.
      pending_pulls_[{it + layout_.sync.staleness + 1, p.w, p.stage, p.j}].push_back(arrived);
    }
  }

  void add_memory() {
    const int devices = static_cast<int>(plan_.device_names.size());
    plan_.memory.assign(static_cast<size_t>(devices), DeviceMemory{});
    const bool allreduce = layout_.sync.kind == SyncKind::allreduce;
    for (size_t w = 0; w < layout_.workers.size(); ++w) {
      const VirtualWorker& vw = layout_.workers[w];
      const auto in_flight = peak_in_flight(programs_[w], layout_.virtual_stages);
      for (size_t r = 0; r < vw.ranks.size(); ++r) {
        std::vector<Stage> chunks;
        for (const Stage& s : vw.stages) {
          if (s.rank == static_cast<int>(r)) chunks.push_back(s);
        }
        for (int d : vw.ranks[r]) {
          plan_.memory[static_cast<size_t>(d)] =
              device_memory(net_, layout_, chunks, in_flight[r], allreduce, cost_.memory_capacity_bytes(d));
        }
      }
    }
    if (!allreduce) {
      // Servers keep an fp32 copy of their layers' weights and the Adam moments.
      for (size_t l = 0; l < layout_.sync.layer_server.size(); ++l) {
        const int server = layout_.sync.layer_server[l];
        DeviceMemory& m = plan_.memory[static_cast<size_t>(server)];
        m.optimizer_bytes += params_per_device(net_, static_cast<int>(l), static_cast<int>(l) + 1, 1) * 12.0;
        m.capacity_bytes = cost_.memory_capacity_bytes(server);
      }
    }
  }

  // The first forward of (worker, stage, tensor rank) in iteration it waits for the pulls
  // due then (ps / wsp).
  void link_pulls() {
    for (const auto& [key, pulls] : pending_pulls_) {
      const auto [it, w, stage, j] = key;
      const int device = device_of(w, stage, j);
      const auto& program = plan_.program(device, compute_stream_);
      for (int id : program) {
        const Task& t = plan_.tasks[static_cast<size_t>(id)];
        if (t.iteration == it && t.stage == stage && t.kind == TaskKind::forward) {
          for (int pull : pulls) plan_.add_dependency(pull, id);
          break;
        }
      }
    }
  }

  const model::Cluster& cluster_;
  const model::Network& net_;
  const Layout& layout_;
  const CostModel& cost_;
  const Schedule& schedule_;
  Plan plan_;
  int compute_stream_ = 0;
  int next_transfer_ = 0;
  std::unordered_map<std::string, int> stream_ids_;
  std::vector<RankPrograms> programs_;          // per worker
  std::vector<std::vector<ChunkWork>> work_;    // per worker, per chunk
  std::vector<std::vector<int>> op_task_;  // per worker, by op_slot: the compute task of an op
  std::vector<std::vector<int>> op_done_;  // per worker, by op_slot: the task after which its result is ready
  std::map<std::tuple<int, int, int, int>, std::vector<int>> pending_pulls_;
};

}  // namespace

Plan build_plan(const model::Cluster& cluster, const model::Network& network, const Layout& layout,
                const CostModel& cost) {
  Builder builder(cluster, network, layout, cost);
  return builder.build();
}

}  // namespace hetflow::partition
