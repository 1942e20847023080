"""A plain Llama decoder in PyTorch with the math and tensor names of Hugging Face's LlamaForCausalLM.

Names: model.embed_tokens.weight, model.layers.{i}.input_layernorm.weight,
model.layers.{i}.self_attn.{q,k,v,o}_proj.weight, model.layers.{i}.post_attention_layernorm.weight,
model.layers.{i}.mlp.{gate,up,down}_proj.weight, model.norm.weight and lm_head.weight (absent from the saved file
when tie_word_embeddings is set). No biases. RMSNorm is computed in float32, RoPE uses rotate_half (the
non-interleaved layout), attention is causal with grouped-query key/value heads, the MLP is SwiGLU.

Also holds the safetensors reader/writer (the `safetensors` package is not needed).
"""

import json
import math
import struct

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dtype = x.dtype
        h = x.to(torch.float32)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + self.eps)
        return self.weight * h.to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_cos_sin(positions, head_dim, theta):
    """cos, sin of shape [seq, head_dim] for integer positions, as in LlamaRotaryEmbedding."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_heads = cfg["num_attention_heads"]
        self.n_kv = cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        hidden = cfg["hidden_size"]
        self.q_proj = nn.Linear(hidden, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, self.n_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, hidden, bias=False)

    def forward(self, x, cos, sin, mask):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv, self.head_dim).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv
        if rep > 1:  # repeat_kv: query head h reads key/value head h // rep
            k = k[:, :, None].expand(b, self.n_kv, rep, s, self.head_dim).reshape(b, self.n_heads, s, self.head_dim)
            v = v[:, :, None].expand(b, self.n_kv, rep, s, self.head_dim).reshape(b, self.n_heads, s, self.head_dim)
        scores = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(self.head_dim) + mask
        probs = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        hidden, inter = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList([DecoderLayer(cfg) for _ in range(cfg["num_hidden_layers"])])
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg["hidden_size"], cfg["vocab_size"], bias=False)
        if cfg["tie_word_embeddings"]:
            self.lm_head.weight = self.model.embed_tokens.weight

    def init_weights(self, generator):
        std = self.cfg["initializer_range"]
        out_std = std / math.sqrt(2 * self.cfg["num_hidden_layers"])
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                with torch.no_grad():
                    p.normal_(0.0, out_std, generator=generator)
            else:
                with torch.no_grad():
                    p.normal_(0.0, std, generator=generator)

    def forward(self, input_ids):
        """Logits [batch, seq, vocab] for input_ids [batch, seq] at positions 0..seq-1."""
        b, s = input_ids.shape
        x = self.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(torch.arange(s), self.cfg["head_dim"], self.cfg["rope_theta"])
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        mask = torch.full((s, s), float("-inf"), dtype=x.dtype).triu(1)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))


def hf_state_dict(model):
    """The state dict under Hugging Face names, without lm_head.weight when embeddings are tied."""
    sd = {k: v.detach() for k, v in model.state_dict().items()}
    if model.cfg["tie_word_embeddings"]:
        sd.pop("lm_head.weight", None)
    return sd


def save_safetensors(path, tensors, dtype=torch.float16):
    """Writes tensors (name -> torch tensor) as a safetensors file in dtype (F16 or F32)."""
    code = {torch.float16: "F16", torch.float32: "F32"}[dtype]
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        arr = tensors[name].to(dtype).contiguous().numpy()
        data = arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = {"format": "pt"}
    hdr = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hdr += b" " * ((8 - len(hdr) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hdr)))
        f.write(hdr)
        for data in blobs:
            f.write(data)


def load_safetensors(path):
    """Reads a safetensors file written by save_safetensors into float32 torch tensors."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    np_dtype = {"F16": np.float16, "F32": np.float32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        arr = np.frombuffer(body[start:end], dtype=np.dtype(np_dtype[info["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(arr.astype(np.float32).reshape(info["shape"]))
    return out


def load_model(model_dir):
    """Builds the model from a Hugging Face directory (config.json + model.safetensors), in float32."""
    with open(f"{model_dir}/config.json") as f:
        cfg = json.load(f)
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("initializer_range", 0.02)
    model = LlamaForCausalLM(cfg)
    sd = load_safetensors(f"{model_dir}/model.safetensors")
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    model.load_state_dict(sd, strict=True)
    if cfg["tie_word_embeddings"]:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.eval()
    return model, cfg
