#!/usr/bin/python3
"""Writes models/testdata/families/NAME/: tiny decoders of the Hugging Face families Conveyor builds, with
reference logits.

Each case is a seeded random checkpoint of one Hugging Face decoder family in the layout of a real
checkpoint directory, for checking Conveyor's ONNX graph builder against plain PyTorch:

  config.json        as transformers writes it for that model_type (pretty-printed, sorted keys)
  model.safetensors  float32 tensors under the family's Hugging Face parameter names (no lm_head.weight
                     when tie_word_embeddings is set), written by the small writer below
  reference.json     {"model", "sequences", "context", "logits"}: three token sequences (lengths 13, 6, 21,
                     ids uniform in [0, vocab) from a seeded generator), each run alone (batch of one, no
                     padding, positions 0..len-1); the context the built model must serve; logits[sequence]
                     [position][vocab], rounded to 6 decimals

Cases: llama3 (llama3 rope scaling, tied, GQA), llama_linear (linear rope scaling with the older "type"
key, untied), qwen2 (q/k/v biases), qwen3 (per-head q_norm/k_norm, explicit head_dim), mistral (sliding
window 5, one kv head), gemma (embeddings times sqrt(hidden), RMSNorm with 1 + weight, tanh GELU MLP,
head_dim != hidden/heads), phi3 (fused qkv_proj and gate_up_proj, sliding window 7), phi4mini (phi3
with partial_rotary_factor 0.75, tied), phi35 (phi4mini with longrope scaling: short factors and the
attention factor sqrt(1 + ln(max/original) / ln(original)) on cos and sin), gemma2 (sliding and full
layers alternating, attention and final logit soft-caps, four norms per layer, query_pre_attn_scalar),
smollm3 (a layer without rotary, GQA), qwen2_swa and qwen3_swa (use_sliding_window: from
max_window_layers on, or as layer_types says), gemma3 (gemma3_text: q/k norms, sliding layers turned by
rope_local_base_freq, full layers by rope_theta with linear scaling) and gemma3_vision (the gemma3 model
as a multimodal checkpoint stores it: text_config nested with Gemma3TextConfig's defaults left out,
tensors under language_model.model.*, a vision tower to ignore).

The math is plain PyTorch in float32 (no `transformers`), following transformers' modeling_<model_type>.py
with eager attention: RMSNorm computed in float32, rotate_half RoPE with cos/sin from float32 inv_freq
(modeling_rope_utils: default, linear and llama3; per layer: none on a NoPE layer, the local base on
Gemma 3's sliding layers), scores times head_dim**-0.5 (query_pre_attn_scalar**-0.5 for Gemma 2/3), then
the soft-cap c*tanh(s/c), then an additive causal (and sliding-window: key j visible to query i iff
i - window < j <= i, the window set per layer as the transformers configs fill in layer_types) mask of
finfo(float32).min, softmax in float32, grouped-query heads (query head h reads kv head
h // (heads / kv_heads)).

After writing, the script checks itself and prints the results: the files read back reproduce the
logits; an independent float64 NumPy implementation (explicit loops, deriving each layer's window and
rotary from config.json on its own) agrees; and each family's special feature really changes the logits:
rope scaling, biases, q/k norms, windows (dropped, and each window one larger and one smaller), Gemma's
norm/scale/activation, Gemma 2/3's four norms and query_pre_attn_scalar, each soft-cap turned off,
Gemma 3's local rotary base, rotary on SmolLM3's NoPE layer, phi3's fused projections, partial rotary.

Run with Debian's PyTorch (python3-torch) from the repository root:

  /usr/bin/python3 models/testdata/families/gen_families.py
"""

import copy
import json
import math
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "train"))
from llama import load_safetensors, save_safetensors  # noqa: E402  (models/train/llama.py)
SEQ_LENS = (13, 6, 21)


# ---------------------------------------------------------------------------------------------------
# Configurations


def _base(model_type, arch, **kw):
    cfg = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": 128,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "max_position_embeddings": 512,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        "use_cache": True,
        "torch_dtype": "float32",
    }
    cfg.update(kw)
    return cfg


def _llama(**kw):
    return _base("llama", "LlamaForCausalLM", head_dim=16, attention_bias=False, mlp_bias=False, pretraining_tp=1, **kw)


def _phi3(**kw):
    kw.setdefault("original_max_position_embeddings", 512)
    return _base(
        "phi3",
        "Phi3ForCausalLM",
        embd_pdrop=0.0,
        resid_pdrop=0.0,
        pad_token_id=2,  # Phi3Config's default 32000 would not fit the tiny vocabulary
        **kw,
    )


def _gemma2(**kw):
    return _base(
        "gemma2",
        "Gemma2ForCausalLM",
        hidden_size=48,
        intermediate_size=80,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        hidden_act="gelu_pytorch_tanh",
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=24,
        sliding_window=4,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=8.0,
        tie_word_embeddings=True,
        attention_bias=False,
        pad_token_id=0,
        **kw,
    )


