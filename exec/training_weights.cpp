// exec::Training's results: the losses, and the weights gathered from every rank into one
// file at rank 0.
#include "exec/training.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <sstream>

#include "exec/plan_tensors.hpp"
#include "kernels/transformer.hpp"
#include "model/error.hpp"
#include "model/units.hpp"

namespace hetflow::exec {

using partition::TaskKind;
using partition::TensorKind;
using Floats = std::vector<float>;

std::vector<double> Training::losses() const {
  return log_->losses(static_cast<double>(feed_->global_batch()) * shape_.S);
}

std::vector<double> Training::balance_losses() const { return log_->balance_losses(); }

SafetensorsFile Training::weights() const {
  SafetensorsFile file;
  struct Held {
    int tp_rank = 0;
    const ChunkParams* params = nullptr;
    const float* values = nullptr;
    int worker = 0;
  };
  // Virtual worker 0's chunks, per stage, its ranks in order; under expert parallelism its
  // expert group's too (the others' routed experts).
  std::map<int, std::vector<Held>> stages;
  std::vector<std::vector<float>> host;     // their parameters, out of their devices' memory
  host.reserve(chunks_.size() + remote_chunks_.size());
  const int ep = plan_.layout.experts.parallel;
  for (const auto& c : chunks_) {
    if (c->worker != 0 && (ep == 1 || c->math.experts().size == 1 || c->worker >= ep)) continue;
    host.push_back(c->host_params());
    fill_from_shards(c->stage, c->tp_rank, c->math.experts().rank, host.back());  // (ZeRO: what other replicas own)
    stages[c->stage].push_back({c->tp_rank, &c->math.params(), host.back().data(), c->worker});
  }
  for (const RemoteChunk& c : remote_chunks_) {
    host.push_back(c.values);
    fill_from_shards(c.stage, c.tp_rank, c.expert_rank, host.back());
    stages[c.stage].push_back({c.tp_rank, &c.params, host.back().data(), c.worker});
  }
  // Under a parameter server the servers hold the latest weights (workers adopt them a step later).
  const std::map<std::string, const float*> served = servers_ ? servers_->weights() : std::map<std::string, const float*>{};
  for (auto& [stage, ranks] : stages) {
    std::sort(ranks.begin(), ranks.end(),
              [](const Held& a, const Held& b) { return std::pair{a.worker, a.tp_rank} < std::pair{b.worker, b.tp_rank}; });
    if (ranks.back().worker > 0) {  // an expert group's: each tensor from a worker that holds it
      const ChunkParams whole = chunk_params(shape_, ranks.front().params->layer_begin, ranks.front().params->layer_end);
      std::map<std::string, std::vector<std::pair<const Held*, const ParamSlot*>>> holders;  // by name
      for (const Held& held : ranks) {
        for (const ParamSlot& mine : held.params->slots) {
          if (mine.expert >= 0 || held.worker == 0) holders[mine.name].emplace_back(&held, &mine);  // (the rest: worker 0's)
        }
      }
      for (const ParamSlot& slot : whole.slots) {
        if (slot.tied_copy) continue;
        size_t elements = 1;
        for (const auto n : slot.shape) elements *= static_cast<size_t>(n);
        NamedTensor t{slot.name, slot.shape, Floats(elements, 0.0f)};
        for (const auto& [held, mine] : holders[slot.name]) place_shard(*mine, held->values + mine->offset, t.data.data());
        file.tensors.push_back(std::move(t));
      }
      continue;
    }
    const auto& slots = ranks.front().params->slots;
    for (size_t i = 0; i < slots.size(); ++i) {
      const ParamSlot& slot = slots[i];
      if (slot.tied_copy) continue;
      size_t elements = 1;
      for (const auto n : slot.shape) elements *= static_cast<size_t>(n);
      NamedTensor t{slot.name, slot.shape, Floats(elements, 0.0f)};
      if (auto s = served.find(slot.name); parameter_server_ && s != served.end()) {
        // The server's whole parameter: a rank's slot with the whole tensor as its one piece.
        ParamSlot whole = slot;
        whole.count = static_cast<size_t>(slot.full_rows * slot.full_cols);
        whole.pieces = {Piece{0, slot.full_rows, 0, slot.full_cols}};
        place_shard(whole, s->second, t.data.data());
      } else {
        for (const Held& held : ranks) {
          const ParamSlot& mine = held.params->slots[i];
          place_shard(mine, held.values + mine.offset, t.data.data());
        }
      }
      file.tensors.push_back(std::move(t));
    }
  }
  file.metadata["format"] = "pt";
  file.metadata["producer"] = "hetflow";
  return file;
}

void Training::collect_at_root() {
  if (ranks_ == nullptr) return;
  std::vector<std::byte> mine;
  {
    std::lock_guard lock(mutex_);
    put(mine, std::uint64_t{1});  // the losses, balance losses and skipped steps it logged
    log_->save(mine);
    for (const auto& c : chunks_) {  // worker 0's, and under expert parallelism its expert group's
      const int rank = c->math.experts().rank;
      if (c->worker != 0 && (c->math.experts().size == 1 || c->worker >= c->math.experts().size)) continue;
      put(mine, std::uint64_t{2});
      for (const int v : {c->stage, c->tp_rank, c->tp, c->math.params().layer_begin, c->math.params().layer_end,
                          c->worker, rank}) {
        put(mine, v);
      }
      const std::vector<float> values = c->host_params();
      put(mine, static_cast<std::uint64_t>(values.size()));
      for (const float v : values) put(mine, v);
    }
    for (const auto& c : chunks_) {  // ZeRO: the shards of the other replicas, which rank 0's weights() takes
      if (c->worker == 0) continue;
      for (const auto& [a, b] : c->owned) {
        put(mine, std::uint64_t{5});
        for (const int v : {c->stage, c->tp_rank, c->math.experts().rank}) put(mine, v);
        put(mine, static_cast<std::uint64_t>(a));
        std::vector<float> values(b - a);
        c->ops().download(values.data(), c->params.data() + a, b - a);
        put(mine, static_cast<std::uint64_t>(values.size()));
        for (const float v : values) put(mine, v);
      }
    }
    if (servers_) {
      put(mine, std::uint64_t{3});  // its servers' weights
      servers_->save(mine);
    }
  }
  const auto all = ranks_->gather(mine);
  if (ranks_->rank() != 0) return;
  std::lock_guard lock(mutex_);
  for (size_t r = 1; r < all.size(); ++r) {
    ByteReader in(all[r]);
    while (!in.done()) {
      const auto kind = in.get<std::uint64_t>();
      if (kind == 1) {
        log_->merge(in);
      } else if (kind == 2) {
        RemoteChunk c;
        c.stage = in.get<int>();
        c.tp_rank = in.get<int>();
        const int tp = in.get<int>(), begin = in.get<int>(), end = in.get<int>();
        c.worker = in.get<int>();
        c.expert_rank = in.get<int>();
        const int ep = plan_.layout.experts.parallel;
        c.params = chunk_params(shape_, begin, end, c.tp_rank, tp,
                                ep > 1 ? ExpertGroup{ep, c.expert_rank, expert_placement_}.held(shape_.moe.E)
                                       : std::vector<int>{});
        c.values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
        in.get_into(std::span<float>(c.values));
        if (c.values.size() != c.params.count) throw Error("rank " + std::to_string(r) + " sent a chunk of the wrong size");
        remote_chunks_.push_back(std::move(c));
      } else if (kind == 5) {
        RemoteShard shard;
        shard.stage = in.get<int>();
        shard.tp_rank = in.get<int>();
        shard.expert_rank = in.get<int>();
        shard.offset = static_cast<size_t>(in.get<std::uint64_t>());
        shard.values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
        in.get_into(std::span<float>(shard.values));
        remote_shards_.push_back(std::move(shard));
      } else if (kind == 3) {
        servers_->merge(in);
      } else {
        throw Error("rank " + std::to_string(r) + " sent an unknown record of its training");
      }
    }
  }
}

void Training::fill_from_shards(int stage, int tp_rank, int expert_rank, std::vector<float>& values) const {
  if (zero_stage_ == 0) return;
  for (const auto& c : chunks_) {
    if (c->worker == 0 || c->stage != stage || c->tp_rank != tp_rank || c->math.experts().rank != expert_rank) continue;
    for (const auto& [a, b] : c->owned) c->ops().download(values.data() + a, c->params.data() + a, b - a);
  }
  for (const RemoteShard& r : remote_shards_) {
    if (r.stage != stage || r.tp_rank != tp_rank || r.expert_rank != expert_rank) continue;
    if (r.offset + r.values.size() > values.size()) throw Error("a rank sent a shard beyond its chunk's parameters");
    std::copy(r.values.begin(), r.values.end(), values.begin() + static_cast<std::ptrdiff_t>(r.offset));
  }
}

}  // namespace hetflow::exec
