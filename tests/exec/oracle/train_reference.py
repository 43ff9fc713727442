#!/usr/bin/python3
"""Reference trainer for GPT-2 and LLaMA style decoders: the test oracle for hetflow's executor.

An independent FP32 PyTorch implementation of the training math that hetflow's CPU executor
runs (forward, backward, AdamW), written from the published model definitions and not from
hetflow's code. It reads a HuggingFace-style config.json, initial weights in safetensors with
HuggingFace's tensor names, and a token file in llm.c's format; it trains K steps on the whole
global batch and writes the final weights (safetensors, FP32, HuggingFace names) and the loss
of every step (JSON). Nothing but torch, numpy and the standard library is used: safetensors
is read and written here.

Calls:
  train_reference.py --config C.json --make-init OUT.safetensors [--seed S]
  train_reference.py --config C.json --make-tokens OUT.bin --num-tokens N [--seed S] [--token-format llama-3]
  train_reference.py --config C.json --init W.safetensors --tokens T.bin --batch B --seq T
                     --steps K --lr LR [--adam-beta1 0.9] [--adam-beta2 0.999]
                     [--adam-eps 1e-8] [--weight-decay 0] [--clip-grad 0] [--threads 1] [--float64]
                     [--lr-decay-style constant|linear|cosine|inverse-square-root]
                     [--lr-warmup-iters 0] [--lr-decay-iters K] [--min-lr 0]
                     [--out-weights OUT.safetensors] [--out-losses OUT.json] [--out-moments DIR]
  train_reference.py --config C.json --bench-steps N --batch B --seq T [--init W] [--tokens T]
                     [--threads N] [--lr LR]
  train_reference.py --self-test

Exit status: 0 on success (self-test: every check passed), 1 on a failed check, 2 on bad input.
See README.md beside this file for the conventions it fixes.
"""

import argparse
import json
import math
import os
import statistics
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
import torch.nn.functional as F

TOKENS_MAGIC = 20240520  # llm.c's GPT-2 files: version 1, uint16 tokens
TOKENS_VERSION = 1
TOKENS_HEADER_INTS = 256
# llm.c's LLaMA 3 files (dev/data/data_common.py's "llama-3"): version 7, uint32 tokens.
TOKEN_FORMATS = {TOKENS_MAGIC: (TOKENS_VERSION, "<u2"), 20240801: (7, "<u4")}


class InputError(Exception):
    """Bad input (config, weights, token file, options): reported and exit status 2."""


# ----------------------------------------------------------------------------------------------
# Config


