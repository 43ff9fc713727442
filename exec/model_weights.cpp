#include "exec/model_weights.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "model/error.hpp"

namespace hetflow::exec {

ModelWeights::ModelWeights(const DecoderShape& shape, int expert_parallel, std::vector<int> expert_placement,
                           std::vector<int> expert_group)
    : shape_(shape),
      expert_parallel_(expert_parallel),
      expert_placement_(std::move(expert_placement)),
      expert_group_(expert_group.empty() ? std::vector<int>{0} : std::move(expert_group)) {}

bool ModelWeights::in_file(const ChunkState& c) const {
  if (c.worker == 0) return true;
  if (expert_parallel_ == 1 || c.math.experts().size == 1) return false;
  return std::find(expert_group_.begin(), expert_group_.end(), c.worker) != expert_group_.end();
}

namespace {
enum Record : std::uint64_t { chunk = 1, shard = 2, end = 3 };

const OpsFloats& array_of(const ChunkState& c, ModelWeights::Array which) {
  switch (which) {
    case ModelWeights::Array::exp_avg: return c.m;
    case ModelWeights::Array::exp_avg_sq: return c.v;
    case ModelWeights::Array::params: break;
  }
  return c.params;
}

// f(slot, at, n) for each run [at, at + n) of c's flat arrays that c owns under ZeRO, cut at
// its slots' bounds (tied copies left out); nothing when it is not sharded.
template <class F>
void each_owned_run(const ChunkState& c, F&& f) {
  if (c.owned.empty()) return;
  for (const ParamSlot& slot : c.math.params().slots) {
    if (slot.tied_copy) continue;
    const size_t begin = slot.offset, end = slot.offset + slot.count;
    for (const auto& [a, b] : c.owned) {
      const size_t lo = std::max(a, begin), hi = std::min(b, end);
      if (hi > lo) f(slot, lo, hi - lo);
    }
  }
}

constexpr ModelWeights::Array kArrays[] = {ModelWeights::Array::params, ModelWeights::Array::exp_avg,
                                           ModelWeights::Array::exp_avg_sq};
}  // namespace

void ModelWeights::save(const std::vector<std::unique_ptr<ChunkState>>& chunks, std::vector<std::byte>& out,
                        bool moments) const {
  const size_t arrays = moments ? 3 : 1;
  for (const auto& c : chunks) {  // worker 0's, and under expert parallelism its expert group's
    const int rank = c->math.experts().rank;
    if (!in_file(*c)) continue;
    put(out, std::uint64_t{Record::chunk});
    for (const int v : {c->stage, c->tp_rank, c->tp, c->math.params().layer_begin, c->math.params().layer_end,
                        c->worker, rank}) {
      put(out, v);
    }
    put(out, static_cast<std::uint64_t>(arrays));
    for (size_t k = 0; k < arrays; ++k) {
      put_counted(out, std::span<const float>(c->host_whole(array_of(*c, kArrays[k]))));
    }
  }
  for (const auto& c : chunks) {  // ZeRO: the shards of the other replicas, which rank 0's file takes
    if (c->worker == 0) continue;
    for (size_t k = 0; k < arrays; ++k) {
      const OpsFloats& array = array_of(*c, kArrays[k]);
      each_owned_run(*c, [&](const ParamSlot& slot, size_t at, size_t n) {
        put(out, std::uint64_t{Record::shard});
        for (const int v : {c->stage, c->tp_rank, static_cast<int>(k)}) put(out, v);
        put_string(out, slot.name);
        put(out, static_cast<std::uint64_t>(at - slot.offset));
        std::vector<float> values(n);
        c->ops().download(values.data(), array.data() + c->index_in(array, at), n);
        put_counted(out, std::span<const float>(values));
      });
    }
  }
  put(out, std::uint64_t{Record::end});
}

void ModelWeights::forget_merged() {
  chunks_.clear();
  shards_.clear();
}

void ModelWeights::merge(ByteReader& in, int rank) {
  for (;;) {
    const auto kind = in.get<std::uint64_t>();
    if (kind == Record::end) return;
    if (kind == Record::chunk) {
      Chunk c;
      c.stage = in.get<int>();
      c.tp_rank = in.get<int>();
      const int tp = in.get<int>(), begin = in.get<int>(), end = in.get<int>();
      c.worker = in.get<int>();
      c.expert_rank = in.get<int>();
      const int ep = expert_parallel_;
      c.params = chunk_params(shape_, begin, end, c.tp_rank, tp,
                              ep > 1 ? ExpertGroup{ep, c.expert_rank, expert_placement_}.held(shape_.moe.E)
                                     : std::vector<int>{});
      const auto arrays = in.get<std::uint64_t>();
      if (arrays != 1 && arrays != 3) throw Error("rank " + std::to_string(rank) + " sent a chunk of " + std::to_string(arrays) + " arrays");
      for (size_t k = 0; k < arrays; ++k) {
        std::vector<float>& values = c.values[k];
        values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
        in.get_into(std::span<float>(values));
        if (values.size() != c.params.count) throw Error("rank " + std::to_string(rank) + " sent a chunk of the wrong size");
      }
      chunks_.push_back(std::move(c));
    } else if (kind == Record::shard) {
      Shard shard;
      shard.stage = in.get<int>();
      shard.tp_rank = in.get<int>();
      shard.array = in.get<int>();
      if (shard.array < 0 || shard.array > 2) throw Error("rank " + std::to_string(rank) + " sent a shard of no array");
      shard.name = in.get_string();
      shard.offset = static_cast<size_t>(in.get<std::uint64_t>());
      shard.values.resize(static_cast<size_t>(in.get<std::uint64_t>()));
      in.get_into(std::span<float>(shard.values));
      shards_.push_back(std::move(shard));
    } else {
      throw Error("rank " + std::to_string(rank) + " sent an unknown record of its weights");
    }
  }
}

SafetensorsFile ModelWeights::file(const std::vector<std::unique_ptr<ChunkState>>& chunks,
                                   const std::map<std::string, const float*>& served, Array which) const {
  const auto k = static_cast<size_t>(which);
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
  host.reserve(chunks.size() + chunks_.size());
  for (const auto& c : chunks) {
    if (!in_file(*c)) continue;
    host.push_back(c->host_whole(array_of(*c, which)));
    fill_from_shards(chunks, c->stage, c->tp_rank, c->math.params(), which, host.back());  // (ZeRO: what other replicas own)
    stages[c->stage].push_back({c->tp_rank, &c->math.params(), host.back().data(), c->worker});
  }
  for (const Chunk& c : chunks_) {
    if (c.values[k].size() != c.params.count) throw Error("another rank's chunk came without its optimizer moments");
    host.push_back(c.values[k]);
    fill_from_shards(chunks, c.stage, c.tp_rank, c.params, which, host.back());
    stages[c.stage].push_back({c.tp_rank, &c.params, host.back().data(), c.worker});
  }
  // A parameter a server holds whole (its latest weights): placed from there; false if none does.
  const auto place_served = [&served](const ParamSlot& slot, float* into) {
    const auto s = served.find(slot.name);
    if (s == served.end()) return false;
    ParamSlot whole = slot;  // (a rank's slot with the whole tensor as its one piece)
    whole.count = static_cast<size_t>(slot.full_rows * slot.full_cols);
    whole.pieces = {Piece{0, slot.full_rows, 0, slot.full_cols}};
    place_shard(whole, s->second, into);
    return true;
  };
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
        NamedTensor t{slot.name, slot.shape, std::vector<float>(elements, 0.0f)};
        if (!place_served(slot, t.data.data())) {
          for (const auto& [held, mine] : holders[slot.name]) place_shard(*mine, held->values + mine->offset, t.data.data());
        }
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
      NamedTensor t{slot.name, slot.shape, std::vector<float>(elements, 0.0f)};
      if (!place_served(slot, t.data.data())) {
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

void ModelWeights::fill_from_shards(const std::vector<std::unique_ptr<ChunkState>>& chunks, int stage, int tp_rank,
                                    const ChunkParams& params, Array which, std::vector<float>& values) const {
  // By name: replicas of different expert ranks lay their arrays out differently (each its
  // own experts) and shard the parameters they share, so an offset means nothing between them.
  std::map<std::string, const ParamSlot*> slot_of;
  for (const ParamSlot& slot : params.slots) {
    if (!slot.tied_copy) slot_of[slot.name] = &slot;
  }
  const auto place = [&](const std::string& name, size_t offset, size_t n) -> float* {
    const auto found = slot_of.find(name);
    if (found == slot_of.end()) return nullptr;  // (another expert rank's expert)
    if (offset + n > found->second->count) throw Error("a replica's shard of " + name + " lies beyond it");
    return values.data() + found->second->offset + offset;
  };
  for (const auto& c : chunks) {
    if (c->worker == 0 || c->stage != stage || c->tp_rank != tp_rank) continue;
    const OpsFloats& array = array_of(*c, which);
    each_owned_run(*c, [&](const ParamSlot& slot, size_t at, size_t n) {
      if (float* to = place(slot.name, at - slot.offset, n)) c->ops().download(to, array.data() + c->index_in(array, at), n);
    });
  }
  for (const Shard& r : shards_) {
    if (r.stage != stage || r.tp_rank != tp_rank || r.array != static_cast<int>(which)) continue;
    if (float* to = place(r.name, r.offset, r.values.size())) std::copy(r.values.begin(), r.values.end(), to);
  }
}

}  // namespace hetflow::exec
