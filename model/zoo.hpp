#pragma once
// The model zoo: networks built from their architecture (shapes -> FLOPs, params, bytes),
// never from hard-coded totals.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "model/network.hpp"

namespace hetflow::model {

// Throws InputError (file "<spec>") naming the first field that is not usable.
void check_transformer_config(const TransformerConfig& config);
// The same architecture with a head_dim of hidden / heads and a position table of seq rows
// written as their default (0): one architecture, one spelling (and one plan fingerprint).
TransformerConfig canonical(TransformerConfig config);

// The families' layer flags and vocabularies, shapes left zero: GPT-2/GPT-3 style (LayerNorm,
// GELU, biases, learned positions, tied head, vocabulary 50257, seq 2048) and LLaMA style
// (RMSNorm, SwiGLU, no biases, rotary positions, untied head, vocabulary 32000, seq 4096).
TransformerConfig gpt_family();
TransformerConfig llama_family();
// The same for its rope_scaling alone (fields "rope_scaling.<key>"), which it includes.
void check_rope_scaling(const RopeScaling& scaling);
// The same for its mixture-of-experts (fields "moe.<key>") and latent-attention ("mla.<key>")
// settings alone, which it includes.
void check_moe(const TransformerConfig& config);
void check_mla(const TransformerConfig& config);
// The same for its partial_rotary_factor (field "partial_rotary_factor"): in (0, 1], and below
// 1 only for heads with rotary positions that keep an even number of rotary values.
void check_partial_rotary(const TransformerConfig& config);

// Layers: "embedding", then `layers` x "transformer", then "head" (final norm + LM/MLM head).
Network make_transformer(const TransformerConfig& config, Precision precision);

// ResNet-50/101/152 (bottleneck blocks) for 224x224 images, 1000 classes. One layer per stem,
// bottleneck block and classifier.
Network make_resnet(int depth, Precision precision);
// VGG-19 for 224x224 images, 1000 classes. One layer per convolution and fully connected layer
// (pooling folded into the convolution that precedes it).
Network make_vgg19(Precision precision);

struct ZooEntry {
  std::string name;
  std::string description;
  bool is_template = false;  // a spec pattern ("gpt:layers=L,..."), not a network name
};
// Every named network, in a stable order, for `hetflow list`.
std::vector<ZooEntry> zoo_entries();

// A named network ("gpt3-175b"), or a decoder spec "gpt:layers=24,hidden=1024,heads=16,seq=2048"
// (optional keys: ffn, vocab, kv_heads, head_dim). Throws InputError (file "<spec>") when unknown or
// malformed, naming the nearest known names.
Network network_from_spec(std::string_view spec, Precision precision);
bool is_zoo_spec(std::string_view spec);

// The transformer config of a zoo decoder by name; nullptr when it is not one.
const TransformerConfig* zoo_transformer(std::string_view name);

// A HuggingFace-style config.json (GPT-2: n_layer, n_embd, n_head, n_positions, vocab_size;
// LLaMA/Mistral/Qwen2: num_hidden_layers, hidden_size, num_attention_heads,
// num_key_value_heads, intermediate_size, max_position_embeddings, vocab_size, RoPE and window
// settings) read as a decoder, in hf_config.cpp. `text` is the file's content; errors name `file`.
TransformerConfig transformer_from_hf_config(const std::string& text, const std::string& file);
// The key of such a config.json that gave the sequence length ("max_position_embeddings",
// "n_positions" or "n_ctx"), or "" when none is there (the model type's default was taken).
// This is the longest context the model supports, rarely the length it is trained at.
std::string hf_config_sequence_key(const std::string& text, const std::string& file);
// A tokenizer_config.json's model_max_length: the longest input its tokenizer makes (it
// truncates there), an upper bound on what a model is trained at. None when the key is
// absent or null, or past any length a model runs at (transformers writes VERY_LARGE_INTEGER,
// int(1e30), for "no limit"); an InputError when it is not a whole number of tokens.
std::optional<int> hf_tokenizer_max_length(const std::string& text, const std::string& file);
// The sequence length a HuggingFace model is planned at when none is given: the config's
// (`config`'s seq; `key` says where it came from, "" for the model type's default) capped
// by the tokenizer's limit, or the tokenizer's limit where the config gives none. `config`
// is changed in place; a learned position table keeps its rows.
void apply_tokenizer_max_length(TransformerConfig& config, const std::string& key, std::optional<int> tokenizer_max);

}  // namespace hetflow::model