class Config:
    """The fields of a HuggingFace config.json that the two model families need."""

    def __init__(self, d):
        if not isinstance(d, dict):
            raise InputError("config: not a JSON object")
        self.model_type = d.get("model_type")
        self.window = 0  # sliding-window attention: keys per query (Mistral); 0 none
        self.rope_scaling = None  # LLaMA's rope_scaling, with its type as "kind"; None: plain RoPE
        # LLaMA's attention biases: q, k and v (Qwen2, LLaMA's attention_bias) and o (LLaMA's).
        self.qkv_bias = self.o_bias = False
        self.qk_norm = False  # Qwen3: q and k RMS-normalised per head (gains of head_dim) before RoPE
        self.partial_rotary = 1.0  # the fraction of each head that RoPE turns (GLM-4.5's partial_rotary_factor)
        eps_default = 1e-6  # LlamaConfig's, MistralConfig's and Qwen2Config's
        self.moe = None  # a mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE, GLM-4.5): Config.read_moe's dict
        moe_type = self.model_type if self.model_type in ("mixtral", "qwen2_moe", "qwen3_moe", "glm4_moe") else None
        if moe_type:  # their attention is Mistral's, Qwen2's, Qwen3's and (GLM-4.5) LLaMA's
            self.model_type = {"mixtral": "mistral", "qwen2_moe": "qwen2", "qwen3_moe": "qwen3",
                               "glm4_moe": "llama"}[moe_type]
        if moe_type == "glm4_moe":  # Glm4MoeAttention: q, k, v biases with attention_bias, QK-norm with use_qk_norm
            eps_default = 1e-5
            self.qkv_bias = bool(d.get("attention_bias", False))
            self.qk_norm = bool(d.get("use_qk_norm", False))
            # Rotary positions on the first partial_rotary_factor of each head (GPT-NeoX's
            # apply_rotary_pos_emb); Glm4MoeConfig's default is half. transformers 5 keeps it in
            # rope_parameters.
            rotary = (d.get("rope_parameters") or {}).get("partial_rotary_factor", d.get("partial_rotary_factor", 0.5))
            if not isinstance(rotary, (int, float)) or isinstance(rotary, bool) or not 0 < rotary <= 1:
                raise InputError("config: partial_rotary_factor %r is not a fraction in (0, 1]" % (rotary,))
            self.partial_rotary = float(rotary)
        source_type = self.model_type
        if self.model_type in ("mistral", "qwen2", "qwen3"):  # LLaMA's layers and names, and more
            self.model_type = "llama"
            # MistralConfig's default 4096 (MixtralConfig's none); null: none
            w = d.get("sliding_window", None if moe_type == "mixtral" else 4096)
            if w is not None and (not isinstance(w, int) or isinstance(w, bool) or w <= 0):
                raise InputError("config: 'sliding_window' must be a positive integer or null, got %r" % (w,))
            if source_type == "mistral":
                self.window = w or 0
            else:  # Qwen2: q, k, v biases; a window only with use_sliding_window, from max_window_layers on
                if source_type == "qwen2":
                    self.qkv_bias = True
                else:  # Qwen3: QK-norm; biases on q, k, v and o with attention_bias
                    self.qk_norm = True
                    self.qkv_bias = self.o_bias = bool(d.get("attention_bias", False))
                if d.get("use_sliding_window") and w:
                    if d.get("max_window_layers", 28) != 0:
                        raise InputError("config: a window on some layers only is not supported")
                    self.window = w
        elif self.model_type == "llama" and d.get("attention_bias") and moe_type != "glm4_moe":
            self.qkv_bias = self.o_bias = True

        def need(key):
            if key not in d or d[key] is None:
                raise InputError("config: missing %r" % key)
            v = d[key]
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise InputError("config: %r must be a positive integer, got %r" % (key, v))
            return v

        if self.model_type == "gpt2":
            self.n_layer = need("n_layer")
            self.hidden = need("n_embd")
            self.n_head = need("n_head")
            self.n_kv_head = self.n_head
            self.max_pos = need("n_positions")
            self.vocab = need("vocab_size")
            self.inner = d.get("n_inner") or 4 * self.hidden
            self.eps = float(d.get("layer_norm_epsilon", 1e-5))
            self.tied = True
            act = d.get("activation_function", "gelu_new")
            if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
                raise InputError("config: activation_function %r is not the tanh GELU" % act)
            if d.get("tie_word_embeddings", True) is False:
                raise InputError("config: a GPT-2 with an untied LM head is not supported")
            if self.hidden % self.n_head:
                raise InputError("config: n_embd %d not divisible by n_head %d" % (self.hidden, self.n_head))
            self.head_dim = self.hidden // self.n_head
        elif self.model_type == "llama":
            self.n_layer = need("num_hidden_layers")
            self.hidden = need("hidden_size")
            self.n_head = need("num_attention_heads")
            self.n_kv_head = d.get("num_key_value_heads") or self.n_head
            self.inner = need("intermediate_size")
            self.vocab = need("vocab_size")
            self.max_pos = need("max_position_embeddings")
            self.eps = float(d.get("rms_norm_eps", eps_default))
            self.theta = float(d.get("rope_theta", 10000.0))
            self.tied = bool(d.get("tie_word_embeddings", False))
            if d.get("hidden_act", "silu") != "silu":
                raise InputError("config: hidden_act %r is not silu" % d.get("hidden_act"))
            # transformers 5 keeps the base and the scaling in rope_parameters; 4 in rope_theta
            # and rope_scaling, where a legacy "type" overrides "rope_type".
            rs = d.get("rope_parameters") or d.get("rope_scaling")
            if rs:
                self.theta = float(rs.get("rope_theta", self.theta))
                kind = rs.get("type", rs.get("rope_type"))
                need_keys = {"default": (), "linear": ("factor",), "dynamic": ("factor",),
                             "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                        "original_max_position_embeddings"), "yarn": ()}
                if kind not in need_keys:
                    raise InputError("config: rope_scaling type %r is not supported" % kind)
                for key in need_keys[kind]:
                    if not isinstance(rs.get(key), (int, float)) or rs[key] <= 0:
                        raise InputError("config: rope_scaling.%s must be a number > 0" % key)
                if kind == "yarn":
                    self.rope_scaling = yarn_parameters(rs, self.max_pos)
                elif kind != "default":
                    self.rope_scaling = dict(rs, kind=kind)
            if d.get("mlp_bias"):
                raise InputError("config: mlp_bias is not supported")
            if self.n_head % self.n_kv_head:
                raise InputError("config: num_attention_heads %d not divisible by num_key_value_heads %d"
                                 % (self.n_head, self.n_kv_head))
            hd = d.get("head_dim", 128 if source_type == "qwen3" or moe_type == "glm4_moe" else None)  # their default
            if hd is None:
                if self.hidden % self.n_head:
                    raise InputError("config: hidden_size %d not divisible by num_attention_heads %d"
                                     % (self.hidden, self.n_head))
                hd = self.hidden // self.n_head
            self.head_dim = int(hd)
            if self.head_dim % 2:
                raise InputError("config: head dimension %d is odd; RoPE needs it even" % self.head_dim)
            # transformers' int(head_dim * partial_rotary_factor): the leading values that turn
            self.rotary_dim = int(self.head_dim * self.partial_rotary)
            if self.rotary_dim < 2 or self.rotary_dim % 2:
                raise InputError("config: partial_rotary_factor %r turns %d values of a head; RoPE needs an even "
                                 "number" % (self.partial_rotary, self.rotary_dim))
        else:
            raise InputError("config: model_type %r is not 'gpt2', 'llama', 'mistral', 'qwen2', 'qwen3', 'mixtral', "
                             "'qwen2_moe', 'qwen3_moe' or 'glm4_moe'" % self.model_type)
        if moe_type:
            self.moe = self.read_moe(d, moe_type, need)

    def read_moe(self, d, moe_type, need):
        """The mixture of experts of a Mixtral, Qwen2-MoE, Qwen3-MoE or GLM-4.5 config.json, with
        transformers' defaults: E experts, each token through its top K, experts FE wide;
        Qwen2-MoE's one shared expert FS wide with its sigmoid gate, GLM-4.5's ungated shared
        experts; GLM-4.5's sigmoid router (DeepSeek-V3's); which layers are MoE."""
        def count(key, default):
            v = d.get(key, default)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise InputError("config: %r must be a whole number >= 0, got %r" % (key, v))
            return v
        # Megatron-Core's --moe-expert-capacity-factor (not a transformers key): 0 or absent, dropless.
        m = {"aux": float(d.get("router_aux_loss_coef", 0.001)), "capacity": float(d.get("moe_expert_capacity_factor") or 0)}
        m.update(sigmoid=False, groups=1, groups_chosen=1, scale=1.0, shared_gate=True, seq_aux=False)
        if moe_type == "mixtral":
            m.update(E=count("num_local_experts", 8), K=count("num_experts_per_tok", 2), FE=self.inner, FS=0,
                     normalize=True, prefix="block_sparse_moe.", names=("w1", "w3", "w2"), layers=None)
        elif moe_type == "glm4_moe":
            # Glm4MoeMoE: sigmoid scores plus e_score_correction_bias choose the top K within the
            # topk_group best of n_group groups; the chosen scores, renormalised with
            # norm_topk_prob, times routed_scaling_factor, weigh; n_shared_experts ungated
            # experts beside. Layers from first_k_dense_replace on. transformers has no
            # balance loss here: router_aux_loss_coef (absent: 0) asks for Megatron-Core's.
            m["aux"] = float(d.get("router_aux_loss_coef", 0.0))
            m["seq_aux"] = bool(d.get("seq_aux", False))  # DeepSeek's key: the loss per sequence
            fe = count("moe_intermediate_size", 1408)
            m.update(E=count("n_routed_experts", 128), K=count("num_experts_per_tok", 8), FE=fe,
                     FS=fe * count("n_shared_experts", 1), normalize=bool(d.get("norm_topk_prob", True)),
                     prefix="mlp.", names=("gate_proj", "up_proj", "down_proj"), sigmoid=True,
                     groups=count("n_group", 1), groups_chosen=count("topk_group", 1),
                     scale=float(d.get("routed_scaling_factor", 1.0)), shared_gate=False)
            m["layers"] = list(range(count("first_k_dense_replace", 1), self.n_layer))
            if m["groups"] < 1 or m["E"] % m["groups"] or not 1 <= m["groups_chosen"] <= m["groups"]:
                raise InputError("config: n_group %d, topk_group %d: expected n_group to divide the %d experts "
                                 "and 1 <= topk_group <= n_group" % (m["groups"], m["groups_chosen"], m["E"]))
        else:
            qwen2 = moe_type == "qwen2_moe"
            m.update(E=count("num_experts", 60 if qwen2 else 128), K=count("num_experts_per_tok", 4 if qwen2 else 8),
                     FE=count("moe_intermediate_size", 1408 if qwen2 else 768),
                     FS=count("shared_expert_intermediate_size", 5632) if qwen2 else 0,
                     normalize=bool(d.get("norm_topk_prob", False)), prefix="mlp.",
                     names=("gate_proj", "up_proj", "down_proj"))
            step, only = count("decoder_sparse_step", 1), d.get("mlp_only_layers", [])
            # Qwen2MoeDecoderLayer: sparse when not in mlp_only_layers and (i + 1) % step == 0.
            m["layers"] = [i for i in range(self.n_layer) if i not in only and step > 0 and (i + 1) % step == 0]
        if m["E"] <= 0 or not 0 < m["K"] <= m["E"] or m["FE"] <= 0:
            raise InputError("config: experts %d, top-k %d, width %d: expected 0 < top-k <= experts and width > 0"
                             % (m["E"], m["K"], m["FE"]))
        return m

    def is_moe(self, i):
        return self.moe is not None and (self.moe["layers"] is None or i in self.moe["layers"])

    @staticmethod
    def load(path):
        try:
            with open(path, "r", encoding="utf-8") as f:
                d = json.load(f)
        except (OSError, ValueError) as e:
            raise InputError("config %s: %s" % (path, e))
        return Config(d)

    def param_specs(self):
        """(name, shape, role) in HuggingFace's state_dict order.

        role: 'matrix' | 'embedding' | 'gain' | 'bias' | 'balance' (a sigmoid router's bias:
        no gradient, no AdamW; moved by the load after each step). A tied embedding appears once.
        """
        C, F_, V, L = self.hidden, self.inner, self.vocab, self.n_layer
        s = []
        if self.model_type == "gpt2":
            s.append(("transformer.wte.weight", (V, C), "embedding"))
            s.append(("transformer.wpe.weight", (self.max_pos, C), "embedding"))
            for i in range(L):
                p = "transformer.h.%d." % i
                s += [(p + "ln_1.weight", (C,), "gain"), (p + "ln_1.bias", (C,), "bias"),
                      (p + "attn.c_attn.weight", (C, 3 * C), "matrix"), (p + "attn.c_attn.bias", (3 * C,), "bias"),
                      (p + "attn.c_proj.weight", (C, C), "matrix"), (p + "attn.c_proj.bias", (C,), "bias"),
                      (p + "ln_2.weight", (C,), "gain"), (p + "ln_2.bias", (C,), "bias"),
                      (p + "mlp.c_fc.weight", (C, F_), "matrix"), (p + "mlp.c_fc.bias", (F_,), "bias"),
                      (p + "mlp.c_proj.weight", (F_, C), "matrix"), (p + "mlp.c_proj.bias", (C,), "bias")]
            s += [("transformer.ln_f.weight", (C,), "gain"), ("transformer.ln_f.bias", (C,), "bias")]
        else:
            HS, NH, NKV = self.head_dim, self.n_head, self.n_kv_head
            s.append(("model.embed_tokens.weight", (V, C), "embedding"))
            for i in range(L):
                p = "model.layers.%d." % i
                for proj, rows in (("q", NH * HS), ("k", NKV * HS), ("v", NKV * HS)):
                    s.append((p + "self_attn.%s_proj.weight" % proj, (rows, C), "matrix"))
                    if self.qkv_bias:
                        s.append((p + "self_attn.%s_proj.bias" % proj, (rows,), "bias"))
                s.append((p + "self_attn.o_proj.weight", (C, NH * HS), "matrix"))
                if self.o_bias:
                    s.append((p + "self_attn.o_proj.bias", (C,), "bias"))
                if self.qk_norm:
                    s += [(p + "self_attn.q_norm.weight", (HS,), "gain"), (p + "self_attn.k_norm.weight", (HS,), "gain")]
                if self.is_moe(i):
                    s += self.moe_specs(p)
                else:
                    s += [(p + "mlp.gate_proj.weight", (F_, C), "matrix"),
                          (p + "mlp.up_proj.weight", (F_, C), "matrix"),
                          (p + "mlp.down_proj.weight", (C, F_), "matrix")]
                s += [(p + "input_layernorm.weight", (C,), "gain"),
                      (p + "post_attention_layernorm.weight", (C,), "gain")]
            s.append(("model.norm.weight", (C,), "gain"))
            if not self.tied:
                s.append(("lm_head.weight", (V, C), "matrix"))
        return s

    def moe_specs(self, p):
        """A mixture of experts' tensors, HuggingFace's names: the router, each expert's gate,
        up and down projections (Mixtral's w1, w3, w2), the shared expert and its gate."""
        m, C = self.moe, self.hidden
        pre = p + m["prefix"]
        s = [(pre + "gate.weight", (m["E"], C), "matrix")]
        if m["sigmoid"]:  # the balancing bias: it chooses and does not weigh; the load moves it, not a gradient
            s.append((pre + "gate.e_score_correction_bias", (m["E"],), "balance"))
        gate, up, down = m["names"]
        for e in range(m["E"]):
            x = pre + "experts.%d." % e
            s += [(x + gate + ".weight", (m["FE"], C), "matrix"), (x + up + ".weight", (m["FE"], C), "matrix"),
                  (x + down + ".weight", (C, m["FE"]), "matrix")]
        if m["FS"] > 0:
            x = pre + ("shared_expert." if m["shared_gate"] else "shared_experts.")
            s += [(x + "gate_proj.weight", (m["FS"], C), "matrix"), (x + "up_proj.weight", (m["FS"], C), "matrix"),
                  (x + "down_proj.weight", (C, m["FS"]), "matrix")]
            if m["shared_gate"]:
                s.append((pre + "shared_expert_gate.weight", (1, C), "matrix"))
        return s

    def embedding_name(self):
        return "transformer.wte.weight" if self.model_type == "gpt2" else "model.embed_tokens.weight"


# ----------------------------------------------------------------------------------------------
# safetensors


_ST_DTYPES = {"F32": ("<f4", 4), "F16": ("<f2", 2), "BF16": ("<u2", 2), "F64": ("<f8", 8)}


def read_safetensors(path):
    """{name: float32 numpy array}; reads F32, F16, BF16 (and F64)."""
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise InputError("weights %s: %s" % (path, e))
    if len(blob) < 8:
        raise InputError("weights %s: shorter than the 8-byte header length" % path)
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise InputError("weights %s: header length %d runs past the file" % (path, n))
    try:
        header = json.loads(blob[8:8 + n].decode("utf-8"))
    except ValueError as e:
        raise InputError("weights %s: header is not JSON: %s" % (path, e))
    if not isinstance(header, dict):
        raise InputError("weights %s: header is not a JSON object" % path)
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (b, e) = info["dtype"], [int(x) for x in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise InputError("weights %s: tensor %r has a malformed entry" % (path, name))
        if dtype not in _ST_DTYPES:
            raise InputError("weights %s: tensor %r has dtype %s (F32, F16, BF16 read)" % (path, name, dtype))
        np_dtype, width = _ST_DTYPES[dtype]
        count = int(np.prod(shape)) if shape else 1
        if not (0 <= b <= e <= len(data)) or e - b != count * width:
            raise InputError("weights %s: tensor %r has data_offsets [%d, %d] that do not fit shape %s %s"
                             % (path, name, b, e, shape, dtype))
        raw = np.frombuffer(data[b:e], dtype=np_dtype, count=count)
        if dtype == "BF16":
            arr = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            arr = raw.astype(np.float32)
        out[name] = arr.reshape(shape).copy()
    return out


def write_safetensors(path, tensors):
    """tensors: ordered {name: array-like}; written F32, header space-padded to a multiple of 8."""
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        if isinstance(t, torch.Tensor):
            t = t.detach().cpu().numpy()
        a = np.ascontiguousarray(np.asarray(t, dtype="<f4"))
        raw = a.tobytes()
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode("utf-8")
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for c in chunks:
            f.write(c)


def check_weights(cfg, w, path="weights"):
    """Every tensor of the model with its shape; nothing unknown. Returns {name: array} in order."""
    specs = cfg.param_specs()
    want = {n: s for n, s, _ in specs}
    for name in w:
        if name in want:
            continue
        if cfg.model_type == "gpt2" and (name.endswith(".attn.bias") or name.endswith(".attn.masked_bias")):
            continue  # old GPT-2 checkpoints store the causal mask buffers; they are not parameters
        if name == "lm_head.weight" and cfg.tied:
            emb = w.get(cfg.embedding_name())
            if emb is not None and emb.shape == w[name].shape and np.array_equal(emb, w[name]):
                continue  # a tied head saved beside its embedding
            raise InputError("%s: lm_head.weight differs from the tied embedding" % path)
        raise InputError("%s: unexpected tensor %r" % (path, name))
    out = {}
    for name, shape, _ in specs:
        if name not in w:
            raise InputError("%s: missing tensor %r" % (path, name))
        if tuple(w[name].shape) != tuple(shape):
            raise InputError("%s: tensor %r has shape %s, want %s" % (path, name, list(w[name].shape), list(shape)))
        out[name] = w[name]
    return out


# ----------------------------------------------------------------------------------------------
# Initialisation and tokens


INIT_STD = 0.02        # matrices and embedding tables are INIT_STD * N(0,1)
GAIN_NOISE_STD = 0.05  # norm gains are 1 + GAIN_NOISE_STD * N(0,1)
BIAS_STD = 0.02        # biases (LayerNorm shifts included) are BIAS_STD * N(0,1)


def make_init(cfg, seed):
    """Seeded random weights for every tensor of the model, in state_dict order (numpy float32)."""
    g = torch.Generator()
    g.manual_seed(seed)
    out = {}
    for name, shape, role in cfg.param_specs():
        z = torch.randn(shape, generator=g, dtype=torch.float32)
        if role in ("matrix", "embedding"):
            t = z * INIT_STD
        elif role == "gain":
            t = 1.0 + z * GAIN_NOISE_STD
        else:
            t = z * BIAS_STD
        out[name] = t.numpy()
    return out


def make_tokens(vocab, n, seed):
    """A learnable stream: a walk around a seeded cycle of min(V, 16) tokens, with one token in 8
    replaced by a uniformly random one. Any batch teaches the same bigrams, so losses fall step
    after step even when batches differ."""
    rng = np.random.RandomState(seed)
    cycle = rng.permutation(vocab)[:min(vocab, 16)]
    walk = cycle[np.arange(n) % cycle.size]
    noise = rng.randint(8, size=n) == 0
    return np.where(noise, rng.randint(vocab, size=n), walk).astype(np.int64)


def write_tokens(path, toks, fmt="gpt-2"):
    """llm.c's layout: fmt "gpt-2" (uint16) or "llama-3" (uint32)."""
    toks = np.asarray(toks)
    magic = TOKENS_MAGIC if fmt == "gpt-2" else 20240801
    version, dtype = TOKEN_FORMATS[magic]
    if toks.size and (toks.min() < 0 or toks.max() > np.iinfo(dtype).max):
        raise InputError("tokens do not fit %s" % np.dtype(dtype).name)
    header = np.zeros(TOKENS_HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = magic, version, toks.size
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(toks.astype(dtype).tobytes())


def read_tokens(path):
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise InputError("tokens %s: %s" % (path, e))
    if len(blob) < 4 * TOKENS_HEADER_INTS:
        raise InputError("tokens %s: shorter than the %d-byte header" % (path, 4 * TOKENS_HEADER_INTS))
    header = np.frombuffer(blob[:4 * TOKENS_HEADER_INTS], dtype="<i4")
    if int(header[0]) not in TOKEN_FORMATS:
        raise InputError("tokens %s: magic %d, want one of %s" % (path, header[0], sorted(TOKEN_FORMATS)))
    version, dtype = TOKEN_FORMATS[int(header[0])]
    if header[1] != version:
        raise InputError("tokens %s: version %d, want %d" % (path, header[1], version))
    n = int(header[2])
    body = len(blob) - 4 * TOKENS_HEADER_INTS
    width = np.dtype(dtype).itemsize
    if n < 0 or body != width * n:
        raise InputError("tokens %s: header says %d tokens, file holds %d bytes of them" % (path, n, body))
    return np.frombuffer(blob[4 * TOKENS_HEADER_INTS:], dtype=dtype).astype(np.int64)


def batch_positions(n_tokens, B, T, steps):
    """llm.c's dataloader: where each step's B*T+1 tokens start."""
    span = B * T
    if span + 1 > n_tokens:
        raise InputError("token file holds %d tokens; one batch needs B*T+1 = %d" % (n_tokens, span + 1))
    out, p = [], 0
    for _ in range(steps):
        if p + span + 1 > n_tokens:
            p = 0
        out.append(p)
        p += span
    return out


def batch_at(tokens, p, B, T):
    buf = torch.from_numpy(np.ascontiguousarray(tokens[p:p + B * T + 1]))
    return buf[:-1].view(B, T), buf[1:].view(B, T)


# ----------------------------------------------------------------------------------------------
# Model (functional: a {HF name: tensor} dict)


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def causal_attention(q, k, v, window=0):
    """q, k, v: [B, NH, T, HS]; softmax(q k^T / sqrt(HS) + causal mask) v. A sliding window W > 0
    keeps key j for query i only if i - W < j (transformers' sliding_window_overlay: W keys)."""
    T, HS = q.shape[-2], q.shape[-1]
    att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(HS))
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    if window > 0:
        mask &= torch.ones(T, T, dtype=torch.bool).triu(-(window - 1))
    att = att.masked_fill(~mask, float("-inf"))
    return torch.softmax(att, dim=-1) @ v


def yarn_parameters(rs, max_pos):
    """YaRN's settings as transformers' current _compute_yarn_parameters resolves them: the
    original context (original_max_position_embeddings, else max_position_embeddings), the
    factor (given, else the ratio of the two), the cos/sin scale (attention_factor; else
    DeepSeek's mscale ratio where mscale and mscale_all_dim are both non-zero; else
    0.1 ln(factor) + 1), beta_fast 32 and beta_slow 1 (an absent or zero one), truncate."""
    for key in ("factor", "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow"):
        if rs.get(key) is not None and (not isinstance(rs[key], (int, float)) or rs[key] < 0):
            raise InputError("config: rope_scaling.%s must be a number > 0" % key)
    original = rs.get("original_max_position_embeddings") or max_pos
    factor = rs.get("factor") or max_pos / original
    if factor < 1:
        raise InputError("config: rope_scaling.factor %g: yarn scaling needs a factor >= 1" % factor)

    def mscale(scale, m=1.0):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    attention = rs.get("attention_factor")
    if attention is None:
        if rs.get("mscale") and rs.get("mscale_all_dim"):
            attention = mscale(factor, rs["mscale"]) / mscale(factor, rs["mscale_all_dim"])
        else:
            attention = mscale(factor)
    return dict(rs, kind="yarn", factor=float(factor), original_max_position_embeddings=original,
                attention_factor=float(attention), beta_fast=rs.get("beta_fast") or 32,
                beta_slow=rs.get("beta_slow") or 1, truncate=rs.get("truncate", True))


def rope_inv_freq(T, head_dim, theta, scaling=None, max_pos=None):
    """HF's inverse frequencies [d/2] for a sequence of T tokens, in float64, rescaled as its
    rope_scaling asks (transformers' modeling_rope_utils): linear divides them by the factor;
    dynamic NTK raises the base for T > max_position_embeddings; llama3 divides the long
    wavelengths, keeps the short ones and blends those between."""
    kind = scaling["kind"] if scaling else "default"
    if kind == "dynamic" and T > max_pos:
        f = scaling["factor"]
        theta = theta * ((f * T / max_pos) - (f - 1)) ** (head_dim / (head_dim - 2))
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (i / head_dim))
    if kind == "linear":
        inv_freq = inv_freq / scaling["factor"]
    elif kind == "llama3":
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old_context = scaling["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old_context / low, old_context / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_context / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    elif kind == "yarn":
        # The pairs that turn more than beta_fast times over the original context L keep their
        # frequency, those that turn fewer than beta_slow times are interpolated (/ factor),
        # and a linear ramp over the pair index joins them.
        L = scaling["original_max_position_embeddings"]

        def correction_dim(turns):
            return head_dim * math.log(L / (turns * 2 * math.pi)) / (2 * math.log(theta))
        low, high = correction_dim(scaling["beta_fast"]), correction_dim(scaling["beta_slow"])
        if scaling["truncate"]:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, head_dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        inv_freq = inv_freq * (1 - ramp) + inv_freq / scaling["factor"] * ramp
    return inv_freq


def rope_cos_sin(T, head_dim, theta, dtype, scaling=None, max_pos=None):
    """HF's rotate-half tables [T, head_dim]: angle(pos, i) = pos * inv_freq(i), i < d/2 (plain:
    theta^(-2i/d)), repeated over both halves. Angles computed in float64, then cast."""
    inv_freq = rope_inv_freq(T, head_dim, theta, scaling, max_pos)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    a = scaling["attention_factor"] if scaling and scaling["kind"] == "yarn" else 1.0  # YaRN's alone
    return (emb.cos() * a).to(dtype), (emb.sin() * a).to(dtype)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def apply_rope(x, cos, sin):
    """x: [B, H, T, HS]; cos/sin: [T, R] with R <= HS even: the first R values of each head turn
    (R < HS: partial rotary, GPT-NeoX's and GLM-4.5's), the rest pass through."""
    r = cos.shape[-1]
    if r < x.shape[-1]:
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
    return x * cos + rotate_half(x) * sin


def gpt2_forward(cfg, P, idx):
    B, T = idx.shape
    C, NH, HS = cfg.hidden, cfg.n_head, cfg.head_dim
    wte = P["transformer.wte.weight"]
    x = F.embedding(idx, wte) + P["transformer.wpe.weight"][:T]
    for i in range(cfg.n_layer):
        p = "transformer.h.%d." % i
        h = F.layer_norm(x, (C,), P[p + "ln_1.weight"], P[p + "ln_1.bias"], cfg.eps)
        qkv = h @ P[p + "attn.c_attn.weight"] + P[p + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q, k, v = (t.view(B, T, NH, HS).transpose(1, 2) for t in (q, k, v))
        y = causal_attention(q, k, v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ P[p + "attn.c_proj.weight"] + P[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (C,), P[p + "ln_2.weight"], P[p + "ln_2.bias"], cfg.eps)
        m = gelu_tanh(h @ P[p + "mlp.c_fc.weight"] + P[p + "mlp.c_fc.bias"])
        x = x + (m @ P[p + "mlp.c_proj.weight"] + P[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), P["transformer.ln_f.weight"], P["transformer.ln_f.bias"], cfg.eps)
    return x @ wte.t()


def moe_mlp(cfg, P, p, h, loads=None, sequences=1):
    """A mixture of experts on h [N, C] as transformers' MixtralSparseMoeBlock,
    Qwen2MoeSparseMoeBlock and Glm4MoeMoE compute it (softmax router, top-k, the chosen weights
    renormalised when the config says so; or GLM-4.5's and DeepSeek-V3's sigmoid router, its
    bias choosing within the best groups; each expert's SwiGLU on its tokens, the weighted sum;
    the shared expert, gated by a sigmoid in Qwen2-MoE), and Megatron-Core's load-balancing
    loss of the layer (switch_load_balancing_loss_func): E / (N^2 K) sum_e P_e c_e, P_e the sum
    of expert e's probabilities over the N tokens (under a sigmoid router its scores over their
    sum, as Megatron-Core's compute_routing_scores_for_aux_loss), c_e the tokens that chose it
    (a count: no gradient); with the config's seq_aux, DeepSeek's sequence-wise loss (Megatron-
    Core's sequence_load_balancing_loss_func): the same over each of the `sequences` (rows
    sequence by sequence), averaged. The counts are appended to `loads` when given."""
    m = cfg.moe
    pre = p + m["prefix"]
    E, K, N = m["E"], m["K"], h.shape[0]
    logits = h @ P[pre + "gate.weight"].t()
    if m["sigmoid"]:
        scores = torch.sigmoid(logits)
        chosen = sigmoid_choice(scores.detach() + P[pre + "gate.e_score_correction_bias"].detach(), K, m["groups"],
                                m["groups_chosen"])
        weights = scores.gather(1, chosen)
        if m["normalize"]:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * m["scale"]
        probs = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    else:
        probs = torch.softmax(logits, dim=-1)
        weights, chosen = torch.topk(probs, K, dim=-1)
        if m["normalize"]:
            weights = weights / weights.sum(dim=-1, keepdim=True)
    if m["capacity"] > 0:
        weights = weights * capacity_mask(weights, chosen, E, math.ceil(N * K / E * m["capacity"]))
    gate, up, down = m["names"]
    out = torch.zeros_like(h)
    for e in range(E):
        tok, k = torch.where(chosen == e)
        if tok.numel() == 0:
            continue
        x = pre + "experts.%d." % e
        z = h[tok]
        y = (F.silu(z @ P[x + gate + ".weight"].t()) * (z @ P[x + up + ".weight"].t())) @ P[x + down + ".weight"].t()
        out = out.index_add(0, tok, y * weights[tok, k, None])
    if m["FS"] > 0:
        x = pre + ("shared_expert." if m["shared_gate"] else "shared_experts.")
        y = (F.silu(h @ P[x + "gate_proj.weight"].t()) * (h @ P[x + "up_proj.weight"].t())) @ P[x + "down_proj.weight"].t()
        out = out + (torch.sigmoid(h @ P[pre + "shared_expert_gate.weight"].t()) * y if m["shared_gate"] else y)
    counts = torch.bincount(chosen.reshape(-1), minlength=E).to(h.dtype)
    if loads is not None and m["sigmoid"]:
        loads.append((pre + "gate.e_score_correction_bias", counts))
    if not m["seq_aux"]:
        return out, (probs.sum(dim=0) * counts).sum() * (E / (N * N * K))
    T = N // sequences
    aux = 0
    for b in range(sequences):
        c = torch.bincount(chosen[b * T:(b + 1) * T].reshape(-1), minlength=E).to(h.dtype)
        aux = aux + (probs[b * T:(b + 1) * T].sum(dim=0) * c).sum() * (E / (T * T * K))
    return out, aux / sequences


def sigmoid_choice(biased, K, groups, groups_chosen):
    """DeepSeek-V3's choice [N, K] from biased scores [N, E]: each group's two best summed, the
    groups_chosen best groups kept (the rest masked to -inf, as DeepSeek's and Megatron-Core's
    code do), the K best of what is left; ties to the lower index (a stable sort)."""
    N, E = biased.shape
    if groups_chosen < groups:
        grouped = biased.view(N, groups, E // groups)
        top2 = torch.sort(grouped, dim=-1, descending=True, stable=True).values[..., :2].sum(dim=-1)
        keep = torch.sort(top2, dim=-1, descending=True, stable=True).indices[:, :groups_chosen]
        mask = torch.zeros(N, groups, dtype=torch.bool)
        mask.scatter_(1, keep, True)
        biased = biased.masked_fill(~mask.repeat_interleave(E // groups, dim=1), float("-inf"))
    return torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :K]


def capacity_mask(weights, chosen, E, capacity):
    """Megatron-Core's token dropping ("probs" policy): each expert keeps the `capacity` of its
    copies with the largest weights, a tie to the earlier token; [N, K] booleans."""
    keep = torch.zeros(chosen.shape, dtype=torch.bool)
    for e in range(E):
        tok, k = torch.where(chosen == e)  # in token order
        if tok.numel() > capacity:
            w = weights[tok, k].detach()
            sel = torch.tensor(sorted(range(tok.numel()), key=lambda i: (-float(w[i]), i))[:capacity], dtype=torch.long)
            tok, k = tok[sel], k[sel]
        keep[tok, k] = True
    return keep


def llama_forward(cfg, P, idx, aux=None, loads=None):
    B, T = idx.shape
    NH, NKV, HS = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    emb = P["model.embed_tokens.weight"]
    x = F.embedding(idx, emb)
    cos, sin = rope_cos_sin(T, cfg.rotary_dim, cfg.theta, x.dtype, cfg.rope_scaling, cfg.max_pos)
    rep = NH // NKV
    for i in range(cfg.n_layer):
        p = "model.layers.%d." % i
        h = rms_norm(x, P[p + "input_layernorm.weight"], cfg.eps)
        def proj(name, x):  # nn.Linear, with its bias where the config has one
            bias = P.get(p + "self_attn.%s_proj.bias" % name)
            return F.linear(x, P[p + "self_attn.%s_proj.weight" % name], bias)
        q, k = proj("q", h).view(B, T, NH, HS), proj("k", h).view(B, T, NKV, HS)
        if cfg.qk_norm:  # Qwen3: each head normalised over its head_dim, before the rotation
            q, k = rms_norm(q, P[p + "self_attn.q_norm.weight"], cfg.eps), rms_norm(k, P[p + "self_attn.k_norm.weight"], cfg.eps)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = proj("v", h).view(B, T, NKV, HS).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)  # head h -> kv h // rep
        y = causal_attention(q, k, v, cfg.window).transpose(1, 2).reshape(B, T, NH * HS)
        x = x + proj("o", y)
        h = rms_norm(x, P[p + "post_attention_layernorm.weight"], cfg.eps)
        if cfg.is_moe(i):
            y, layer_aux = moe_mlp(cfg, P, p, h.reshape(B * T, -1), loads, B)
            x = x + y.view(B, T, -1)
            if aux is not None:
                aux.append(layer_aux)
            continue
        g = h @ P[p + "mlp.gate_proj.weight"].t()
        u = h @ P[p + "mlp.up_proj.weight"].t()
        x = x + (F.silu(g) * u) @ P[p + "mlp.down_proj.weight"].t()
    x = rms_norm(x, P["model.norm.weight"], cfg.eps)
    head = emb if cfg.tied else P["lm_head.weight"]
    return x @ head.t()


def forward(cfg, P, idx, aux=None, loads=None):
    """Logits [B, T, V]; each MoE layer's load-balancing loss appended to `aux` when given, and
    (name of its router's bias, each expert's tokens) to `loads`."""
    T = idx.shape[1]
    if T > cfg.max_pos and cfg.model_type == "gpt2":  # rotary positions have no table to run out of
        raise InputError("sequence length %d exceeds the model's %d positions" % (T, cfg.max_pos))
    return gpt2_forward(cfg, P, idx) if cfg.model_type == "gpt2" else llama_forward(cfg, P, idx, aux, loads)


def loss_fn(cfg, P, idx, tgt):
    """The mean cross-entropy (the reported loss)."""
    return objective(cfg, P, idx, tgt)[0]


def objective(cfg, P, idx, tgt, loads=None):
    """(the mean cross-entropy, what training minimises: it plus router_aux_loss_coef times
    the MoE layers' load-balancing losses, as Megatron-Core adds them, and those losses' mean
    over the layers as Megatron logs it, None without experts)."""
    aux = []
    logits = forward(cfg, P, idx, aux, loads)
    ce = F.cross_entropy(logits.reshape(-1, cfg.vocab), tgt.reshape(-1))
    if not aux:
        return ce, ce, None
    return ce, ce + cfg.moe["aux"] * sum(aux), float(sum(aux).detach()) / len(aux)


# ----------------------------------------------------------------------------------------------
# Training


def make_params(cfg, weights, dtype=torch.float32):
    return {n: torch.nn.Parameter(torch.tensor(np.asarray(weights[n]), dtype=dtype), requires_grad=role != "balance")
            for n, _, role in cfg.param_specs()}


def trained(cfg, P):
    """The parameters the loss's gradient trains (all but a sigmoid router's balancing bias)."""
    return [P[n] for n, _, role in cfg.param_specs() if role != "balance"]


def make_optimizer(cfg, P, lr, b1, b2, eps, wd):
    decay = [p for p in trained(cfg, P) if p.dim() >= 2]
    no_decay = [p for p in trained(cfg, P) if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": wd}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)


def grad_norm(params):
    return torch.norm(torch.stack([torch.norm(p.grad.detach(), 2) for p in params]), 2)


def train_step(cfg, P, opt, idx, tgt, clip, bias_rate=0.0):
    opt.zero_grad(set_to_none=True)
    loads = []
    loss, total, balance = objective(cfg, P, idx, tgt, loads)
    total.backward()
    params = trained(cfg, P)
    for p in params:  # an expert no token chose: a zero gradient, and AdamW steps it (Megatron's buffers)
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if clip > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, clip)
    else:
        norm = grad_norm(params)
    opt.step()
    # DeepSeek-V3's auxiliary-loss-free balancing (section 2.1.2), as Megatron-Core's
    # --moe-router-bias-update-rate runs it after each step: each expert's bias rises by the
    # rate where it took fewer than the mean of the step's tokens, falls where more.
    with torch.no_grad():
        for name, counts in loads:
            P[name] += bias_rate * torch.sign(counts.mean() - counts)
    return float(loss.detach()), float(norm), balance


def scheduled_lr(a, k):
    """Megatron's learning rate (OptimizerParamScheduler.get_lr) for the step after k steps of
    a.batch samples each: the schedule runs in samples, a linear warm-up from 0, then the decay
    style down to min_lr at decay_iters' sample."""
    peak, floor = a.lr, getattr(a, "min_lr", 0.0)
    style = getattr(a, "lr_decay_style", "constant")
    samples = a.batch  # the global batch: one step's samples
    warmup = getattr(a, "lr_warmup_iters", 0) * samples
    decay = (getattr(a, "lr_decay_iters", None) or a.steps) * samples
    n = k * samples
    if warmup > 0 and n <= warmup:
        return peak * n / warmup
    if style == "constant":
        return peak
    if n > decay:
        return floor
    if style == "inverse-square-root":
        return max(floor, peak * math.sqrt(max(warmup, 1)) / math.sqrt(max(n, 1)))
    progress = (n - warmup) / (decay - warmup)
    coeff = 1.0 - progress if style == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return floor + coeff * (peak - floor)


def train(cfg, weights, tokens, a, log=True):
    P = make_params(cfg, weights, torch.float64 if getattr(a, "float64", False) else torch.float32)
    opt = make_optimizer(cfg, P, a.lr, a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay)
    losses, norms, balances = [], [], []
    for k, p in enumerate(batch_positions(len(tokens), a.batch, a.seq, a.steps)):
        for group in opt.param_groups:
            group["lr"] = scheduled_lr(a, k)
        idx, tgt = batch_at(tokens, p, a.batch, a.seq)
        loss, norm, balance = train_step(cfg, P, opt, idx, tgt, a.clip_grad, a.moe_router_bias_update_rate)
        losses.append(loss)
        norms.append(norm)
        balances.append(balance)
        if log:
            print("step %d position %d loss %.9g grad_norm %.9g" % (k, p, loss, norm)
                  + ("" if balance is None else " load_balancing_loss %.9g" % balance), flush=True)
    return P, losses, norms, balances, opt


def bench(cfg, weights, tokens, a):
    P = make_params(cfg, weights)
    opt = make_optimizer(cfg, P, a.lr, a.adam_beta1, a.adam_beta2, a.adam_eps, a.weight_decay)
    warm = 2
    pos = batch_positions(len(tokens), a.batch, a.seq, warm + a.bench_steps)
    times = []
    for k, p in enumerate(pos):
        idx, tgt = batch_at(tokens, p, a.batch, a.seq)
        t0 = time.perf_counter()
        train_step(cfg, P, opt, idx, tgt, a.clip_grad)
        dt = time.perf_counter() - t0
        if k >= warm:
            times.append(dt)
    total = sum(times)
    print(json.dumps({"tokens_per_s": a.batch * a.seq * len(times) / total, "threads": torch.get_num_threads(),
                      "median_step_s": statistics.median(times)}), flush=True)


# ----------------------------------------------------------------------------------------------
# Self-test


def np_layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def np_attention_loops(q, k, v, n_head, n_kv, hs, window=0):
    """Explicit loops: q [T, NH*HS], k/v [T, NKV*HS] -> [T, NH*HS]; query t sees keys
    max(0, t - window + 1) .. t under a sliding window."""
    T = q.shape[0]
    y = np.zeros((T, n_head * hs))
    for h in range(n_head):
        kvh = h // (n_head // n_kv)
        qs, ks = slice(h * hs, (h + 1) * hs), slice(kvh * hs, (kvh + 1) * hs)
        for t in range(T):
            first = max(0, t - window + 1) if window > 0 else 0
            keys = range(first, t + 1)
            scores = np.array([np.dot(q[t, qs], k[s, ks]) / math.sqrt(hs) for s in keys])
            e = np.exp(scores - scores.max())
            pr = e / e.sum()
            for i, s in enumerate(keys):
                y[t, qs] += pr[i] * v[s, ks]
    return y


def np_frequency(i, hs, theta, scaling, T, max_pos):
    """Pair i's turn per position, one pair at a time (the bands of llama3 as branches)."""
    kind = scaling["kind"] if scaling else "default"
    if kind == "dynamic" and T > max_pos:
        s = scaling["factor"] * T / max_pos - (scaling["factor"] - 1)
        theta *= math.exp(math.log(s) * hs / (hs - 2))
    w = theta ** (-2.0 * i / hs)
    if kind == "linear":
        return w / scaling["factor"]
    if kind == "llama3":
        L = scaling["original_max_position_embeddings"]
        lo, hi, f = scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["factor"]
        turns_per_context = L * w / (2 * math.pi)  # = L / wavelength
        if turns_per_context > hi:
            return w
        if turns_per_context < lo:
            return w / f
        s = (turns_per_context - lo) / (hi - lo)
        return w * (s + (1 - s) / f)
    if kind == "yarn":
        # Pair j turns L theta^(-2j/hs) / (2 pi) times over the original context L: the pair
        # index that turns b times is (hs / 2) log_theta(L / (2 pi b)).
        L = scaling["original_max_position_embeddings"]
        ends = [hs / 2 * math.log(L / (2 * math.pi * b), theta) for b in (scaling["beta_fast"], scaling["beta_slow"])]
        if scaling["truncate"]:
            ends = [math.floor(ends[0]), math.ceil(ends[1])]
        lo, hi = max(ends[0], 0), min(ends[1], hs - 1)
        hi = hi + 0.001 if hi == lo else hi
        r = min(max((i - lo) / (hi - lo), 0.0), 1.0)  # (hi may fall below lo: a short context)
        return w * (1 - r) + w / scaling["factor"] * r
    return w


def np_rope_pairs(x, n_heads, hs, theta, scaling=None, max_pos=None, rotary=None):
    """RoPE as explicit 2x2 rotations of the pairs (i, i + r/2), i < r/2, at the frequencies of a
    head of r = rotary values (hs unless partial); values r.. untouched: x [T, n_heads*hs]."""
    T = x.shape[0]
    r = rotary or hs
    a_scale = scaling["attention_factor"] if scaling and scaling["kind"] == "yarn" else 1.0  # YaRN's alone
    out = x.copy()
    for h in range(n_heads):
        for t in range(T):
            for i in range(r // 2):
                ang = t * np_frequency(i, r, theta, scaling, T, max_pos)
                x1, x2 = x[t, h * hs + i], x[t, h * hs + i + r // 2]
                out[t, h * hs + i] = a_scale * (x1 * math.cos(ang) - x2 * math.sin(ang))
                out[t, h * hs + i + r // 2] = a_scale * (x2 * math.cos(ang) + x1 * math.sin(ang))
    return out


def np_moe(cfg, W, p, h):
    """A mixture of experts token by token: each token's softmax over the experts, its K most
    probable (argsort), their weights (renormalised when asked), each chosen expert's SwiGLU
    on the token alone, weighted and added; the sigmoid-gated shared expert beside."""
    m = cfg.moe
    pre = p + m["prefix"]
    gate, up, down = m["names"]

    def swiglu(z, x):
        g, u = W[x + gate + ".weight"] @ z, W[x + up + ".weight"] @ z
        return W[x + down + ".weight"] @ (g / (1 + np.exp(-g)) * u)
    out = np.zeros_like(h)
    for t in range(h.shape[0]):
        z = W[pre + "gate.weight"] @ h[t]
        if m["sigmoid"]:  # DeepSeek-V3's: rank the groups, then the experts of the kept ones, by biased score
            prob = 1 / (1 + np.exp(-z))
            biased = prob + W[pre + "gate.e_score_correction_bias"]
            size = m["E"] // m["groups"]
            best = [sum(sorted(biased[g * size:(g + 1) * size], reverse=True)[:2]) for g in range(m["groups"])]
            kept = sorted(range(m["groups"]), key=lambda g: (-best[g], g))[:m["groups_chosen"]]
            allowed = [e for e in range(m["E"]) if e // size in kept]
            top = sorted(allowed, key=lambda e: (-biased[e], e))[:m["K"]]
            w = prob[top] / (prob[top].sum() if m["normalize"] else 1.0) * m["scale"]
        else:
            prob = np.exp(z - z.max())
            prob /= prob.sum()
            top = np.argsort(-prob, kind="stable")[:m["K"]]
            w = prob[top] / (prob[top].sum() if m["normalize"] else 1.0)
        for e, we in zip(top, w):
            out[t] += we * swiglu(h[t], pre + "experts.%d." % e)
        if m["FS"] > 0:
            x = pre + ("shared_expert." if m["shared_gate"] else "shared_experts.")
            g, u = W[x + "gate_proj.weight"] @ h[t], W[x + "up_proj.weight"] @ h[t]
            shared = W[x + "down_proj.weight"] @ (g / (1 + np.exp(-g)) * u)
            gated = m["shared_gate"]
            out[t] += shared / (1 + np.exp(-(W[pre + "shared_expert_gate.weight"] @ h[t])[0])) if gated else shared
    return out


def np_forward(cfg, W, idx):
    """A second, loop-based float64 formulation of both models: logits [B, T, V]."""
    W = {n: np.asarray(v, dtype=np.float64) for n, v in W.items()}
    B, T = idx.shape
    out = np.zeros((B, T, cfg.vocab))
    NH, NKV, HS = cfg.n_head, cfg.n_kv_head, cfg.head_dim
    for b in range(B):
        if cfg.model_type == "gpt2":
            C = cfg.hidden
            x = W["transformer.wte.weight"][idx[b]] + W["transformer.wpe.weight"][:T]
            for i in range(cfg.n_layer):
                p = "transformer.h.%d." % i
                h = np_layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], cfg.eps)
                qkv = h @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
                y = np_attention_loops(qkv[:, :C], qkv[:, C:2 * C], qkv[:, 2 * C:], NH, NH, HS)
                x = x + y @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
                h = np_layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], cfg.eps)
                m = h @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"]
                m = 0.5 * m * (1 + np.tanh(math.sqrt(2 / math.pi) * (m + 0.044715 * m ** 3)))
                x = x + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
            x = np_layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], cfg.eps)
            out[b] = x @ W["transformer.wte.weight"].T
        else:
            def rms(z, g):
                return z / np.sqrt((z ** 2).mean(-1, keepdims=True) + cfg.eps) * g
            x = W["model.embed_tokens.weight"][idx[b]]
            for i in range(cfg.n_layer):
                p = "model.layers.%d." % i
                h = rms(x, W[p + "input_layernorm.weight"])
                def lin(name, z):
                    return z @ W[p + "self_attn.%s_proj.weight" % name].T + W.get(p + "self_attn.%s_proj.bias" % name, 0.0)
                q, k = lin("q", h), lin("k", h)
                if cfg.qk_norm:  # one head at a time
                    for z, heads, name in ((q, NH, "q_norm"), (k, NKV, "k_norm")):
                        for hh in range(heads):
                            z[:, hh * HS:(hh + 1) * HS] = rms(z[:, hh * HS:(hh + 1) * HS], W[p + "self_attn.%s.weight" % name])
                q = np_rope_pairs(q, NH, HS, cfg.theta, cfg.rope_scaling, cfg.max_pos, cfg.rotary_dim)
                k = np_rope_pairs(k, NKV, HS, cfg.theta, cfg.rope_scaling, cfg.max_pos, cfg.rotary_dim)
                v = lin("v", h)
                x = x + lin("o", np_attention_loops(q, k, v, NH, NKV, HS, cfg.window))
                h = rms(x, W[p + "post_attention_layernorm.weight"])
                if cfg.is_moe(i):
                    x = x + np_moe(cfg, W, p, h)
                    continue
                g = h @ W[p + "mlp.gate_proj.weight"].T
                u = h @ W[p + "mlp.up_proj.weight"].T
                x = x + (g / (1 + np.exp(-g)) * u) @ W[p + "mlp.down_proj.weight"].T
            x = rms(x, W["model.norm.weight"])
            head = W["model.embed_tokens.weight"] if cfg.tied else W["lm_head.weight"]
            out[b] = x @ head.T
    return out


def np_cross_entropy(logits, tgt):
    z = logits.reshape(-1, logits.shape[-1])
    m = z.max(-1, keepdims=True)
    lse = (m + np.log(np.exp(z - m).sum(-1, keepdims=True)))[:, 0]
    return float(np.mean(lse - z[np.arange(z.shape[0]), tgt.reshape(-1)]))


GPT2_ODD = {"model_type": "gpt2", "n_layer": 2, "n_embd": 36, "n_head": 3, "n_positions": 13,
            "vocab_size": 97, "layer_norm_epsilon": 1e-5}
LLAMA_ODD = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 48, "num_attention_heads": 6,
             "num_key_value_heads": 2, "intermediate_size": 100, "vocab_size": 101,
             "max_position_embeddings": 11, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "tie_word_embeddings": False}
# Dynamic NTK scaling, trained at 7 positions: it acts on the longer sequences run with it.
LLAMA_DYNAMIC = dict(LLAMA_ODD, max_position_embeddings=7, rope_scaling={"type": "dynamic", "factor": 2.0})
# Qwen2: LLaMA's layers with biases on q, k and v; its head tied, as Qwen2-0.5B's.
QWEN2_ODD = dict(LLAMA_ODD, model_type="qwen2", tie_word_embeddings=True)
# Qwen3: 6 heads of 10 over a hidden of 48 (q 60 wide), q and k normalised per head.
QWEN3_ODD = dict(LLAMA_ODD, model_type="qwen3", head_dim=10)
# Mixtral: 5 experts 37 wide, top-2 renormalised, on every layer; a load-balancing loss
# weighed enough to move the routers visibly.
MIXTRAL_ODD = dict(LLAMA_ODD, model_type="mixtral", intermediate_size=37, num_local_experts=5, num_experts_per_tok=2,
                   router_aux_loss_coef=0.02)
# Qwen3-MoE: Qwen3's attention (6 heads of 10, QK-norm); every second layer a mixture
# (decoder_sparse_step 2) of 6 experts 19 wide, the top 2 renormalised.
QWEN3_MOE_ODD = dict(QWEN3_ODD, model_type="qwen3_moe", decoder_sparse_step=2, num_experts=6, num_experts_per_tok=2,
                     moe_intermediate_size=19, norm_topk_prob=True, router_aux_loss_coef=0.01)
# Mixtral dropping copies past each expert's capacity: 1.0 x an even share (Megatron-Core's
# --moe-expert-capacity-factor, a key transformers does not read).
MIXTRAL_CAPACITY = dict(MIXTRAL_ODD, moe_expert_capacity_factor=1.0)
# Qwen2-MoE: 3 layers, the first dense (mlp_only_layers); 7 experts 23 wide, top-3 not
# renormalised, one shared expert 41 wide behind its sigmoid gate.
QWEN2_MOE_ODD = dict(LLAMA_ODD, model_type="qwen2_moe", num_hidden_layers=3, mlp_only_layers=[0], num_experts=7,
                     num_experts_per_tok=3, moe_intermediate_size=23, shared_expert_intermediate_size=41,
                     norm_topk_prob=False, router_aux_loss_coef=0.01)
# GLM-4.5's mixture (DeepSeek-V3's router) on LLaMA-style attention: 3 layers, the first dense
# (first_k_dense_replace); 8 experts 19 wide in 4 groups, each token's top 3 within its best
# 2 groups by sigmoid score plus the balancing bias, renormalised and scaled by 2.5; one
# ungated shared expert; q, k, v biases and QK-norm; rotary positions on the first 6 of each
# head's 10 values (partial_rotary_factor; the released GLM-4.5 turns half); a balance loss added.
GLM4_MOE_ODD = dict(LLAMA_ODD, model_type="glm4_moe", num_hidden_layers=3, first_k_dense_replace=1,
                    n_routed_experts=8, num_experts_per_tok=3, moe_intermediate_size=19, n_shared_experts=1,
                    n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, attention_bias=True,
                    use_qk_norm=True, head_dim=10, partial_rotary_factor=0.6, router_aux_loss_coef=0.01)
# The same with DeepSeek's sequence-wise balance loss (seq_aux): each sequence's, averaged.
GLM4_MOE_SEQ_AUX = dict(GLM4_MOE_ODD, seq_aux=True)
# Mistral: LLaMA's layers with a sliding window of 4 keys over 11 tokens.
MISTRAL_WINDOW = dict(LLAMA_ODD, model_type="mistral", sliding_window=4)
# Llama 3.1's RoPE scaling, its bands placed so that this config's four frequencies cover all
# three: wavelengths 2 pi 100^(2i/8) = 6.3, 19.9, 62.8, 198.7 positions against 8 and 32.
LLAMA_ROPE_SCALED = dict(LLAMA_ODD, rope_theta=100.0,
                         rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 0.25,
                                       "high_freq_factor": 1.0, "original_max_position_embeddings": 8})

# YaRN (Qwen's long-context configs, its default betas 32 and 1): an original context of 64
# places the correction range inside the 5 pairs of a head of 10 (pair ends
# 5 log_10000(64 / (2 pi b)) = -0.62 and 1.26, truncated to 0 and 2: pair 0 kept, 1 half-way,
# 2-4 divided by 8); cos and sin x (0.1 ln 8 + 1). (At factors 2 and 4 this small mixture's
# training parts two FP32 runs by 1e-5 to 1e-4, hetflow and PyTorch alike from the float64
# run at 2: ill-conditioned there, as a near tie of two experts would make it.)
QWEN3_MOE_YARN = dict(QWEN3_MOE_ODD,
                      rope_scaling={"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64})
# YaRN untruncated (GPT-OSS's truncate false) over a head of 8: pair ends -1.32 and 1.09
# (8 ln(11 / pi) / (2 ln 100)), so pair 1 is 0.92 of the way; DeepSeek's mscale ratio
# (0.0707 ln 3 + 1) / (0.1 ln 3 + 1) scales cos and sin; the factor comes from the contexts
# (33 / 11 = 3).
LLAMA_YARN = dict(LLAMA_ODD, rope_theta=100.0, max_position_embeddings=33,
                  rope_scaling={"type": "yarn", "original_max_position_embeddings": 11, "beta_fast": 8,
                                "beta_slow": 0.5, "truncate": False, "mscale": 0.707, "mscale_all_dim": 1.0})


class Checks:
    def __init__(self):
        self.passed, self.failed = 0, 0

    def check(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print("ok   %s%s" % (name, (": " + detail) if detail else ""), flush=True)
        else:
            self.failed += 1
            print("FAIL %s%s" % (name, (": " + detail) if detail else ""), flush=True)

    def run(self, name, fn):
        try:
            fn()
        except Exception as e:  # a crash in a check is a failed check
            self.check(name, False, "raised %s: %s" % (type(e).__name__, e))


def self_test():
    torch.manual_seed(0)
    c = Checks()
    cfgs = {"gpt2": Config(GPT2_ODD), "llama": Config(LLAMA_ODD),
            "llama_tied": Config(dict(LLAMA_ODD, tie_word_embeddings=True)),
            "llama_rope_scaled": Config(LLAMA_ROPE_SCALED),
            "llama_linear": Config(dict(LLAMA_ODD, rope_scaling={"type": "linear", "factor": 2.5})),
            "llama_dynamic": Config(LLAMA_DYNAMIC),
            "mistral_window": Config(MISTRAL_WINDOW),
            "qwen2": Config(QWEN2_ODD),
            "qwen3": Config(QWEN3_ODD),
            "qwen3_attention_bias": Config(dict(QWEN3_ODD, attention_bias=True, tie_word_embeddings=True)),
            "llama_attention_bias": Config(dict(LLAMA_ODD, attention_bias=True)),
            "mixtral": Config(MIXTRAL_ODD), "qwen2_moe": Config(QWEN2_MOE_ODD), "qwen3_moe": Config(QWEN3_MOE_ODD),
            "glm4_moe": Config(GLM4_MOE_ODD), "glm4_moe_seq_aux": Config(GLM4_MOE_SEQ_AUX),
            "qwen3_moe_yarn": Config(QWEN3_MOE_YARN), "llama_yarn": Config(LLAMA_YARN)}

    # 1. The batched torch forward against the loop-based float64 numpy formulation.
    def forward_vs_loops(key):
        cfg = cfgs[key]
        W = make_init(cfg, 1)
        rng = np.random.RandomState(2)
        # Past the trained context where dynamic NTK scaling acts; the trained context elsewhere.
        T = cfg.max_pos + 4 if cfg.rope_scaling and cfg.rope_scaling["kind"] == "dynamic" else cfg.max_pos
        idx = rng.randint(cfg.vocab, size=(2, T))
        tgt = rng.randint(cfg.vocab, size=(2, T))
        ref = np_forward(cfg, W, idx)
        P64 = make_params(cfg, W, torch.float64)
        P32 = make_params(cfg, W, torch.float32)
        with torch.no_grad():
            l64 = forward(cfg, P64, torch.from_numpy(idx)).numpy()
            l32 = forward(cfg, P32, torch.from_numpy(idx)).numpy()
            loss32 = float(loss_fn(cfg, P32, torch.from_numpy(idx), torch.from_numpy(tgt)))
        e64, e32 = np.abs(l64 - ref).max(), np.abs(l32 - ref).max()
        eloss = abs(loss32 - np_cross_entropy(ref, tgt))
        c.check("%s forward: batched float64 == loops" % key, e64 < 1e-10, "max |diff| %.3g" % e64)
        c.check("%s forward: batched float32 ~= loops" % key, e32 < 2e-5, "max |diff| %.3g" % e32)
        c.check("%s loss: torch cross-entropy ~= numpy" % key, eloss < 2e-5, "|diff| %.3g" % eloss)
    for key in cfgs:
        c.run("%s forward" % key, lambda key=key: forward_vs_loops(key))

    # 2. Zero weights give uniform logits: loss ln V.
    def zero_loss(key):
        cfg = cfgs[key]
        W = {n: np.zeros(s, dtype=np.float32) for n, s, _ in cfg.param_specs()}
        idx = torch.randint(cfg.vocab, (3, 5))
        with torch.no_grad():
            loss = float(loss_fn(cfg, make_params(cfg, W), idx, torch.randint(cfg.vocab, (3, 5))))
        c.check("%s zero weights: loss == ln V" % key, abs(loss - math.log(cfg.vocab)) < 1e-6,
                "%.9g vs %.9g" % (loss, math.log(cfg.vocab)))
    for key in ("gpt2", "llama", "qwen3"):
        c.run("%s zero loss" % key, lambda key=key: zero_loss(key))

    # 3. A tiny GPT-2 checked by hand: 1 layer, C=2, 1 head, V=2, T=1, attention on one token is
    # the identity on v; with zero MLP and c_attn weights the block adds only the biases.
    def hand_gpt2():
        cfg = Config({"model_type": "gpt2", "n_layer": 1, "n_embd": 2, "n_head": 1, "n_positions": 2,
                      "vocab_size": 2, "n_inner": 2})
        W = {n: np.zeros(s, dtype=np.float32) for n, s, _ in cfg.param_specs()}
        W["transformer.wte.weight"] = np.array([[1, 0], [0, 1]], dtype=np.float32)
        W["transformer.h.0.attn.c_attn.bias"] = np.array([0, 0, 0, 0, 3, 1], dtype=np.float32)  # v = (3, 1)
        W["transformer.h.0.attn.c_proj.weight"] = np.eye(2, dtype=np.float32)
        W["transformer.ln_f.weight"] = np.ones(2, dtype=np.float32)
        # token 0: x = (1,0) + v (3,1) = (4,1); LN -> (1,-1)*(1/sqrt(1+eps/2.25)); logits = (1,-1)*s
        s = 1.0 / math.sqrt(1.0 + 1e-5 / 2.25)
        want = math.log(1 + math.exp(-2 * s))  # target 0
        with torch.no_grad():
            got = float(loss_fn(cfg, make_params(cfg, W), torch.tensor([[0]]), torch.tensor([[0]])))
        c.check("gpt2 hand-computed one-token loss", abs(got - want) < 1e-6, "%.9g vs %.9g" % (got, want))
        # GELU tanh at 1: 0.5 (1 + tanh(sqrt(2/pi) 1.044715)) = 0.841191990...
        g1 = float(gelu_tanh(torch.tensor(1.0, dtype=torch.float64)))
        c.check("GELU tanh(1) == 0.8411919906", abs(g1 - 0.8411919906082768) < 1e-12, "%.12g" % g1)
    c.run("gpt2 hand case", hand_gpt2)

    # 4. Causality: changing the last token changes no earlier logit.
    def causal(key):
        cfg = cfgs[key]
        P = make_params(cfg, make_init(cfg, 3))
        idx = torch.randint(cfg.vocab, (1, 8))
        idx2 = idx.clone()
        idx2[0, -1] = (idx2[0, -1] + 1) % cfg.vocab
        with torch.no_grad():
            a, b = forward(cfg, P, idx), forward(cfg, P, idx2)
        c.check("%s causal: earlier logits ignore a later token" % key,
                torch.equal(a[:, :-1], b[:, :-1]) and not torch.equal(a[:, -1], b[:, -1]))
    for key in ("gpt2", "llama"):
        c.run("%s causal" % key, lambda key=key: causal(key))

    # 4b. A sliding window of W keys: query t reads keys t-W+1 .. t, not t-W.
    def window():
        W, T, HS = 4, 11, 8
        q, k, v = (torch.randn(1, 1, T, HS, dtype=torch.float64) for _ in range(3))
        base = causal_attention(q, k, v, W)
        k2 = k.clone()
        k2[0, 0, 2] += 1.0  # key 2: in the windows of queries 2..5 only
        moved = (causal_attention(q, k2, v, W) - base).abs().amax(-1)[0, 0]
        c.check("sliding window: a key reaches exactly the W queries from it on",
                [t for t in range(T) if moved[t] > 0] == [2, 3, 4, 5], str(moved.tolist()))
        c.check("sliding window as long as the sequence is no window",
                torch.equal(causal_attention(q, k, v, T), causal_attention(q, k, v)))
    c.run("window", window)

    # 5. RoPE: position 0 identity, norms kept, scores depend only on relative position.
    def rope():
        HS, T = 8, 11
        cos, sin = rope_cos_sin(T, HS, 10000.0, torch.float64)
        x = torch.randn(1, 2, T, HS, dtype=torch.float64)
        y = apply_rope(x, cos, sin)
        c.check("RoPE position 0 is the identity", torch.equal(y[:, :, 0], x[:, :, 0]))
        e = (y.norm(dim=-1) - x.norm(dim=-1)).abs().max().item()
        c.check("RoPE keeps norms", e < 1e-12, "max |diff| %.3g" % e)
        q, k = torch.randn(HS, dtype=torch.float64), torch.randn(HS, dtype=torch.float64)
        qs = apply_rope(q.expand(1, 1, T, HS), cos, sin)[0, 0]
        ks = apply_rope(k.expand(1, 1, T, HS), cos, sin)[0, 0]
        d = max(abs(float(qs[m] @ ks[n] - qs[m - n] @ ks[0])) for m in range(T) for n in range(m + 1))
        c.check("RoPE scores depend on m - n only", d < 1e-12, "max |diff| %.3g" % d)
        ref = np_rope_pairs(x[0].transpose(0, 1).reshape(T, 2 * HS).numpy(), 2, HS, 10000.0)
        e2 = np.abs(y[0].transpose(0, 1).reshape(T, 2 * HS).numpy() - ref).max()
        c.check("RoPE rotate-half == pairwise rotation of (i, i+d/2)", e2 < 1e-12, "max |diff| %.3g" % e2)
        # Partial rotary (6 of 8 values): the pairs (i, i+3) at a 6-value head's frequencies turn,
        # the last two values pass through; the loop formulation agrees.
        pcos, psin = rope_cos_sin(T, 6, 10000.0, torch.float64)
        py = apply_rope(x, pcos, psin)
        c.check("partial RoPE leaves the values past the rotary part", torch.equal(py[..., 6:], x[..., 6:]))
        c.check("partial RoPE turns the rest as a head of that size", torch.equal(py[..., :6], apply_rope(x[..., :6], pcos, psin)))
        pref = np_rope_pairs(x[0].transpose(0, 1).reshape(T, 2 * HS).numpy(), 2, HS, 10000.0, rotary=6)
        e3 = np.abs(py[0].transpose(0, 1).reshape(T, 2 * HS).numpy() - pref).max()
        c.check("partial RoPE rotate-half == pairwise rotation of (i, i+r/2)", e3 < 1e-12, "max |diff| %.3g" % e3)
        # llama3's bands: the shortest wavelength kept, the long ones divided by the factor,
        # the one between strictly between; no jump at either band edge.
        rs = cfgs["llama_rope_scaled"]
        plain = rope_inv_freq(T, HS, rs.theta)
        scaled = rope_inv_freq(T, HS, rs.theta, rs.rope_scaling)
        c.check("llama3 keeps the high band, divides the low band",
                scaled[0] == plain[0] and torch.allclose(scaled[2:], plain[2:] / 4, rtol=1e-15, atol=0))
        c.check("llama3 blends the middle band", plain[1] / 4 < scaled[1] < plain[1])
        for edge, want in ((8.0, 1.0), (32.0, 0.25)):  # wavelength at a band edge -> its limit
            theta = (edge / (2 * math.pi)) ** (HS / 2.0)  # pair 1's wavelength is 2 pi theta^(2/HS)
            got = rope_inv_freq(T, HS, theta, rs.rope_scaling)[1] / rope_inv_freq(T, HS, theta)[1]
            c.check("llama3 continuous at wavelength %g" % edge, abs(got - want) < 1e-12, "ratio %.15g" % got)
        lin = cfgs["llama_linear"]
        c.check("linear scaling divides every frequency",
                torch.allclose(rope_inv_freq(T, HS, lin.theta, lin.rope_scaling),
                               rope_inv_freq(T, HS, lin.theta) / 2.5, rtol=1e-15, atol=0))
        # YaRN: the ramp's pairs as the comments on its configs count them, transformers'
        # attention factors, and the torch and per-pair formulations alike (truncated or not).
        untruncated = 1 / (8 * math.log(11 / math.pi) / (2 * math.log(100)))
        for key, want in (("qwen3_moe_yarn", [0.0, 0.5, 1.0, 1.0, 1.0]), ("llama_yarn", [0.0, untruncated, 1.0, 1.0])):
            y = cfgs[key]
            d = y.rotary_dim
            base = rope_inv_freq(T, d, y.theta)
            got = rope_inv_freq(T, d, y.theta, y.rope_scaling)
            f = y.rope_scaling["factor"]
            ramp = [float((base[i] - got[i]) / (base[i] - base[i] / f)) for i in range(d // 2)]
            c.check("yarn ramps %s's pairs as counted" % key, max(abs(a - b) for a, b in zip(ramp, want)) < 1e-12,
                    str(ramp))
            loops = [np_frequency(i, d, y.theta, y.rope_scaling, T, y.max_pos) for i in range(d // 2)]
            e = max(abs(float(got[i]) - loops[i]) / loops[i] for i in range(d // 2))
            c.check("yarn's frequencies: vectorised == per pair (%s)" % key, e < 1e-14, "max rel %.3g" % e)
            ycos, ysin = rope_cos_sin(T, d, y.theta, torch.float64, y.rope_scaling)
            xy = torch.randn(1, 2, T, d, dtype=torch.float64)
            yy = apply_rope(xy, ycos, ysin)
            ny = np_rope_pairs(xy[0].transpose(0, 1).reshape(T, 2 * d).numpy(), 2, d, y.theta, y.rope_scaling)
            e4 = np.abs(yy[0].transpose(0, 1).reshape(T, 2 * d).numpy() - ny).max()
            c.check("yarn rotate-half == scaled pairwise rotation (%s)" % key, e4 < 1e-12, "max |diff| %.3g" % e4)
        # A context too short for the betas (L = 4 over a head of 8 at theta 1e4, untruncated:
        # the range ends at -1.70 and -0.20, clamped to 0 and -0.20) ramps as transformers'
        # clamp makes it, pair by pair too: nothing interpolated.
        short = yarn_parameters({"type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4,
                                 "truncate": False}, 8)
        got = rope_inv_freq(T, 8, 10000.0, short)
        c.check("yarn with an inverted range keeps every frequency",
                torch.allclose(got, rope_inv_freq(T, 8, 10000.0), rtol=1e-15, atol=0) and
                all(abs(np_frequency(i, 8, 10000.0, short, T, 8) - float(got[i])) <= 1e-15 * float(got[i])
                    for i in range(4)), str(got.tolist()))
        c.check("yarn's default attention factor is 0.1 ln(factor) + 1",
                abs(cfgs["qwen3_moe_yarn"].rope_scaling["attention_factor"] - (0.1 * math.log(8) + 1)) < 1e-15)
        c.check("yarn's factor from the contexts and DeepSeek's mscale ratio",
                cfgs["llama_yarn"].rope_scaling["factor"] == 3.0 and
                abs(cfgs["llama_yarn"].rope_scaling["attention_factor"] -
                    (0.0707 * math.log(3) + 1) / (0.1 * math.log(3) + 1)) < 1e-15)
        dyn = cfgs["llama_dynamic"]
        c.check("dynamic NTK scaling is plain up to the trained context",
                torch.equal(rope_inv_freq(7, HS, dyn.theta, dyn.rope_scaling, 7), rope_inv_freq(7, HS, dyn.theta)))
        # Beyond it, base 10000 (2 * 14/7 - 1)^(8/6) = 10000 * 3^(4/3).
        c.check("dynamic NTK scaling raises the base beyond it",
                torch.allclose(rope_inv_freq(14, HS, dyn.theta, dyn.rope_scaling, 7),
                               rope_inv_freq(14, HS, 10000.0 * 3 ** (4 / 3)), rtol=1e-14, atol=0))
        # The loop formulation's frequencies (np_forward's) against the vectorised ones.
        worst = 0.0
        for cfg in (rs, lin, dyn):
            for T2 in (7, 14):
                want = rope_inv_freq(T2, HS, cfg.theta, cfg.rope_scaling, cfg.max_pos)
                for i in range(HS // 2):
                    got = np_frequency(i, HS, cfg.theta, cfg.rope_scaling, T2, cfg.max_pos)
                    worst = max(worst, abs(got - float(want[i])) / float(want[i]))
        c.check("RoPE frequencies: loops == vectorised for llama3, linear, dynamic", worst < 1e-13,
                "worst relative %.3g" % worst)
    c.run("rope", rope)

    # 6. Gradients: autograd against central differences in float64, entries of every tensor
    # (of the objective: the cross-entropy and any load-balancing losses).
    def gradcheck(key):
        cfg = cfgs[key]
        P = make_params(cfg, make_init(cfg, 4), torch.float64)
        idx, tgt = torch.randint(cfg.vocab, (2, 6)), torch.randint(cfg.vocab, (2, 6))
        def total():  # what training minimises: the mixtures' load-balancing losses too
            return objective(cfg, P, idx, tgt)[1]
        total().backward()
        rng = np.random.RandomState(5)
        worst = 0.0
        for n, p in P.items():
            for _ in range(2):
                j = rng.randint(p.numel())
                h = 1e-5
                with torch.no_grad():
                    old = p.view(-1)[j].item()
                    p.view(-1)[j] = old + h
                    lp = float(total())
                    p.view(-1)[j] = old - h
                    lm = float(total())
                    p.view(-1)[j] = old
                # (an expert no token chose has no gradient: zero)
                fd, ad = (lp - lm) / (2 * h), 0.0 if p.grad is None else p.grad.view(-1)[j].item()
                worst = max(worst, abs(fd - ad) / max(1e-4, abs(fd)))
        c.check("%s gradients == central differences" % key, worst < 1e-5, "worst rel err %.3g" % worst)
    for key in cfgs:
        c.run("%s gradcheck" % key, lambda key=key: gradcheck(key))

    # 7. A tied head is one parameter whose gradient is the embedding's plus the head's.
    def tied():
        cfg_t, cfg_u = cfgs["llama_tied"], cfgs["llama"]
        W = make_init(cfg_t, 6)
        Wu = dict(W)
        Wu["lm_head.weight"] = W["model.embed_tokens.weight"].copy()
        Pt, Pu = make_params(cfg_t, W, torch.float64), make_params(cfg_u, Wu, torch.float64)
        idx, tgt = torch.randint(cfg_t.vocab, (2, 7)), torch.randint(cfg_t.vocab, (2, 7))
        loss_fn(cfg_t, Pt, idx, tgt).backward()
        loss_fn(cfg_u, Pu, idx, tgt).backward()
        gsum = Pu["model.embed_tokens.weight"].grad + Pu["lm_head.weight"].grad
        e = (Pt["model.embed_tokens.weight"].grad - gsum).abs().max().item()
        c.check("tied embedding gradient == embedding + head gradients", e < 1e-12, "max |diff| %.3g" % e)
        c.check("tied config has no lm_head.weight", all(n != "lm_head.weight" for n, _, _ in cfg_t.param_specs()))
    c.run("tied", tied)

    # 8. AdamW and clipping against the formulas written out.
    def adamw():
        cfg = cfgs["gpt2"]
        W = make_init(cfg, 7)
        P = make_params(cfg, W)
        lr, b1, b2, eps, wd, clip = 3e-3, 0.9, 0.95, 1e-8, 0.1, 0.5
        opt = make_optimizer(cfg, P, lr, b1, b2, eps, wd)
        ref = {n: torch.tensor(W[n], dtype=torch.float64) for n in P}
        m = {n: torch.zeros_like(ref[n]) for n in P}
        v = {n: torch.zeros_like(ref[n]) for n in P}
        toks = make_tokens(cfg.vocab, 200, 8)
        worst, worst_clip = 0.0, 0.0
        for step, p in enumerate(batch_positions(len(toks), 2, 12, 3), start=1):
            idx, tgt = batch_at(toks, p, 2, 12)
            opt.zero_grad()
            loss_fn(cfg, P, idx, tgt).backward()
            g = {n: P[n].grad.detach().double().clone() for n in P}
            total = math.sqrt(sum(float((x * x).sum()) for x in g.values()))
            coef = min(1.0, clip / (total + 1e-6))
            torch.nn.utils.clip_grad_norm_(list(P.values()), clip)
            worst_clip = max(worst_clip, max((P[n].grad.double() - g[n] * coef).abs().max().item() for n in P))
            opt.step()
            for n in P:
                gn = g[n] * coef
                decay = wd if ref[n].dim() >= 2 else 0.0
                ref[n] = ref[n] * (1 - lr * decay)
                m[n] = b1 * m[n] + (1 - b1) * gn
                v[n] = b2 * v[n] + (1 - b2) * gn * gn
                mhat = m[n] / (1 - b1 ** step)
                denom = v[n].sqrt() / math.sqrt(1 - b2 ** step) + eps
                ref[n] = ref[n] - lr * mhat / denom
                # compare against the float64 replay of the same float32 gradients
            worst = max(worst, max((P[n].detach().double() - ref[n]).abs().max().item() for n in P))
            ref = {n: P[n].detach().double().clone() for n in P}  # resync: compare one step at a time
        c.check("clip_grad_norm_ == g * min(1, max / (norm + 1e-6))", worst_clip < 1e-7, "%.3g" % worst_clip)
        c.check("AdamW step == decoupled-decay Adam formula", worst < 1e-6, "max |diff| %.3g" % worst)
    c.run("adamw", adamw)

    # 9. Data loader positions, wrap included.
    def loader():
        got = batch_positions(80, 3, 12, 5)
        c.check("loader positions with wrap", got == [0, 36, 0, 36, 0], str(got))
        got = batch_positions(109, 3, 12, 4)  # 72 + 37 = 109 fits exactly
        c.check("loader takes a batch that ends exactly at the last token", got == [0, 36, 72, 0], str(got))
        toks = np.arange(40)
        idx, tgt = batch_at(toks, 3, 2, 4)
        c.check("loader inputs/targets",
                idx.tolist() == [[3, 4, 5, 6], [7, 8, 9, 10]] and tgt.tolist() == [[4, 5, 6, 7], [8, 9, 10, 11]])
    c.run("loader", loader)

    # 10. safetensors: round trip, padding, F16/BF16 reading; token file round trip.
    def files():
        with tempfile.TemporaryDirectory() as d:
            a = np.random.RandomState(9).randn(3, 5).astype(np.float32)
            path = os.path.join(d, "a.safetensors")
            write_safetensors(path, {"x": a, "y.z": np.arange(7, dtype=np.float32)})
            with open(path, "rb") as f:
                blob = f.read()
            (n,) = struct.unpack("<Q", blob[:8])
            back = read_safetensors(path)
            c.check("safetensors round trip (header padded to 8)",
                    n % 8 == 0 and np.array_equal(back["x"], a) and np.array_equal(back["y.z"], np.arange(7)))
            vals = np.array([1.0, -2.5, 0.1, 65504.0], dtype=np.float32)
            f16 = vals.astype("<f2").tobytes()
            bf16 = (vals.view(np.uint32) >> 16).astype("<u2").tobytes()
            h = json.dumps({"h": {"dtype": "F16", "shape": [4], "data_offsets": [0, 8]},
                            "b": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [8, 16]}}).encode()
            with open(path, "wb") as f:
                f.write(struct.pack("<Q", len(h)) + h + f16 + bf16)
            back = read_safetensors(path)
            want_b = (np.frombuffer(bf16, dtype="<u2").astype(np.uint32) << 16).view(np.float32).reshape(2, 2)
            c.check("safetensors reads F16 and BF16",
                    np.array_equal(back["h"], vals.astype(np.float16).astype(np.float32))
                    and np.array_equal(back["b"], want_b) and back["b"][0, 0] == 1.0 and back["b"][0, 1] == -2.5)
            tpath = os.path.join(d, "t.bin")
            toks = make_tokens(97, 50, 1)
            write_tokens(tpath, toks)
            c.check("token file round trip", np.array_equal(read_tokens(tpath), toks)
                    and os.path.getsize(tpath) == 1024 + 100)
    c.run("files", files)

    # 11. The command line end to end on the two odd configs: init, 3 steps, outputs read back.
    def end_to_end(key, cfgdict, B, T):
        me = os.path.abspath(__file__)
        with tempfile.TemporaryDirectory() as d:
            cpath, ipath, tpath = (os.path.join(d, x) for x in ("c.json", "init.safetensors", "t.bin"))
            with open(cpath, "w") as f:
                json.dump(cfgdict, f)
            cfg = Config(cfgdict)

            def run(*args):
                r = subprocess.run([sys.executable, me, "--config", cpath] + list(args),
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
                if r.returncode != 0:
                    raise RuntimeError("exit %d: %s" % (r.returncode, r.stderr.strip()))
                return r.stdout
            run("--make-init", ipath, "--seed", "11")
            # 3 steps of B*T, with a file short enough that the third step wraps to position 0
            run("--make-tokens", tpath, "--num-tokens", str(2 * B * T + B * T // 2), "--seed", "12")
            outs = []
            for rep in range(2):
                wpath, lpath = os.path.join(d, "w%d.safetensors" % rep), os.path.join(d, "l%d.json" % rep)
                stdout = run("--init", ipath, "--tokens", tpath, "--batch", str(B), "--seq", str(T), "--steps", "3",
                             "--lr", "1e-2", "--weight-decay", "0.1", "--clip-grad", "1.0",
                             "--out-weights", wpath, "--out-losses", lpath)
                with open(lpath) as f:
                    losses = json.load(f)["losses"]
                with open(wpath, "rb") as f:
                    outs.append((f.read(), losses))
            init = check_weights(cfg, read_safetensors(ipath), "init")
            final = check_weights(cfg, read_safetensors(wpath), "final")
            c.check("%s e2e: prints one line per step" % key, len(stdout.strip().splitlines()) == 3)
            c.check("%s e2e: init holds every tensor" % key, len(init) == len(cfg.param_specs()))
            c.check("%s e2e: final weights read back, all finite, all moved" % key,
                    all(np.isfinite(final[n]).all() and not np.array_equal(final[n], init[n]) for n in final))
            # (the third step reads the first's batch again, after two updates)
            c.check("%s e2e: losses fall below the first" % key, len(losses) == 3 and max(losses[1:]) < losses[0],
                    str(["%.6f" % x for x in losses]))
            c.check("%s e2e: step 0 loss near ln V" % key, abs(losses[0] - math.log(cfg.vocab)) < 0.1,
                    "%.6f vs %.6f" % (losses[0], math.log(cfg.vocab)))
            c.check("%s e2e: two runs bit-identical" % key, outs[0] == outs[1])
            # the step-0 loss from the CLI equals an in-process forward on the init weights
            toks = read_tokens(tpath)
            idx, tgt = batch_at(toks, 0, B, T)
            with torch.no_grad():
                l0 = float(loss_fn(cfg, make_params(cfg, init), idx, tgt))
            c.check("%s e2e: step-0 loss == in-process forward" % key, l0 == losses[0])
    c.run("gpt2 e2e", lambda: end_to_end("gpt2_odd", GPT2_ODD, 3, 12))
    c.run("llama e2e", lambda: end_to_end("llama_odd", LLAMA_ODD, 3, 10))
    c.run("mixtral e2e", lambda: end_to_end("mixtral_odd", MIXTRAL_ODD, 3, 10))

    # 11b. The load-balancing loss: 1 when the router is uniform (every probability 1/E, the
    # N K choices spread anyhow: E / (N^2 K) (N / E) N K), and its gradient moves the router.
    def load_balancing():
        cfg = cfgs["mixtral"]
        W = make_init(cfg, 4)
        for name in W:
            if name.endswith("block_sparse_moe.gate.weight"):
                W[name] = np.zeros_like(W[name])
        P = make_params(cfg, W, torch.float64)
        idx = torch.from_numpy(np.random.RandomState(6).randint(cfg.vocab, size=(2, 7)))
        aux = []
        forward(cfg, P, idx, aux)
        c.check("load-balancing loss of a uniform router is 1 per layer", len(aux) == cfg.n_layer
                and all(abs(float(a) - 1.0) < 1e-12 for a in aux), str([float(a) for a in aux]))
        sum(aux).backward()
        router = P["model.layers.0.block_sparse_moe.gate.weight"].grad
        c.check("its gradient reaches the router", router is not None and float(router.abs().max()) > 0)
    c.run("load balancing", load_balancing)

    # 11b'. The sequence-wise loss is the micro-batch's for one sequence, and the mean of each
    # sequence's alone for several.
    def sequence_wise():
        whole, per_seq = cfgs["glm4_moe"], cfgs["glm4_moe_seq_aux"]
        P = make_params(whole, make_init(whole, 5), torch.float64)
        idx = torch.from_numpy(np.random.RandomState(9).randint(whole.vocab, size=(3, 7)))
        def aux(cfg, x):
            out = []
            with torch.no_grad():
                forward(cfg, P, x, out)
            return [float(a) for a in out]
        c.check("one sequence: the sequence-wise loss is the micro-batch's",
                max(abs(a - b) for a, b in zip(aux(per_seq, idx[:1]), aux(whole, idx[:1]))) < 1e-12)
        alone = [aux(per_seq, idx[b:b + 1]) for b in range(3)]
        mean = [sum(a[i] for a in alone) / 3 for i in range(len(alone[0]))]
        together = aux(per_seq, idx)
        c.check("three sequences: the mean of each one's", max(abs(a - b) for a, b in zip(together, mean)) < 1e-12,
                str(together) + " vs " + str(mean))
        c.check("three sequences: not the micro-batch's", max(abs(a - b) for a, b in zip(together, aux(whole, idx))) > 1e-6)
    c.run("sequence-wise load balancing", sequence_wise)

    # 11c. Token dropping past an expert's capacity: the largest weights kept, a tie to the
    # earlier token; a capacity of every copy drops none.
    def capacity():
        chosen = torch.tensor([[0, 1], [0, 2], [0, 1], [1, 0]])
        weights = torch.tensor([[0.6, 0.4], [0.5, 0.5], [0.6, 0.4], [0.7, 0.3]])
        keep = capacity_mask(weights, chosen, 3, 2).tolist()
        want = [[True, True], [False, True], [True, False], [True, False]]
        c.check("capacity keeps each expert's largest weights, ties to the earlier token", keep == want, str(keep))
        c.check("a capacity of every copy drops none", bool(capacity_mask(weights, chosen, 3, 8).all()))
        cfg = Config(MIXTRAL_CAPACITY)
        P = make_params(cfg, make_init(cfg, 2))
        idx = torch.from_numpy(np.random.RandomState(8).randint(cfg.vocab, size=(4, 11)))
        with torch.no_grad():
            dropping, dropless = forward(cfg, P, idx), forward(Config(MIXTRAL_ODD), P, idx)
        c.check("the capacity config drops copies", not torch.equal(dropping, dropless))
    c.run("capacity", capacity)

    # 12. The example configs beside this script are the ones checked above.
    def examples():
        here = os.path.dirname(os.path.abspath(__file__))
        for fname, d in (("gpt2_odd.json", GPT2_ODD), ("llama_odd.json", LLAMA_ODD),
                         ("llama_rope_scaled.json", LLAMA_ROPE_SCALED), ("mistral_window.json", MISTRAL_WINDOW),
                         ("llama_dynamic.json", LLAMA_DYNAMIC), ("qwen2_odd.json", QWEN2_ODD),
                         ("qwen3_odd.json", QWEN3_ODD), ("mixtral_odd.json", MIXTRAL_ODD),
                         ("qwen2_moe_odd.json", QWEN2_MOE_ODD), ("mixtral_capacity.json", MIXTRAL_CAPACITY),
                         ("qwen3_moe_odd.json", QWEN3_MOE_ODD), ("glm4_moe_odd.json", GLM4_MOE_ODD),
                         ("glm4_moe_seq_aux.json", GLM4_MOE_SEQ_AUX), ("qwen3_moe_yarn.json", QWEN3_MOE_YARN),
                         ("llama_yarn.json", LLAMA_YARN)):
            path = os.path.join(here, fname)
            if os.path.exists(path):
                with open(path) as f:
                    c.check("%s matches the self-tested config" % fname, json.load(f) == d)
    c.run("example configs", examples)

    # 12b. Both of llm.c's token layouts read back what was written; uint32 carries tokens past 65535.
    def token_formats():
        with tempfile.TemporaryDirectory() as d:
            toks = np.array([0, 7, 65535, 3, 41], dtype=np.int64)
            for fmt, width in (("gpt-2", 2), ("llama-3", 4)):
                path = os.path.join(d, fmt + ".bin")
                write_tokens(path, toks, fmt)
                c.check("tokens %s: round trip" % fmt, np.array_equal(read_tokens(path), toks))
                c.check("tokens %s: %d bytes a token" % (fmt, width), os.path.getsize(path) == 1024 + width * toks.size)
            wide = os.path.join(d, "wide.bin")
            write_tokens(wide, [65536, 151935], "llama-3")
            c.check("tokens llama-3: past 65535", list(read_tokens(wide)) == [65536, 151935])
            try:
                write_tokens(wide, [65536], "gpt-2")
                c.check("tokens gpt-2: refuses 65536", False)
            except InputError:
                c.check("tokens gpt-2: refuses 65536", True)
    c.run("token formats", token_formats)

    # 13. Bad input is refused with a message.
    def refusals():
        bad = [dict(GPT2_ODD, n_head=5), dict(LLAMA_ODD, num_key_value_heads=4), {"model_type": "bert"},
               dict(GPT2_ODD, n_layer=0), dict(GLM4_MOE_ODD, partial_rotary_factor=0.3),  # 3 rotary values
               dict(GLM4_MOE_ODD, partial_rotary_factor=1.5)]
        refused = 0
        for d in bad:
            try:
                Config(d)
            except InputError:
                refused += 1
        c.check("bad configs refused", refused == len(bad), "%d of %d" % (refused, len(bad)))
        cfg = cfgs["llama"]
        W = make_init(cfg, 1)
        W.pop("model.norm.weight")
        try:
            check_weights(cfg, W)
            c.check("missing tensor refused", False)
        except InputError as e:
            c.check("missing tensor refused", "model.norm.weight" in str(e))
    c.run("refusals", refusals)

    print("self-test: %d passed, %d failed" % (c.passed, c.failed))
    return 0 if c.failed == 0 else 1


# ----------------------------------------------------------------------------------------------
# Command line


def parse_args(argv):
    ap = argparse.ArgumentParser(description="Reference FP32 trainer for GPT-2 / LLaMA decoders (test oracle).")
    ap.add_argument("--config", help="HuggingFace-style config.json (model_type gpt2 or llama)")
    ap.add_argument("--self-test", action="store_true", help="run the internal checks; exit 0 if all pass")
    ap.add_argument("--make-init", metavar="OUT", help="write a seeded random initialisation (safetensors) and exit")
    ap.add_argument("--make-tokens", metavar="OUT", help="write a seeded llm.c token file and exit")
    ap.add_argument("--num-tokens", type=int, default=1024, help="tokens for --make-tokens (1024)")
    ap.add_argument("--token-format", choices=("gpt-2", "llama-3"), default="gpt-2",
                    help="--make-tokens' layout: llm.c's gpt-2 (uint16) or llama-3 (uint32)")
    ap.add_argument("--seed", type=int, default=0, help="seed for --make-init / --make-tokens / bench data (0)")
    ap.add_argument("--init", help="initial weights, safetensors with HuggingFace names (F32/F16/BF16)")
    ap.add_argument("--tokens", help="token file in llm.c's format (256 int32 header, uint16 tokens)")
    ap.add_argument("--batch", type=int, help="global batch B, sequences per step")
    ap.add_argument("--seq", type=int, help="sequence length T")
    ap.add_argument("--steps", type=int, default=1, help="training steps K (1)")
    ap.add_argument("--lr", type=float, default=1e-3, help="learning rate, the schedule's peak (1e-3)")
    ap.add_argument("--lr-decay-style", choices=("constant", "linear", "cosine", "inverse-square-root"),
                    default="constant", help="Megatron's schedule (constant)")
    ap.add_argument("--lr-warmup-iters", type=int, default=0, help="linear warm-up steps from 0 (0)")
    ap.add_argument("--lr-decay-iters", type=int, default=None, help="the step the decay ends (--steps)")
    ap.add_argument("--min-lr", type=float, default=0.0, help="the rate the decay ends at (0)")
    ap.add_argument("--adam-beta1", type=float, default=0.9)
    ap.add_argument("--adam-beta2", type=float, default=0.999)
    ap.add_argument("--adam-eps", type=float, default=1e-8)
    ap.add_argument("--weight-decay", type=float, default=0.0,
                    help="AdamW decoupled decay on tensors of 2+ dimensions only (0)")
    ap.add_argument("--clip-grad", type=float, default=0.0, help="global gradient-norm clip, 0 = off (0)")
    ap.add_argument("--moe-router-bias-update-rate", type=float, default=1e-3,
                    help="a sigmoid router's bias step per training step, by the sign of each expert's load "
                         "below the mean (1e-3, Megatron-Core's)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1)")
    ap.add_argument("--float64", action="store_true",
                    help="train in float64 (the exact answer FP32 runs are measured from); weights still written F32")
    ap.add_argument("--out-weights", help="write the final FP32 weights here (safetensors)")
    ap.add_argument("--out-moments", metavar="DIR",
                    help="write AdamW's final moments as DIR/exp_avg.safetensors and DIR/exp_avg_sq.safetensors "
                         "(HuggingFace names and shapes, as a hetflow training checkpoint holds them)")
    ap.add_argument("--out-losses", help="write {\"losses\": [...], \"grad_norms\": [...]} here (and "
                    "\"load_balancing_losses\" for a mixture of experts)")
    ap.add_argument("--bench-steps", type=int,
                    help="time N steps after 2 warm-up steps; print one JSON line; --init/--tokens optional")
    return ap.parse_args(argv)


def main(argv):
    a = parse_args(argv)
    torch.set_num_threads(max(1, a.threads))
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(a.seed)
    torch.use_deterministic_algorithms(True)

    if a.self_test:
        return self_test()
    if not a.config:
        raise InputError("--config is required")
    cfg = Config.load(a.config)

    if a.make_init:
        write_safetensors(a.make_init, make_init(cfg, a.seed))
        return 0
    if a.make_tokens:
        if a.num_tokens < 2:
            raise InputError("--num-tokens must be at least 2")
        write_tokens(a.make_tokens, make_tokens(cfg.vocab, a.num_tokens, a.seed), a.token_format)
        return 0

    if a.batch is None or a.seq is None or a.batch < 1 or a.seq < 1:
        raise InputError("--batch and --seq (positive) are required")
    if a.seq > cfg.max_pos and cfg.model_type == "gpt2":
        raise InputError("--seq %d exceeds the model's %d positions" % (a.seq, cfg.max_pos))
    if a.steps < 1:
        raise InputError("--steps must be at least 1")

    if a.bench_steps is not None:
        if a.bench_steps < 1:
            raise InputError("--bench-steps must be at least 1")
        weights = check_weights(cfg, read_safetensors(a.init), a.init) if a.init else make_init(cfg, a.seed)
        n = (2 + a.bench_steps) * a.batch * a.seq + 1
        tokens = read_tokens(a.tokens) if a.tokens else make_tokens(cfg.vocab, n, a.seed)
        check_token_range(cfg, tokens, a.tokens or "bench tokens")
        bench(cfg, weights, tokens, a)
        return 0

    if not a.init or not a.tokens:
        raise InputError("training needs --init and --tokens")
    weights = check_weights(cfg, read_safetensors(a.init), a.init)
    tokens = read_tokens(a.tokens)
    check_token_range(cfg, tokens, a.tokens)
    P, losses, norms, balances, opt = train(cfg, weights, tokens, a)
    if a.out_weights:
        write_safetensors(a.out_weights, {n: P[n] for n, _, _ in cfg.param_specs()})
    if a.out_moments:
        os.makedirs(a.out_moments, exist_ok=True)
        for moment in ("exp_avg", "exp_avg_sq"):
            write_safetensors(os.path.join(a.out_moments, moment + ".safetensors"),
                              {n: torch.zeros_like(P[n]) if role == "balance" else opt.state[P[n]][moment]
                               for n, _, role in cfg.param_specs()})
    if a.out_losses:
        with open(a.out_losses, "w") as f:
            out = {"losses": losses, "grad_norms": norms}
            if cfg.moe is not None:  # each step's load-balancing loss, the mean over the MoE layers
                out["load_balancing_losses"] = balances
            json.dump(out, f)
            f.write("\n")
    return 0


def check_token_range(cfg, tokens, what):
    if tokens.size and tokens.max() >= cfg.vocab:
        raise InputError("%s: token %d is outside the vocabulary of %d" % (what, tokens.max(), cfg.vocab))


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except InputError as e:
        print("train_reference: %s" % e, file=sys.stderr)
        sys.exit(2)