# (name, weight seed, config)
CASES = [
    (
        "llama3",
        1101,
        _llama(
            num_key_value_heads=2,
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
            tie_word_embeddings=True,
        ),
    ),
    (
        "llama_linear",
        1102,
        _llama(num_key_value_heads=4, rope_theta=10000.0, rope_scaling={"type": "linear", "factor": 4.0}),
    ),
    (
        "qwen2",
        1103,
        _base(
            "qwen2",
            "Qwen2ForCausalLM",
            num_key_value_heads=2,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=False,
            sliding_window=4096,
            max_window_layers=2,
        ),
    ),
    (
        "qwen3",
        1104,
        _base(
            "qwen3",
            "Qwen3ForCausalLM",
            hidden_size=48,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            attention_bias=False,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=2,
        ),
    ),
    (
        "mistral",
        1105,
        _base("mistral", "MistralForCausalLM", num_key_value_heads=1, head_dim=16, sliding_window=5, rope_theta=10000.0),
    ),
    (
        "gemma",
        1106,
        _base(
            "gemma",
            "GemmaForCausalLM",
            hidden_size=48,
            intermediate_size=80,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            hidden_act="gelu",
            hidden_activation="gelu_pytorch_tanh",
            rope_theta=10000.0,
            tie_word_embeddings=True,
            attention_bias=False,
            pad_token_id=0,
        ),
    ),
    ("phi3", 1107, _phi3(num_key_value_heads=2, sliding_window=7)),
    (
        "phi4mini",
        1108,
        _phi3(num_key_value_heads=2, partial_rotary_factor=0.75, sliding_window=None, tie_word_embeddings=True),
    ),
    (
        # Phi-3.5-mini / Phi-4-mini style: longrope with the original context at top level. The sequences stay
        # within original_max_position_embeddings, where transformers uses the short factors.
        "phi35",
        1109,
        _phi3(
            num_key_value_heads=2,
            partial_rotary_factor=0.75,
            sliding_window=None,
            tie_word_embeddings=True,
            original_max_position_embeddings=64,
            rope_scaling={
                "type": "longrope",
                "short_factor": [1.0, 1.1, 1.25, 1.5, 2.0, 3.0],
                "long_factor": [1.0, 2.0, 4.0, 8.0, 16.0, 32.0],
            },
        ),
    ),
    # Gemma 2: sliding (window 4) and full layers alternating, attention and final soft-caps, four norms per
    # layer, query_pre_attn_scalar != head_dim, heads * head_dim != hidden.
    ("gemma2", 1110, _gemma2(layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # SmolLM3: layer 1 without rotary (no_rope_layers: 1 = rotary), GQA.
    (
        "smollm3",
        1111,
        _base(
            "smollm3",
            "SmolLM3ForCausalLM",
            num_hidden_layers=3,
            num_key_value_heads=2,
            rope_theta=2000000.0,
            no_rope_layers=[1, 0, 1],
            no_rope_layer_interval=4,
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=3,
            tie_word_embeddings=True,
            attention_bias=False,
            mlp_bias=False,
            pad_token_id=2,
        ),
    ),
    # Qwen2 with use_sliding_window: layers from max_window_layers (1) on keep the last 5 keys.
    (
        "qwen2_swa",
        1112,
        _base(
            "qwen2",
            "Qwen2ForCausalLM",
            num_hidden_layers=3,
            num_key_value_heads=2,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            use_sliding_window=True,
            sliding_window=5,
            max_window_layers=1,
        ),
    ),
    # Qwen3 with use_sliding_window and explicit layer_types (middle layer sliding, window 4).
    (
        "qwen3_swa",
        1113,
        _base(
            "qwen3",
            "Qwen3ForCausalLM",
            hidden_size=48,
            num_hidden_layers=3,
            num_key_value_heads=2,
            head_dim=16,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
            attention_bias=False,
            use_sliding_window=True,
            sliding_window=4,
            max_window_layers=3,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
        ),
    ),
    # Gemma 3 text: q/k norms, sliding layers (all but every 3rd, window 4) turned by rope_local_base_freq,
    # full layers by rope_theta with linear rope_scaling, query_pre_attn_scalar, heads * head_dim != hidden.
    (
        "gemma3",
        1114,
        _base(
            "gemma3_text",
            "Gemma3ForCausalLM",
            num_hidden_layers=4,
            num_attention_heads=2,
            num_key_value_heads=1,
            head_dim=32,
            hidden_activation="gelu_pytorch_tanh",
            query_pre_attn_scalar=48,
            sliding_window=4,
            sliding_window_pattern=3,
            rope_theta=1000000.0,
            rope_local_base_freq=10000.0,
            rope_scaling={"rope_type": "linear", "factor": 8.0},
            attn_logit_softcapping=None,
            final_logit_softcapping=None,
            tie_word_embeddings=True,
            attention_bias=False,
            pad_token_id=0,
        ),
    ),
]

# Gemma 3 with vision (Gemma3ForConditionalGeneration), served as its text model: the gemma3 case's model (same
# seed and text config) in the multimodal layout: text_config nested, leaving out what Gemma3TextConfig's defaults
# give (rms_norm_eps, hidden_activation, rope_local_base_freq, tie_word_embeddings, the soft-caps), tensors under
# language_model.model.*, plus a vision tower and projector that the text model does not read.
_G3 = dict(CASES[-1][2])
CASES.append(
    (
        "gemma3_vision",
        1114,
        {
            "architectures": ["Gemma3ForConditionalGeneration"],
            "model_type": "gemma3",
            "bos_token_id": 1,
            "eos_token_id": [2, 106],
            "image_token_index": 120,
            "mm_tokens_per_image": 4,
            "torch_dtype": "float32",
            "text_config": {
                k: _G3[k]
                for k in (
                    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "query_pre_attn_scalar", "sliding_window",
                    "sliding_window_pattern", "rope_theta", "rope_scaling", "max_position_embeddings",
                )
            }
            | {"model_type": "gemma3_text"},
            "vision_config": {"model_type": "siglip_vision_model", "hidden_size": 8, "patch_size": 2, "num_channels": 3},
        },
    )
)

# Gemma3TextConfig's defaults (transformers), for the fields a gemma3 text_config may leave out.
GEMMA3_TEXT_DEFAULTS = {
    "vocab_size": 262208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "rope_theta": 1000000.0,
    "rope_scaling": None,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "rope_local_base_freq": 10000.0,
    "sliding_window_pattern": 6,
    "bos_token_id": 2,
    "eos_token_id": 1,
}


def text_config_of(cfg):
    """The text model's config: a gemma3 checkpoint's text_config with Gemma3TextConfig's defaults."""
    if cfg["model_type"] != "gemma3":
        return cfg
    t = dict(GEMMA3_TEXT_DEFAULTS)
    t.update(cfg["text_config"])
    t["model_type"] = "gemma3_text"
    return t


def checkpoint_tensors(cfg, sd):
    """The tensors as the checkpoint stores them: a gemma3 checkpoint's language model under language_model.model.*
    (transformers 4.50), with a vision tower and projector."""
    if cfg["model_type"] != "gemma3":
        return sd
    out = {"language_model." + k: v for k, v in sd.items()}
    g = torch.Generator().manual_seed(4)
    out["vision_tower.vision_model.embeddings.patch_embedding.weight"] = torch.randn(8, 3, 2, 2, generator=g)
    out["multi_modal_projector.mm_input_projection_weight"] = torch.randn(8, cfg["text_config"]["hidden_size"], generator=g)
    out["multi_modal_projector.mm_soft_emb_norm.weight"] = torch.zeros(8)
    return out


def text_tensors(cfg, sd):
    """checkpoint_tensors' inverse: the text model's tensors."""
    if cfg["model_type"] != "gemma3":
        return sd
    p = "language_model."
    return {k[len(p) :]: v for k, v in sd.items() if k.startswith(p)}


GEMMAS = ("gemma", "gemma2", "gemma3_text")
SANDWICH = ("gemma2", "gemma3_text")


def head_dim_of(cfg):
    # transformers: getattr(config, "head_dim", hidden_size // num_attention_heads)
    return cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]


def rope_kind(cfg):
    rs = cfg.get("rope_scaling")
    if not rs:
        return "default"
    return rs.get("rope_type", rs.get("type"))


# ---------------------------------------------------------------------------------------------------
# Weights


def make_weights(name, seed, cfg):
    """Seeded random weights under the family's Hugging Face names (lm_head.weight only when untied)."""
    torch.manual_seed(seed)
    mt = cfg["model_type"]
    H, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)

    def lin(out_f, in_f):
        return torch.randn(out_f, in_f) / math.sqrt(in_f)

    def norm(n):
        if mt in GEMMAS:  # applied as 1 + weight
            return torch.randn(n) * 0.1
        return 1.0 + torch.randn(n) * 0.1

    sd = {"model.embed_tokens.weight": torch.randn(V, H) * (2.0 / math.sqrt(H))}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = norm(H)
        if mt == "phi3":
            sd[p + "self_attn.qkv_proj.weight"] = lin((nh + 2 * nkv) * hd, H)
        else:
            sd[p + "self_attn.q_proj.weight"] = lin(nh * hd, H)
            sd[p + "self_attn.k_proj.weight"] = lin(nkv * hd, H)
            sd[p + "self_attn.v_proj.weight"] = lin(nkv * hd, H)
            if mt == "qwen2":
                sd[p + "self_attn.q_proj.bias"] = torch.randn(nh * hd) * 0.2
                sd[p + "self_attn.k_proj.bias"] = torch.randn(nkv * hd) * 0.2
                sd[p + "self_attn.v_proj.bias"] = torch.randn(nkv * hd) * 0.2
            if mt in ("qwen3", "gemma3_text"):
                sd[p + "self_attn.q_norm.weight"] = norm(hd)
                sd[p + "self_attn.k_norm.weight"] = norm(hd)
        sd[p + "self_attn.o_proj.weight"] = lin(H, nh * hd)
        sd[p + "post_attention_layernorm.weight"] = norm(H)
        if mt in SANDWICH:
            sd[p + "pre_feedforward_layernorm.weight"] = norm(H)
            sd[p + "post_feedforward_layernorm.weight"] = norm(H)
        if mt == "phi3":
            sd[p + "mlp.gate_up_proj.weight"] = lin(2 * I, H)
        else:
            sd[p + "mlp.gate_proj.weight"] = lin(I, H)
            sd[p + "mlp.up_proj.weight"] = lin(I, H)
        sd[p + "mlp.down_proj.weight"] = lin(H, I)
    sd["model.norm.weight"] = norm(H)
    if not cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = torch.randn(V, H) * (2.0 / math.sqrt(H))
    return sd


