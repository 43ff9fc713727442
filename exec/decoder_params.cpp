#include "exec/decoder_params.hpp"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <tuple>

#include "model/error.hpp"

namespace hetflow::exec {

DecoderShape decoder_shape(const model::TransformerConfig& c) {
  auto refuse = [&](const std::string& why) {
    throw PlanError("the network '" + c.name + "' cannot be trained with real math: " + why +
                    " (GPT-2 and LLaMA style decoders are covered; use --compute proxy for a FLOP-matched stand-in)");
  };
  if (c.encoder) refuse("it is an encoder");
  if (!c.unmodelled.empty()) refuse("its config asks for what the real layers leave out: " + c.unmodelled);
  if (c.mla.enabled()) refuse("its attention is latent (architecture.mla), which the real layers do not run yet");
  if (c.mtp_layers > 0) {
    refuse("it predicts tokens ahead (architecture.mtp_layers " + std::to_string(c.mtp_layers) +
           ", multi-token prediction), which the real layers do not run yet");
  }
  DecoderShape s;
  const bool gpt2 = !c.rms_norm && !c.gated_mlp && c.learned_positions && c.tied_embeddings;
  const bool llama = c.rms_norm && c.gated_mlp && !c.learned_positions && !c.biases;
  if (!gpt2 && !llama) {
    refuse("it mixes the families (GPT-2: LayerNorm, GELU, learned positions, tied head; LLaMA: RMSNorm, SwiGLU, "
           "rotary positions, no biases)");
  }
  s.family = gpt2 ? DecoderFamily::gpt2 : DecoderFamily::llama;
  s.layers = c.layers;
  s.C = c.hidden;
  s.NH = c.heads;
  s.NKV = c.kv_heads > 0 ? c.kv_heads : c.heads;
  s.HS = c.head_size();
  s.F = c.ffn > 0 ? c.ffn : 4 * c.hidden;
  s.V = c.vocab;
  s.S = c.seq;
  s.P = c.positions > 0 ? c.positions : c.seq;
  s.eps = static_cast<float>(c.norm_eps);
  s.tied = c.tied_embeddings;
  if (gpt2 && !c.biases) refuse("GPT-2 style layers here carry biases");
  if (gpt2 && s.NKV != s.NH) refuse("GPT-2 style attention has one key/value head per query head");
  if (gpt2 && s.HS * s.NH != s.C) refuse("GPT-2 style heads are hidden / heads wide, not head_dim " + std::to_string(s.HS));
  if (gpt2 && c.qk_norm) refuse("GPT-2 style attention has no QK-norm");
  if (llama && s.HS % 2 != 0) refuse("rotary positions need an even head size, found " + std::to_string(s.HS));
  if (llama) {
    // Partial rotary turns the first rotary_dims values of a head as a head of that size
    // (an even number from 2 to the head: model::check_partial_rotary).
    const int rotary = c.rotary_dims();
    s.rope = rope_frequencies(c.rope_theta, c.rope_scaling, s.S, rotary);
    if (rotary < s.HS) s.rope.rotary_dims = rotary;
  }
  if (c.sliding_window > 0 && c.sliding_window < s.S) s.window = c.sliding_window;
  s.qkv_bias = llama && c.attention_bias != model::TransformerConfig::AttentionBias::none;
  s.out_bias = llama && c.attention_bias == model::TransformerConfig::AttentionBias::qkvo;
  s.qk_norm = llama && c.qk_norm;
  if (gpt2 && !c.rope_scaling.type.empty()) refuse("GPT-2 style layers have learned positions, not rope_scaling");
  if (const model::MoeConfig& m = c.moe; m.experts > 0) {
    if (gpt2) refuse("its experts are SwiGLU MLPs, which the real layers run in LLaMA style blocks only");
    s.moe.E = m.experts;
    s.moe.K = m.experts_per_token;
    s.moe.FE = m.expert_ffn;
    s.moe.FS = m.shared_experts * m.shared_width();
    s.moe.normalize = m.normalize_top_k;
    s.moe.sigmoid = m.router == model::MoeConfig::Router::sigmoid;
    s.moe.groups = m.groups;
    s.moe.groups_chosen = m.groups_chosen;
    s.moe.scale = m.routed_scale;
    if (!s.moe.sigmoid && m.routed_scale != 1) {
      refuse("its softmax router's weights are scaled (routed_scaling_factor " + std::to_string(m.routed_scale) + ")");
    }
    s.moe.shared_gate = m.shared_expert_gate && s.moe.FS > 0;
    s.moe.aux_coef = m.aux_loss_coef;
    s.moe.per_sequence = m.sequence_aux_loss;
    s.moe.capacity_factor = m.capacity_factor;
    s.moe.first_dense = m.first_dense_layers;
    s.moe.every = m.every;
    s.moe.mixtral_names = m.tensor_names == model::MoeConfig::TensorNames::mixtral;
  }
  return s;
}

kernels::RopeFrequencies rope_frequencies(double theta, const model::RopeScaling& scaling, int seq, int head_dim) {
  using Scaling = kernels::RopeFrequencies::Scaling;
  kernels::RopeFrequencies r;
  r.theta = theta;
  r.factor = scaling.factor;
  if (scaling.type == "linear") {
    r.scaling = Scaling::linear;
  } else if (scaling.type == "llama3") {
    r.scaling = Scaling::llama3;
    r.low_freq_factor = scaling.low_freq_factor;
    r.high_freq_factor = scaling.high_freq_factor;
    r.original_positions = scaling.original_positions;
  } else if (scaling.type == "yarn") {
    r.scaling = Scaling::yarn;
    r.original_positions = scaling.original_positions;
    r.beta_fast = scaling.beta_fast;
    r.beta_slow = scaling.beta_slow;
    r.truncate = scaling.truncate;
    r.attention_factor = scaling.attention_factor;
  } else if (scaling.type == "dynamic") {
    // HuggingFace's dynamic NTK: plain RoPE up to the trained context L; a longer sequence of
    // T tokens raises the base to theta (factor T / L - (factor - 1))^(d / (d - 2)).
    r.factor = 1;
    if (seq > scaling.original_positions) {
      if (head_dim <= 2) {
        throw PlanError("dynamic rope_scaling beyond the trained context needs a head size above 2, found " +
                        std::to_string(head_dim));
      }
      const double d = head_dim;
      r.theta = theta * std::pow(scaling.factor * seq / scaling.original_positions - (scaling.factor - 1), d / (d - 2));
    }
  } else if (!scaling.type.empty()) {
    throw PlanError("rope_scaling type '" + scaling.type + "' is not one the real math covers");
  }
  if (!kernels::rope_frequencies_valid(r)) {
    throw PlanError("rope_scaling gives rotary frequencies that are not finite and positive (theta " +
                    std::to_string(r.theta) + ")");
  }
  return r;
}

namespace {

class Builder {
 public:
  explicit Builder(ChunkParams& p) : p_(p) {}
  int layer = 0;  // of the slots added next
  // Adds a slot of the whole `shape` (as files store it) holding `pieces` of its [out, in]
  // matrix (all of it when empty); returns its offset.
  size_t add(std::string name, std::vector<std::int64_t> shape, bool transposed = false, std::vector<Piece> pieces = {},
             bool tied_copy = false) {
    ParamSlot slot;
    slot.full_rows = shape.size() == 1 ? shape[0] : transposed ? shape[1] : shape[0];
    slot.full_cols = shape.size() == 1 ? 1 : transposed ? shape[0] : shape[1];
    slot.split = !pieces.empty();
    if (pieces.empty()) pieces.push_back({0, slot.full_rows, 0, slot.full_cols});
    slot.count = 0;
    for (const Piece& piece : pieces) slot.count += static_cast<size_t>(piece.rows * piece.cols);
    slot.pieces = std::move(pieces);
    slot.offset = p_.count;
    slot.decays = shape.size() >= 2;
    slot.transposed = transposed;
    slot.tied_copy = tied_copy;
    slot.layer = layer;
    slot.name = std::move(name);
    slot.shape = std::move(shape);
    p_.count += slot.count;
    p_.slots.push_back(std::move(slot));
    return p_.slots.back().offset;
  }
  size_t slots() const { return p_.slots.size(); }
  ParamSlot& slot(size_t i) { return p_.slots[i]; }