# ---------------------------------------------------------------------------------------------------
# The models (float32, as transformers computes them with eager attention)


def rope_inv_freq(cfg):
    """inv_freq as modeling_rope_utils computes it (float32), and its rotary dimension."""
    base = cfg["rope_theta"]
    dim = int(head_dim_of(cfg) * cfg.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    kind = rope_kind(cfg)
    if kind == "default":
        return inv_freq
    rs = cfg["rope_scaling"]
    if kind == "linear":
        return inv_freq / rs["factor"]
    if kind == "llama3":
        factor = rs["factor"]
        low_freq_factor = rs["low_freq_factor"]
        high_freq_factor = rs["high_freq_factor"]
        old_context_len = rs["original_max_position_embeddings"]
        low_freq_wavelen = old_context_len / low_freq_factor
        high_freq_wavelen = old_context_len / high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
        smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
    if kind == "longrope":
        # _compute_longrope_parameters with seq_len <= original_max_position_embeddings: the short factors.
        short = torch.tensor(rs["short_factor"], dtype=torch.float32)
        shape = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (short * base**shape)
    raise ValueError(f"rope type {kind!r} not implemented")


def rope_attention_factor(cfg):
    """The attention scaling the rotary embedding multiplies cos and sin by (longrope), as transformers sets it."""
    if rope_kind(cfg) != "longrope":
        return 1.0
    rs = cfg["rope_scaling"]
    if rs.get("attention_factor") is not None:
        return rs["attention_factor"]
    if "original_max_position_embeddings" in cfg:
        orig = cfg["original_max_position_embeddings"]
        factor = cfg["max_position_embeddings"] / orig
    else:
        orig = cfg["max_position_embeddings"]
        factor = rs.get("factor") or 1.0
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))


def llama3_bands(cfg):
    """(high, medium, low) counts of inv_freq entries in the llama3 frequency bands."""
    rs = cfg["rope_scaling"]
    dim = int(head_dim_of(cfg) * cfg.get("partial_rotary_factor", 1.0))
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    wavelen = 2 * math.pi / inv_freq
    low_wl = rs["original_max_position_embeddings"] / rs["low_freq_factor"]
    high_wl = rs["original_max_position_embeddings"] / rs["high_freq_factor"]
    high = int((wavelen < high_wl).sum())
    low = int((wavelen > low_wl).sum())
    return high, len(inv_freq) - high - low, low


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary(x, cos, sin):
    """x [b, heads, s, hd]; cos/sin [s, rot]; rotary over the first rot dims (phi3's partial rotary)."""
    rot = cos.shape[-1]
    x_rot, x_pass = x[..., :rot], x[..., rot:]
    return torch.cat([(x_rot * cos) + (rotate_half(x_rot) * sin), x_pass], dim=-1)


def rms_norm(x, w, eps, gemma=False):
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    if gemma:
        return h * (1.0 + w.float())
    return w * h


def repeat_kv(x, n_rep):
    b, nkv, s, hd = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, nkv, n_rep, s, hd).reshape(b, nkv * n_rep, s, hd)


def rope_layers(cfg):
    """SmolLM3Config.no_rope_layers: 1 for a layer with rotary, 0 for a NoPE layer."""
    n = cfg["num_hidden_layers"]
    if cfg["model_type"] != "smollm3":
        return [1] * n
    if cfg.get("no_rope_layers"):
        return cfg["no_rope_layers"]
    return [int((i + 1) % cfg.get("no_rope_layer_interval", 4) != 0) for i in range(n)]


def layer_types(cfg):
    """config.layer_types as the transformers configs fill it in when config.json has none."""
    mt, n = cfg["model_type"], cfg["num_hidden_layers"]
    if cfg.get("layer_types"):
        return cfg["layer_types"]
    if mt in ("qwen2", "qwen3"):
        # Qwen2Config/Qwen3Config: sliding_window is None without use_sliding_window.
        sw = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
        return ["sliding_attention" if sw is not None and i >= cfg["max_window_layers"] else "full_attention" for i in range(n)]
    if mt == "gemma2":
        return ["sliding_attention" if bool((i + 1) % 2) else "full_attention" for i in range(n)]
    if mt == "gemma3_text":
        return ["sliding_attention" if bool((i + 1) % cfg["sliding_window_pattern"]) else "full_attention" for i in range(n)]
    if mt == "smollm3":
        rl = rope_layers(cfg)
        use = cfg.get("use_sliding_window") and cfg.get("sliding_window") is not None
        return ["sliding_attention" if use and not rl[i] else "full_attention" for i in range(n)]
    return ["full_attention"] * n


def layer_windows(cfg):
    """Each layer's sliding window (keys including the query's own), None for full attention."""
    mt, n = cfg["model_type"], cfg["num_hidden_layers"]
    if mt in ("mistral", "phi3"):
        return [cfg.get("sliding_window")] * n
    if mt in ("qwen2", "qwen3", "smollm3") and not cfg.get("use_sliding_window"):
        return [None] * n  # the config drops sliding_window
    return [cfg["sliding_window"] if t == "sliding_attention" else None for t in layer_types(cfg)]


def layer_rope(cfg):
    """Each layer's (inv_freq, attention factor), None for a layer without rotary."""
    out = []
    local = dict(cfg, rope_theta=cfg.get("rope_local_base_freq"), rope_scaling=None)
    for i, (w, r) in enumerate(zip(layer_windows(cfg), rope_layers(cfg))):
        if not r:
            out.append(None)
        elif cfg["model_type"] == "gemma3_text" and w is not None:
            out.append((rope_inv_freq(local), 1.0))  # Gemma3's rotary_emb_local
        else:
            out.append((rope_inv_freq(cfg), rope_attention_factor(cfg)))
    return out


def causal_mask(s, window):
    i = torch.arange(s)[:, None]
    j = torch.arange(s)[None, :]
    visible = j <= i
    if window is not None:
        visible = visible & (j > i - window)
    mask = torch.zeros(s, s, dtype=torch.float32)
    return mask.masked_fill(~visible, torch.finfo(torch.float32).min)


def activation(cfg, x):
    if cfg["model_type"] in GEMMAS:
        # GemmaMLP (transformers 4.38.2 - 4.47): ACT2FN[hidden_activation], defaulting to gelu_pytorch_tanh.
        act = cfg.get("hidden_activation") or "gelu_pytorch_tanh"
    else:
        act = cfg["hidden_act"]
    if act == "silu":
        return F.silu(x)
    if act == "gelu_pytorch_tanh":
        return F.gelu(x, approximate="tanh")
    if act == "gelu":
        return F.gelu(x)
    raise ValueError(f"activation {act!r} not implemented")