 private:
  ChunkParams& p_;
};

// [floor(n lo), floor(n hi)): the part of `n` units a SplitPart covers. Rank i of `parts`
// gets [n i / parts, n (i + 1) / parts) (the first ranges one shorter when they do not divide
// evenly), the same units as any other spelling of the same fractions.
std::pair<std::int64_t, std::int64_t> units(std::int64_t n, const SplitPart& part) { return partition::split_units(n, part); }

// A mixture of experts' parameters under HuggingFace's names (Mixtral's or Qwen-MoE's): the
// router and a shared expert's gate whole on every rank; each expert's SwiGLU, and the shared
// experts', split by its columns as a dense MLP (p's FE and FS ranges), whole on one rank.
void add_moe(Builder& b, const DecoderShape& s, const std::string& h, BlockParams& k, const std::vector<int>& experts,
             const ChunkParams& p) {
  const std::int64_t C = s.C, E = s.moe.E, FE = s.moe.FE, FS = s.moe.FS;
  const std::string m = h + (s.moe.mixtral_names ? "block_sparse_moe." : "mlp.");
  // This rank's rows of a column-parallel [F, C] and columns of a row-parallel [C, F] (all of
  // them on one rank: split slots still, as the dense MLP's, so that a part reduced between
  // ranks of different degrees finds its rows in either).
  const auto in_part = [&](std::int64_t first, std::int64_t n) { return std::vector<Piece>{{first, n, 0, C}}; };
  const auto out_part = [&](std::int64_t first, std::int64_t n) { return std::vector<Piece>{{0, C, first, n}}; };
  const auto fe = [&](bool down) { return down ? out_part(p.FE0, p.FE) : in_part(p.FE0, p.FE); };
  k.router_w = b.add(m + "gate.weight", {E, C});
  if (s.moe.sigmoid) {
    k.router_bias = b.add(m + "gate.e_score_correction_bias", {E});
    b.slot(b.slots() - 1).balancing = true;
  }
  k.expert_gate_w.assign(static_cast<size_t>(s.moe.E), BlockParams::npos);
  k.expert_up_w = k.expert_down_w = k.expert_gate_w;
  for (int e = 0; e < s.moe.E; ++e) {
    if (!experts.empty() && !std::binary_search(experts.begin(), experts.end(), e)) continue;
    const auto i = static_cast<size_t>(e);
    const std::string x = m + "experts." + std::to_string(e) + ".";
    if (s.moe.mixtral_names) {  // w1 the gate, w3 the up projection, w2 the down
      k.expert_gate_w[i] = b.add(x + "w1.weight", {FE, C}, false, fe(false));
      k.expert_down_w[i] = b.add(x + "w2.weight", {C, FE}, false, fe(true));
      k.expert_up_w[i] = b.add(x + "w3.weight", {FE, C}, false, fe(false));
    } else {
      k.expert_gate_w[i] = b.add(x + "gate_proj.weight", {FE, C}, false, fe(false));
      k.expert_up_w[i] = b.add(x + "up_proj.weight", {FE, C}, false, fe(false));
      k.expert_down_w[i] = b.add(x + "down_proj.weight", {C, FE}, false, fe(true));
    }
    for (size_t j = b.slots() - 3; j < b.slots(); ++j) b.slot(j).expert = e;
  }
  if (FS > 0) {  // Qwen2-MoE's one gated shared expert, or DeepSeek's shared experts as one MLP
    const std::string x = m + (s.moe.shared_gate ? "shared_expert." : "shared_experts.");
    k.shared_gate_w = b.add(x + "gate_proj.weight", {FS, C}, false, in_part(p.FS0, p.FS));
    k.shared_up_w = b.add(x + "up_proj.weight", {FS, C}, false, in_part(p.FS0, p.FS));
    k.shared_down_w = b.add(x + "down_proj.weight", {C, FS}, false, out_part(p.FS0, p.FS));
    if (s.moe.shared_gate) k.shared_scale_w = b.add(m + "shared_expert_gate.weight", {1, C});
  }
}

ChunkParams build_params(const DecoderShape& s, int layer_begin, int layer_end, int tp_rank, int tp, const SplitPart& part,
                         const std::vector<int>& experts = {}) {
  ChunkParams p;
  p.layer_begin = layer_begin;
  p.layer_end = layer_end;
  p.tp = tp;
  p.tp_rank = tp_rank;
  const auto [h0, h1] = units(s.NH, part);
  const auto [g0, g1] = units(s.NKV, part);
  if (h0 * part.lo_den != s.NH * part.lo_num || h1 * part.hi_den != s.NH * part.hi_num ||
      g0 * part.lo_den != s.NKV * part.lo_num || g1 * part.hi_den != s.NKV * part.hi_num) {
    throw PlanError("the part " + std::to_string(part.lo_num) + "/" + std::to_string(part.lo_den) + " to " +
                    std::to_string(part.hi_num) + "/" + std::to_string(part.hi_den) + " of the " + std::to_string(s.NH) +
                    " heads and " + std::to_string(s.NKV) + " key/value heads is not whole heads");
  }
  p.NH = static_cast<int>(h1 - h0);
  p.NKV = static_cast<int>(g1 - g0);
  const auto [f0, f1] = units(s.F, part);
  const auto [v0, v1] = units(s.V, part);
  p.F0 = static_cast<int>(f0);
  p.F = static_cast<int>(f1 - f0);
  p.V0 = static_cast<int>(v0);
  p.V = static_cast<int>(v1 - v0);
  const auto [e0, e1] = units(s.moe.FE, part);
  const auto [s0, s1] = units(s.moe.FS, part);
  p.FE0 = static_cast<int>(e0);
  p.FE = static_cast<int>(e1 - e0);
  p.FS0 = static_cast<int>(s0);
  p.FS = static_cast<int>(s1 - s0);
  Builder b(p);
  const bool gpt = s.family == DecoderFamily::gpt2;
  const std::int64_t C = s.C, F = s.F, V = s.V, P = s.P, HS = s.HS;
  const std::int64_t Q = static_cast<std::int64_t>(s.NH) * s.HS, KV = static_cast<std::int64_t>(s.NKV) * s.HS;
  // This rank's rectangles: rows of a column-parallel matrix, columns of a row-parallel one.
  const std::int64_t q0 = h0 * s.HS, qn = static_cast<std::int64_t>(p.NH) * s.HS;
  const std::int64_t kv0 = g0 * s.HS, kvn = static_cast<std::int64_t>(p.NKV) * s.HS;
  const auto rows = [](std::int64_t first, std::int64_t n, std::int64_t width) { return std::vector<Piece>{{first, n, 0, width}}; };
  const auto cols = [](std::int64_t first, std::int64_t n, std::int64_t height) { return std::vector<Piece>{{0, height, first, n}}; };
  const std::int64_t fn = p.F, vn = p.V;
  for (int l = layer_begin; l < layer_end; ++l) {
    p.layer_start.push_back(p.count);
    b.layer = l;
    if (l == 0) {
      p.has_embedding = true;
      p.wte = b.add(gpt ? "transformer.wte.weight" : "model.embed_tokens.weight", {V, C}, false, rows(v0, vn, C));
      if (gpt) p.wpe = b.add("transformer.wpe.weight", {P, C});
    } else if (l <= s.layers) {
      BlockParams k;
      const std::string i = std::to_string(l - 1);
      if (gpt) {
        const std::string h = "transformer.h." + i + ".";
        k.norm1_w = b.add(h + "ln_1.weight", {C});
        k.norm1_b = b.add(h + "ln_1.bias", {C});
        // c_attn is q|k|v along its output: [C, 3C] in files, three [C, C] matrices here.
        // This rank's heads of each of q, k and v: three row blocks of [3C, C].
        const std::vector<Piece> qkv{{q0, qn, 0, C}, {C + kv0, kvn, 0, C}, {2 * C + kv0, kvn, 0, C}};
        k.q_w = b.add(h + "attn.c_attn.weight", {C, 3 * C}, true, qkv);
        k.k_w = k.q_w + static_cast<size_t>(qn * C);
        k.v_w = k.k_w + static_cast<size_t>(kvn * C);
        k.q_b = b.add(h + "attn.c_attn.bias", {3 * C}, false, {{q0, qn, 0, 1}, {C + kv0, kvn, 0, 1}, {2 * C + kv0, kvn, 0, 1}});
        k.k_b = k.q_b + static_cast<size_t>(qn);
        k.v_b = k.k_b + static_cast<size_t>(kvn);
        k.o_w = b.add(h + "attn.c_proj.weight", {C, C}, true, cols(q0, qn, C));
        k.o_b = b.add(h + "attn.c_proj.bias", {C});
        k.norm2_w = b.add(h + "ln_2.weight", {C});
        k.norm2_b = b.add(h + "ln_2.bias", {C});
        k.up_w = b.add(h + "mlp.c_fc.weight", {C, F}, true, rows(f0, fn, C));
        k.up_b = b.add(h + "mlp.c_fc.bias", {F}, false, rows(f0, fn, 1));
        k.down_w = b.add(h + "mlp.c_proj.weight", {F, C}, true, cols(f0, fn, C));
        k.down_b = b.add(h + "mlp.c_proj.bias", {C});
      } else {
        const std::string h = "model.layers." + i + ".";
        k.norm1_w = b.add(h + "input_layernorm.weight", {C});
        k.q_w = b.add(h + "self_attn.q_proj.weight", {Q, C}, false, rows(q0, qn, C));
        k.k_w = b.add(h + "self_attn.k_proj.weight", {KV, C}, false, rows(kv0, kvn, C));
        k.v_w = b.add(h + "self_attn.v_proj.weight", {KV, C}, false, rows(kv0, kvn, C));
        if (s.qkv_bias) {  // this rank's heads' entries, as of the column-parallel weights
          k.q_b = b.add(h + "self_attn.q_proj.bias", {Q}, false, rows(q0, qn, 1));
          k.k_b = b.add(h + "self_attn.k_proj.bias", {KV}, false, rows(kv0, kvn, 1));
          k.v_b = b.add(h + "self_attn.v_proj.bias", {KV}, false, rows(kv0, kvn, 1));
        }
        k.o_w = b.add(h + "self_attn.o_proj.weight", {C, Q}, false, cols(q0, qn, C));
        if (s.out_bias) k.o_b = b.add(h + "self_attn.o_proj.bias", {C});  // whole: added once, after the sum
        if (s.qk_norm) {  // whole on every rank; each rank's heads add to their gradients
          k.q_norm_w = b.add(h + "self_attn.q_norm.weight", {HS});
          k.k_norm_w = b.add(h + "self_attn.k_norm.weight", {HS});
        }
        k.norm2_w = b.add(h + "post_attention_layernorm.weight", {C});
        if (s.moe.layer(l - 1)) {
          add_moe(b, s, h, k, experts, p);
        } else {
          k.gate_w = b.add(h + "mlp.gate_proj.weight", {F, C}, false, rows(f0, fn, C));
          k.up_w = b.add(h + "mlp.up_proj.weight", {F, C}, false, rows(f0, fn, C));
          k.down_w = b.add(h + "mlp.down_proj.weight", {C, F}, false, cols(f0, fn, C));
        }
      }
      p.blocks.push_back(k);
    } else {
      p.has_head = true;
      p.final_norm_w = b.add(gpt ? "transformer.ln_f.weight" : "model.norm.weight", {C});
      if (gpt) p.final_norm_b = b.add("transformer.ln_f.bias", {C});
      if (!s.tied) {
        p.head_w = b.add("lm_head.weight", {V, C}, false, rows(v0, vn, C));
        p.head_slot = p.slots.size() - 1;
      } else if (!p.has_embedding) {
        // Megatron's copy on the last stage, kept equal by the embedding all-reduce.
        p.head_w = b.add(gpt ? "transformer.wte.weight" : "model.embed_tokens.weight", {V, C}, false, rows(v0, vn, C), true);
        p.head_slot = p.slots.size() - 1;
      } else {
        p.head_w = p.wte;
        p.head_slot = 0;
      }
    }
  }
  p.layer_start.push_back(p.count);
  return p;
}

}  // namespace

ChunkParams chunk_params(const DecoderShape& s, int layer_begin, int layer_end, int tp_rank, int tp,
                         const std::vector<int>& experts) {
  if (tp < 1 || s.NKV % tp != 0) {
    throw PlanError("a tensor-parallel degree of " + std::to_string(tp) + " does not divide the " + std::to_string(s.NKV) +
                    " key/value heads");
  }
  for (int l = std::max(layer_begin, 1); tp > 1 && l < layer_end && l <= s.layers; ++l) {
    if (s.moe.layer(l - 1) && (s.moe.FE < tp || (s.moe.FS > 0 && s.moe.FS < tp))) {
      throw PlanError("layer " + std::to_string(l) + " is a mixture of experts whose experts are " +
                      std::to_string(s.moe.FE) + " columns wide (shared " + std::to_string(s.moe.FS) +
                      "): a tensor-parallel degree of " + std::to_string(tp) + " leaves a rank none");
    }
  }
  return build_params(s, layer_begin, layer_end, tp_rank, tp, SplitPart{tp_rank, tp, tp_rank + 1, tp}, experts);
}

ChunkParams chunk_params_part(const DecoderShape& s, int layer_begin, int layer_end, SplitPart part) {
  return build_params(s, layer_begin, layer_end, 0, 1, part);
}

namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (const char c : s) h = (h ^ static_cast<unsigned char>(c)) * 0x100000001b3ULL;
  return h;
}