def forward(cfg, sd, ids, skip=()):
    """Logits [len(ids), vocab] in float32 for one sequence (batch of one, positions 0..len-1).

    skip names family features to leave out, for the sanity checks only."""
    mt = cfg["model_type"]
    gemma = mt in GEMMAS
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    eps = cfg["rms_norm_eps"]
    x_ids = torch.tensor([ids], dtype=torch.int64)
    s = len(ids)

    h = F.embedding(x_ids, sd["model.embed_tokens.weight"])
    if gemma and "embed_scale" not in skip:
        h = h * torch.tensor(cfg["hidden_size"] ** 0.5, dtype=h.dtype)

    pos = torch.arange(s, dtype=torch.int64)
    ropes = []
    for r in layer_rope(cfg):
        if r is None:
            ropes.append(None)
            continue
        inv_freq, att = r
        freqs = (inv_freq[None, :, None].float() @ pos[None, None, :].float()).transpose(1, 2)[0]
        emb = torch.cat((freqs, freqs), dim=-1)
        ropes.append((emb.cos() * att, emb.sin() * att))
    windows = layer_windows(cfg)
    scaling = cfg["query_pre_attn_scalar"] ** -0.5 if mt in SANDWICH else hd**-0.5
    softcap = cfg.get("attn_logit_softcapping") if mt in SANDWICH else None
    gnorm = gemma and "gemma_norm" not in skip
    sandwich = mt in SANDWICH and "sandwich" not in skip

    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        residual = h
        x = rms_norm(h, sd[p + "input_layernorm.weight"], eps, gnorm)
        if mt == "phi3":
            qkv = F.linear(x, sd[p + "self_attn.qkv_proj.weight"])
            qp = nh * hd
            q, k, v = qkv[..., :qp], qkv[..., qp : qp + nkv * hd], qkv[..., qp + nkv * hd :]
        else:
            def proj(n):
                b = sd.get(p + f"self_attn.{n}_proj.bias")
                if "bias" in skip:
                    b = None
                return F.linear(x, sd[p + f"self_attn.{n}_proj.weight"], b)

            q, k, v = proj("q"), proj("k"), proj("v")
        q = q.view(1, s, -1, hd)
        k = k.view(1, s, -1, hd)
        v = v.view(1, s, -1, hd)
        if mt in ("qwen3", "gemma3_text") and "qk_norm" not in skip:
            q = rms_norm(q, sd[p + "self_attn.q_norm.weight"], eps, gnorm)
            k = rms_norm(k, sd[p + "self_attn.k_norm.weight"], eps, gnorm)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if ropes[i] is not None:
            cos, sin = ropes[i]
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        k, v = repeat_kv(k, nh // nkv), repeat_kv(v, nh // nkv)
        w = torch.matmul(q, k.transpose(2, 3)) * scaling
        if softcap is not None:
            w = w / softcap
            w = torch.tanh(w)
            w = w * softcap
        w = w + causal_mask(s, windows[i])
        w = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
        a = torch.matmul(w, v).transpose(1, 2).contiguous().reshape(1, s, -1)
        a = F.linear(a, sd[p + "self_attn.o_proj.weight"])
        if sandwich:
            h = residual + rms_norm(a, sd[p + "post_attention_layernorm.weight"], eps, gnorm)
            residual = h
            x = rms_norm(h, sd[p + "pre_feedforward_layernorm.weight"], eps, gnorm)
        else:
            h = residual + a
            residual = h
            x = rms_norm(h, sd[p + "post_attention_layernorm.weight"], eps, gnorm)
        if mt == "phi3":
            gate, up = F.linear(x, sd[p + "mlp.gate_up_proj.weight"]).chunk(2, dim=-1)
            m = up * activation(cfg, gate)
        else:
            m = activation(cfg, F.linear(x, sd[p + "mlp.gate_proj.weight"])) * F.linear(x, sd[p + "mlp.up_proj.weight"])
        m = F.linear(m, sd[p + "mlp.down_proj.weight"])
        if sandwich:
            m = rms_norm(m, sd[p + "post_feedforward_layernorm.weight"], eps, gnorm)
        h = residual + m

    h = rms_norm(h, sd["model.norm.weight"], eps, gnorm)
    lm = sd["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else sd["lm_head.weight"]
    logits = F.linear(h, lm)[0]
    final_cap = cfg.get("final_logit_softcapping") if mt in SANDWICH else None
    if final_cap is not None:
        logits = logits / final_cap
        logits = torch.tanh(logits)
        logits = logits * final_cap
    return logits


# ---------------------------------------------------------------------------------------------------
# An independent float64 NumPy implementation (explicit loops), for cross-checking forward()


def np_forward(cfg, sd, ids):
    """The same models in float64 with explicit loops; each layer's window and rotary are derived here from
    config.json's fields on their own (not through layer_windows / layer_rope)."""
    mt = cfg["model_type"]
    W = {k: v.double().numpy() for k, v in sd.items()}
    nh, nkv, hd = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg)
    H, eps, s, L = cfg["hidden_size"], cfg["rms_norm_eps"], len(ids), cfg["num_hidden_layers"]
    rot = int(hd * cfg.get("partial_rotary_factor", 1.0))
    gem = mt in ("gemma", "gemma2", "gemma3_text")
    sandwich = mt in ("gemma2", "gemma3_text")

    def base_freqs(theta, kind):
        freqs = np.array([theta ** (-(2.0 * j) / rot) for j in range(rot // 2)])
        if kind == "linear":
            freqs = freqs / cfg["rope_scaling"]["factor"]
        elif kind == "llama3":
            rs = cfg["rope_scaling"]
            old = rs["original_max_position_embeddings"]
            lo, hi, fac = rs["low_freq_factor"], rs["high_freq_factor"], rs["factor"]
            out = []
            for f in freqs:
                wl = 2 * math.pi / f
                if wl < old / hi:
                    out.append(f)
                elif wl > old / lo:
                    out.append(f / fac)
                else:
                    t = (old / wl - lo) / (hi - lo)
                    out.append((1 - t) * f / fac + t * f)
            freqs = np.array(out)
        elif kind == "longrope":
            freqs = freqs / np.array(cfg["rope_scaling"]["short_factor"])
        return freqs

    # Per layer: window (None = full), frequencies (None = no rotary).
    windows, freqs = [], []
    for i in range(L):
        w = None
        if mt in ("mistral", "phi3"):
            w = cfg.get("sliding_window")
        elif mt in ("qwen2", "qwen3"):
            if cfg.get("use_sliding_window"):
                types = cfg.get("layer_types")
                sliding = types[i] == "sliding_attention" if types else i >= cfg["max_window_layers"]
                w = cfg["sliding_window"] if sliding else None
        elif mt == "gemma2":
            w = cfg["sliding_window"] if (cfg.get("layer_types") or ["sliding_attention", "full_attention"] * L)[i] == "sliding_attention" else None
        elif mt == "gemma3_text":
            w = cfg["sliding_window"] if (i + 1) % cfg["sliding_window_pattern"] != 0 else None
        windows.append(w)
        if mt == "smollm3" and cfg["no_rope_layers"][i] == 0:
            freqs.append(None)
        elif mt == "gemma3_text" and w is not None:
            freqs.append(base_freqs(cfg["rope_local_base_freq"], "default"))
        else:
            freqs.append(base_freqs(cfg["rope_theta"], rope_kind(cfg)))
    att = rope_attention_factor(cfg)
    scale = cfg["query_pre_attn_scalar"] ** -0.5 if sandwich else hd**-0.5
    cap = cfg.get("attn_logit_softcapping") if sandwich else None
    final_cap = cfg.get("final_logit_softcapping") if sandwich else None

    def norm(x, w, gem=False):
        y = x / math.sqrt(np.mean(x * x) + eps)
        return y * (1.0 + w) if gem else y * w

    def rope(vec, p, fr):
        if fr is None:
            return vec
        vec = vec.copy()
        half = rot // 2
        for j in range(half):
            a, b = vec[j], vec[j + half]
            c, sn = att * math.cos(p * fr[j]), att * math.sin(p * fr[j])
            vec[j], vec[j + half] = a * c - b * sn, b * c + a * sn
        return vec

    def act(x):
        if gem:
            return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))
        return x / (1.0 + np.exp(-x))

    hs = [W["model.embed_tokens.weight"][t].copy() for t in ids]
    if gem:
        hs = [x * math.sqrt(H) for x in hs]
    for i in range(L):
        p = f"model.layers.{i}."
        Q, K, Vv = [], [], []
        for pos, x in enumerate(hs):
            xn = norm(x, W[p + "input_layernorm.weight"], gem)
            if mt == "phi3":
                qkv = W[p + "self_attn.qkv_proj.weight"] @ xn
                q, k, v = qkv[: nh * hd], qkv[nh * hd : (nh + nkv) * hd], qkv[(nh + nkv) * hd :]
            else:
                q = W[p + "self_attn.q_proj.weight"] @ xn
                k = W[p + "self_attn.k_proj.weight"] @ xn
                v = W[p + "self_attn.v_proj.weight"] @ xn
                if mt == "qwen2":
                    q = q + W[p + "self_attn.q_proj.bias"]
                    k = k + W[p + "self_attn.k_proj.bias"]
                    v = v + W[p + "self_attn.v_proj.bias"]
            qh = [q[n * hd : (n + 1) * hd] for n in range(nh)]
            kh = [k[n * hd : (n + 1) * hd] for n in range(nkv)]
            vh = [v[n * hd : (n + 1) * hd] for n in range(nkv)]
            if mt in ("qwen3", "gemma3_text"):
                qh = [norm(t, W[p + "self_attn.q_norm.weight"], gem) for t in qh]
                kh = [norm(t, W[p + "self_attn.k_norm.weight"], gem) for t in kh]
            Q.append([rope(t, pos, freqs[i]) for t in qh])
            K.append([rope(t, pos, freqs[i]) for t in kh])
            Vv.append(vh)
        new = []
        window = windows[i]
        for qi in range(s):
            heads = []
            for n in range(nh):
                g = n // (nh // nkv)
                keys = [j for j in range(qi + 1) if window is None or j > qi - window]
                sc = np.array([Q[qi][n] @ K[j][g] * scale for j in keys])
                if cap is not None:
                    sc = cap * np.tanh(sc / cap)
                sc = np.exp(sc - sc.max())
                sc /= sc.sum()
                heads.append(sum(w * Vv[j][g] for w, j in zip(sc, keys)))
            o = W[p + "self_attn.o_proj.weight"] @ np.concatenate(heads)
            if sandwich:
                x = hs[qi] + norm(o, W[p + "post_attention_layernorm.weight"], gem)
                xn = norm(x, W[p + "pre_feedforward_layernorm.weight"], gem)
            else:
                x = hs[qi] + o
                xn = norm(x, W[p + "post_attention_layernorm.weight"], gem)
            if mt == "phi3":
                gu = W[p + "mlp.gate_up_proj.weight"] @ xn
                half = len(gu) // 2
                m = act(gu[:half]) * gu[half:]
            else:
                m = act(W[p + "mlp.gate_proj.weight"] @ xn) * (W[p + "mlp.up_proj.weight"] @ xn)
            d = W[p + "mlp.down_proj.weight"] @ m
            if sandwich:
                d = norm(d, W[p + "post_feedforward_layernorm.weight"], gem)
            new.append(x + d)
        hs = new
    lm = W["model.embed_tokens.weight"] if cfg["tie_word_embeddings"] else W["lm_head.weight"]
    out = np.stack([lm @ norm(x, W["model.norm.weight"], gem) for x in hs])
    if final_cap is not None:
        out = final_cap * np.tanh(out / final_cap)
    return out


# ---------------------------------------------------------------------------------------------------
# Generation and checks


def context_of(cfg):
    """The context Conveyor serves: max_position_embeddings, or longrope's original context below it (beyond
    it transformers switches every position to the long factors, which a KV cache cannot follow)."""
    if rope_kind(cfg) == "longrope":
        return min(cfg["max_position_embeddings"], cfg.get("original_max_position_embeddings", cfg["max_position_embeddings"]))
    return cfg["max_position_embeddings"]


def sequences_for(seed, vocab):
    g = torch.Generator().manual_seed(seed + 7919)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in SEQ_LENS]


def maxdiff(a, b):
    return float((a - b).abs().max())


def feature_checks(name, cfg, sd, seqs, ref):
    """(description, max |logit difference| over all positions) of dropping the family's feature."""
    out = []

    def diff(desc, cfg2=None, sd2=None, skip=()):
        d = max(maxdiff(r, forward(cfg2 or cfg, sd2 or sd, ids, skip)) for ids, r in zip(seqs, ref))
        out.append((desc, d))

    mt = cfg["model_type"]
    if rope_kind(cfg) != "default":
        diff(f"rope_scaling {rope_kind(cfg)} -> none", dict(cfg, rope_scaling=None))
    if mt == "qwen2":
        diff("q/k/v biases dropped", skip=("bias",))
    if mt == "qwen3":
        diff("q_norm/k_norm dropped", skip=("qk_norm",))
    if mt == "gemma":
        diff("norm weight instead of 1 + weight", skip=("gemma_norm",))
        diff("no sqrt(hidden) embedding scale", skip=("embed_scale",))
        diff("silu instead of tanh GELU", dict(cfg, hidden_activation="silu"))
        # Informational (not required to be large): what transformers >= 4.48 computes for this config,
        # whose GemmaMLP reads hidden_act ("gelu", exact) instead of hidden_activation.
        diff("info: exact (erf) GELU instead of tanh GELU", dict(cfg, hidden_activation="gelu"))
    if mt in SANDWICH:
        diff("pre/post feed-forward and post-attention norms dropped (Llama's two)", skip=("sandwich",))
        diff(f"query_pre_attn_scalar {cfg['query_pre_attn_scalar']} -> head_dim", dict(cfg, query_pre_attn_scalar=head_dim_of(cfg)))
        diff("norm weight instead of 1 + weight", skip=("gemma_norm",))
        diff("no sqrt(hidden) embedding scale", skip=("embed_scale",))
    if cfg.get("attn_logit_softcapping") is not None:
        diff("attn_logit_softcapping off", dict(cfg, attn_logit_softcapping=None))
    if cfg.get("final_logit_softcapping") is not None:
        diff("final_logit_softcapping off", dict(cfg, final_logit_softcapping=None))
    if mt == "gemma3_text":
        diff("q_norm/k_norm dropped", skip=("qk_norm",))
        diff("sliding layers turned by rope_theta (not rope_local_base_freq)", dict(cfg, rope_local_base_freq=cfg["rope_theta"]))
    if any(w is not None for w in layer_windows(cfg)) and mt not in ("mistral", "phi3"):
        w = cfg["sliding_window"]
        diff(f"sliding_window {w} -> {w + 1}", dict(cfg, sliding_window=w + 1))
        diff(f"sliding_window {w} -> {w - 1}", dict(cfg, sliding_window=w - 1))
        diff("every layer full attention", dict(cfg, sliding_window=1000))
    if mt == "smollm3":
        diff("rotary on the NoPE layer", dict(cfg, no_rope_layers=[1] * cfg["num_hidden_layers"]))
    if rope_kind(cfg) == "longrope":
        diff("longrope dropped (plain rotary)", dict(cfg, rope_scaling=None))
        rs = dict(cfg["rope_scaling"], short_factor=[1.0] * len(cfg["rope_scaling"]["short_factor"]))
        diff("longrope without its short factors (attention factor alone)", dict(cfg, rope_scaling=rs))
    elif cfg.get("partial_rotary_factor", 1.0) != 1.0:
        c2 = dict(cfg)
        del c2["partial_rotary_factor"]
        diff("full rotary instead of partial_rotary_factor", c2)
    if mt == "phi3":
        diff("gate_up halves swapped (up first)", sd2=swap_gate_up(cfg, sd))
    return out


def mt_windows_all(cfg):
    """Whether one sliding_window applies to every layer (Mistral, Phi-3)."""
    return cfg["model_type"] in ("mistral", "phi3") and cfg.get("sliding_window") is not None


def swap_gate_up(cfg, sd):
    sd2 = dict(sd)
    I = cfg["intermediate_size"]
    for k, v in sd.items():
        if k.endswith("mlp.gate_up_proj.weight"):
            sd2[k] = torch.cat([v[I:], v[:I]])
    return sd2


def phi3_as_llama(cfg, sd):
    """phi3 weights split into llama's q/k/v and gate/up projections, with a llama config (no window)."""
    nh, nkv, hd, I = cfg["num_attention_heads"], cfg["num_key_value_heads"], head_dim_of(cfg), cfg["intermediate_size"]
    out = {}
    for k, v in sd.items():
        if k.endswith("self_attn.qkv_proj.weight"):
            p = k[: -len("qkv_proj.weight")]
            out[p + "q_proj.weight"] = v[: nh * hd]
            out[p + "k_proj.weight"] = v[nh * hd : (nh + nkv) * hd]
            out[p + "v_proj.weight"] = v[(nh + nkv) * hd :]
        elif k.endswith("mlp.gate_up_proj.weight"):
            p = k[: -len("gate_up_proj.weight")]
            out[p + "gate_proj.weight"], out[p + "up_proj.weight"] = v[:I], v[I:]
        else:
            out[k] = v
    lcfg = dict(cfg, model_type="llama", head_dim=hd)
    return lcfg, out


def main():
    total = 0
    problems = []
    print("case          seed  tensors  safetensors  reference   rt-diff    np64-diff  |logit| max")
    reports = []
    for name, seed, ckpt_cfg in CASES:
        out_dir = os.path.join(HERE, name)
        os.makedirs(out_dir, exist_ok=True)
        cfg = text_config_of(ckpt_cfg)
        sd = make_weights(name, seed, cfg)
        assert ("lm_head.weight" in sd) != cfg["tie_word_embeddings"]
        seqs = sequences_for(seed, cfg["vocab_size"])
        with torch.no_grad():
            ref = [forward(cfg, sd, ids) for ids in seqs]

        with open(os.path.join(out_dir, "config.json"), "w") as f:
            f.write(json.dumps(ckpt_cfg, indent=2, sort_keys=True) + "\n")
        st_path = os.path.join(out_dir, "model.safetensors")
        save_safetensors(st_path, checkpoint_tensors(ckpt_cfg, sd), torch.float32)
        reference = {
            "model": name,
            "sequences": seqs,
            "context": context_of(cfg),
            "logits": [[[round(float(v), 6) for v in row] for row in r.tolist()] for r in ref],
        }
        ref_path = os.path.join(out_dir, "reference.json")
        with open(ref_path, "w") as f:
            f.write(json.dumps(reference, separators=(",", ":")))

        # Checks: read the files back; compare against the float64 NumPy loops.
        with open(os.path.join(out_dir, "config.json")) as f:
            cfg_rt = text_config_of(json.load(f))
        sd_rt = text_tensors(ckpt_cfg, load_safetensors(st_path))
        if set(sd_rt) != set(sd):
            problems.append(f"{name}: tensor names differ after read-back")
        with torch.no_grad():
            rt = max(maxdiff(r, forward(cfg_rt, sd_rt, ids)) for ids, r in zip(seqs, ref))
        np_d = max(float(np.abs(np_forward(cfg_rt, sd_rt, ids) - r.double().numpy()).max()) for ids, r in zip(seqs, ref))
        if rt != 0.0:
            problems.append(f"{name}: read-back logits differ by {rt}")
        if np_d > 1e-4:
            problems.append(f"{name}: float64 NumPy loops differ by {np_d}")
        st_size = os.path.getsize(st_path)
        ref_size = os.path.getsize(ref_path)
        total += st_size + ref_size + os.path.getsize(os.path.join(out_dir, "config.json"))
        lmax = max(float(r.abs().max()) for r in ref)
        print(f"{name:12s} {seed:5d} {len(sd):7d} {st_size:12d} {ref_size:10d}  {rt:.1e}   {np_d:.2e}   {lmax:.2f}")

        with torch.no_grad():
            checks = feature_checks(name, cfg, sd, seqs, ref)
            window = cfg.get("sliding_window") if mt_windows_all(cfg) else None
            if window is not None:
                ids = seqs[0]
                full = forward(dict(cfg, sliding_window=None), sd, ids)
                d12 = maxdiff(full[12], ref[0][12])
                dpre = maxdiff(full[:window], ref[0][:window])
                checks.append((f"sliding_window {window} dropped: position 12 / positions < {window}", (d12, dpre)))
                if d12 < 1e-3 or dpre != 0.0:
                    problems.append(f"{name}: window check failed ({d12}, {dpre})")
            if cfg["model_type"] == "phi3" and cfg.get("partial_rotary_factor", 1.0) == 1.0:
                lcfg, lsd = phi3_as_llama(cfg, sd)
                d = max(maxdiff(forward(dict(cfg, sliding_window=None), sd, ids), forward(lcfg, lsd, ids)) for ids in seqs)
                checks.append(("fused phi3 (no window) vs split llama math: must agree", d))
                if d > 1e-5:
                    problems.append(f"{name}: fused vs split differ by {d}")
        if cfg.get("rope_scaling", {}) and rope_kind(cfg) == "llama3":
            bands = llama3_bands(cfg)
            reports.append(f"{name}: inv_freq bands high/medium/low = {bands[0]}/{bands[1]}/{bands[2]}")
            if min(bands) == 0:
                problems.append(f"{name}: a llama3 band is empty {bands}")
        for desc, d in checks:
            reports.append(f"{name}: {desc}: {d if isinstance(d, tuple) else round(d, 4)}")
            if not isinstance(d, tuple) and "must agree" not in desc and not desc.startswith("info") and d < 1e-3:
                problems.append(f"{name}: '{desc}' changes nothing ({d})")

    print(f"total fixture bytes: {total}")
    print("\n".join(reports))
    if problems:
        print("PROBLEMS:\n  " + "\n  ".join(problems))
        sys.exit(1)
    print("all checks passed")


if __name__ == "__main__":
    main()