// A standard normal value for (key, index): Box-Muller on two counter-based uniforms.
double normal(std::uint64_t key, std::uint64_t index) {
  const auto uniform = [&](std::uint64_t k) {
    return (static_cast<double>(splitmix64(key ^ splitmix64(k)) >> 11) + 0.5) * 0x1.0p-53;
  };
  const double u1 = uniform(2 * index), u2 = uniform(2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2);
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

void init_params(const ChunkParams& params, const DecoderShape& shape, std::uint64_t seed, float* data) {
  const double residual_std = 0.02 / std::sqrt(2.0 * shape.layers);
  for (const ParamSlot& slot : params.slots) {
    float* out = data + slot.offset;
    if (slot.shape.size() < 2) {  // norm gains 1, everything else (biases, norm shifts) 0
      const bool gain = ends_with(slot.name, "norm.weight") || ends_with(slot.name, "layernorm.weight") ||
                        ends_with(slot.name, "ln_1.weight") || ends_with(slot.name, "ln_2.weight") ||
                        ends_with(slot.name, "ln_f.weight");
      std::fill(out, out + slot.count, gain ? 1.0f : 0.0f);
      continue;
    }
    const bool residual = ends_with(slot.name, "c_proj.weight") || ends_with(slot.name, "o_proj.weight") ||
                          ends_with(slot.name, "down_proj.weight") || ends_with(slot.name, ".w2.weight");
    const double std = residual ? residual_std : 0.02;
    const std::uint64_t key = splitmix64(seed ^ fnv1a(slot.name));
    // Element (r, c) of the whole [out, in] matrix draws index r * cols + c: a rank's share
    // holds the same values as that part of the whole.
    for (const Piece& piece : slot.pieces) {
      for (std::int64_t r = piece.row; r < piece.row + piece.rows; ++r) {
        for (std::int64_t c = piece.col; c < piece.col + piece.cols; ++c) {
          *out++ = static_cast<float>(std * normal(key, static_cast<std::uint64_t>(r * slot.full_cols + c)));
        }
      }
    }
  }
}

std::vector<FloatRun> runs_of_part(const ChunkParams& mine, const ChunkParams& part,
                                   const std::function<bool(size_t slot)>& use) {
  if (mine.slots.size() != part.slots.size()) throw PlanError("a split part of other layers than its chunk's");
  std::vector<FloatRun> runs;
  const auto add = [&runs](size_t at, size_t count, bool replicated) {
    if (count == 0) return;
    if (!runs.empty() && runs.back().at + runs.back().count == at && runs.back().replicated == replicated) {
      runs.back().count += count;
    } else {
      runs.push_back({at, count, replicated});
    }
  };
  for (size_t i = 0; i < mine.slots.size(); ++i) {
    if (!use(i)) continue;
    const ParamSlot& held = mine.slots[i];
    if (!held.split) {
      add(held.offset, held.count, true);
      continue;
    }
    for (const Piece& r : part.slots[i].pieces) {
      if (r.rows * r.cols == 0) continue;
      size_t at = held.offset;  // where the holding piece starts
      const Piece* in = nullptr;
      for (const Piece& p : held.pieces) {
        if (p.row <= r.row && r.row + r.rows <= p.row + p.rows && p.col <= r.col && r.col + r.cols <= p.col + p.cols) {
          in = &p;
          break;
        }
        at += static_cast<size_t>(p.rows * p.cols);
      }
      if (in == nullptr) throw PlanError("rank " + std::to_string(mine.tp_rank) + " of " + std::to_string(mine.tp) +
                                         " does not hold the part of " + held.name + " it is asked to reduce");
      for (std::int64_t row = r.row; row < r.row + r.rows; ++row) {
        add(at + static_cast<size_t>((row - in->row) * in->cols + (r.col - in->col)), static_cast<size_t>(r.cols), false);
      }
    }
  }
  return runs;
}

std::vector<FloatRun> slice_runs(const std::vector<FloatRun>& runs, size_t from, size_t to) {
  std::vector<FloatRun> out;
  size_t at = 0;  // of the concatenation, where the run starts
  for (const FloatRun& run : runs) {
    const size_t b = std::max(from, at), e = std::min(to, at + run.count);
    if (b < e) out.push_back({run.at + (b - at), e - b, run.replicated});
    at += run.count;
  }
  return out;
}

size_t floats_of(const std::vector<FloatRun>& runs) {
  size_t n = 0;
  for (const FloatRun& run : runs) n += run.count;
  return n;
}

namespace {

// Where element (r, c) of the [out, in] matrix sits in the file's layout.
size_t file_index(const ParamSlot& slot, std::int64_t r, std::int64_t c) {
  return static_cast<size_t>(slot.transposed ? c * slot.full_rows + r : r * slot.full_cols + c);
}

}  // namespace

std::vector<float> shard_of(const ParamSlot& slot, const float* file_tensor) {
  std::vector<float> out;
  out.reserve(slot.count);
  for (const Piece& piece : slot.pieces) {
    for (std::int64_t r = piece.row; r < piece.row + piece.rows; ++r) {
      for (std::int64_t c = piece.col; c < piece.col + piece.cols; ++c) out.push_back(file_tensor[file_index(slot, r, c)]);
    }
  }
  return out;
}

void place_shard(const ParamSlot& slot, const float* shard, float* file_tensor) {
  for (const Piece& piece : slot.pieces) {
    for (std::int64_t r = piece.row; r < piece.row + piece.rows; ++r) {
      for (std::int64_t c = piece.col; c < piece.col + piece.cols; ++c) file_tensor[file_index(slot, r, c)] = *shard++;
    }
  }
}

bool has_routed_experts(const ChunkParams& p, int begin, int end) {
  for (const ParamSlot& slot : p.slots) {
    if (slot.expert >= 0 && slot.layer >= begin && slot.layer < end) return true;
  }
  return false;
}

std::vector<FloatRun> expert_piece_runs(const ChunkParams& p, int begin, int end, bool routed) {
  std::vector<FloatRun> runs;
  for (const ParamSlot& slot : p.slots) {
    if (slot.layer < begin || slot.layer >= end || (slot.expert >= 0) != routed || slot.count == 0) continue;
    if (!runs.empty() && runs.back().at + runs.back().count == slot.offset) {
      runs.back().count += slot.count;
    } else {
      runs.push_back({slot.offset, slot.count, false});
    }
  }
  return runs;
}

}  // namespace hetflow::exec
