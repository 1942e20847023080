#!/usr/bin/python3
"""Writes models/testdata/gpt2-optimum: a tiny GPT-2 decoder exported from PyTorch.

The model is written by hand (no transformers) with the Hugging Face GPT-2
architecture: learned absolute position embeddings (wpe) indexed by position_ids,
LayerNorm with bias, a fused c_attn projection (Conv1D layout: weight [in, out]),
tanh-approximated GELU MLP, multi-head attention masked the way GPT2Attention masks
(a causal slice bias[k_len - q_len : k_len, :k_len] of a [n_positions, n_positions]
lower-triangular buffer, plus (1 - attention_mask) * finfo.min added to the scores)
and an lm_head tied to wte. Weights are seeded random values.

It is exported with torch.onnx.export in the Hugging Face Optimum
`text-generation-with-past` interface:

  inputs  input_ids [batch, seq] int64, attention_mask [batch, past + seq] int64,
          position_ids [batch, seq] int64,
          past_key_values.{i}.key / .value [batch, heads, past, head_dim]
  outputs logits [batch, seq, vocab], present.{i}.key / .value [batch, heads, past + seq, head_dim]

traced with a non-empty past as Optimum does. f16kv/ holds the same model with
past/present in float16 (cast to and from float32 inside the graph).

reference.json holds float64 PyTorch results of the same weights: full-sequence
logits without a cache, a cached decode (prefill then single-token steps through
the model's own past) and greedy continuations.

Run with Debian's PyTorch: /usr/bin/python3 models/testdata/gen_gpt2_optimum.py
"""

import json
import math
import os
import shutil
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gpt2-optimum")
TOKENIZER_DIR = os.path.join(HERE, "..", "..", "tokenizer", "testdata")

CONFIG = {
    "architectures": ["GPT2LMHeadModel"],
    "model_type": "gpt2",
    "vocab_size": 512,
    "n_positions": 128,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_inner": 128,
    "activation_function": "gelu_new",
    "layer_norm_epsilon": 1e-5,
    "scale_attn_weights": True,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "use_cache": True,
    "torch_dtype": "float32",
}
GENERATION_CONFIG = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
SEED = 20261122


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class Conv1D(nn.Module):
    """GPT-2's Conv1D: y = x @ weight + bias with weight [in, out]."""

    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_in, n_out))
        self.bias = nn.Parameter(torch.empty(n_out))

    def forward(self, x):
        return torch.matmul(x, self.weight) + self.bias


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_embd, self.n_head = cfg["n_embd"], cfg["n_head"]
        self.head_dim = self.n_embd // self.n_head
        n = cfg["n_positions"]
        self.register_buffer("bias", torch.tril(torch.ones((n, n), dtype=torch.bool)).view(1, 1, n, n))
        self.c_attn = Conv1D(self.n_embd, 3 * self.n_embd)
        self.c_proj = Conv1D(self.n_embd, self.n_embd)

    def split_heads(self, x):
        b, s = x.size(0), x.size(1)
        return x.view(b, s, self.n_head, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x, past_key, past_value, mask_add):
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)
        k = torch.cat((past_key, k), dim=-2)
        v = torch.cat((past_value, v), dim=-2)
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        q_len, k_len = q.size(-2), k.size(-2)
        causal = self.bias[:, :, k_len - q_len:k_len, :k_len]
        mask_value = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype)
        w = torch.where(causal, w, mask_value)
        w = w + mask_add
        w = torch.softmax(w, dim=-1)
        a = torch.matmul(w, v)
        a = a.permute(0, 2, 1, 3).contiguous()
        a = a.view(a.size(0), a.size(1), self.n_embd)
        return self.c_proj(a), k, v


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = Conv1D(cfg["n_embd"], cfg["n_inner"])
        self.c_proj = Conv1D(cfg["n_inner"], cfg["n_embd"])

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        eps = cfg["layer_norm_epsilon"]
        self.ln_1 = nn.LayerNorm(cfg["n_embd"], eps=eps)
        self.attn = Attention(cfg)
        self.ln_2 = nn.LayerNorm(cfg["n_embd"], eps=eps)
        self.mlp = MLP(cfg)

    def forward(self, x, past_key, past_value, mask_add):
        a, k, v = self.attn(self.ln_1(x), past_key, past_value, mask_add)
        x = x + a
        x = x + self.mlp(self.ln_2(x))
        return x, k, v


class GPT2LMHeadModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg["vocab_size"], cfg["n_embd"])
        self.wpe = nn.Embedding(cfg["n_positions"], cfg["n_embd"])
        self.h = nn.ModuleList([Block(cfg) for _ in range(cfg["n_layer"])])
        self.ln_f = nn.LayerNorm(cfg["n_embd"], eps=cfg["layer_norm_epsilon"])

    def forward(self, input_ids, attention_mask, position_ids, past):
        """past: [(key, value)] per layer, each [batch, heads, past, head_dim]."""
        x = self.wte(input_ids) + self.wpe(position_ids)
        dtype = x.dtype
        # GPT2Model: [batch, 1, 1, past + seq]; 0 where attended, finfo.min where not.
        mask = attention_mask[:, None, None, :].to(dtype)
        mask_add = (1.0 - mask) * torch.finfo(dtype).min
        presents = []
        for block, (pk, pv) in zip(self.h, past):
            x, k, v = block(x, pk, pv, mask_add)
            presents.append((k, v))
        x = self.ln_f(x)
        logits = torch.matmul(x, self.wte.weight.t())  # tied lm_head
        return logits, presents


class OptimumWrapper(nn.Module):
    """Flat Optimum signature; kv_dtype is the past/present type at the graph edge."""

    def __init__(self, model, kv_dtype):
        super().__init__()
        self.model, self.kv_dtype = model, kv_dtype

    def forward(self, input_ids, attention_mask, position_ids, *flat_past):
        past = []
        for i in range(0, len(flat_past), 2):
            past.append((flat_past[i].to(torch.float32), flat_past[i + 1].to(torch.float32)))
        logits, presents = self.model(input_ids, attention_mask, position_ids, past)
        out = [logits]
        for k, v in presents:
            out += [k.to(self.kv_dtype), v.to(self.kv_dtype)]
        return tuple(out)


def init_weights(model):
    g = torch.Generator().manual_seed(SEED)

    def randn(shape, std):
        return torch.randn(shape, generator=g) * std

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("wte.weight"):
                p.copy_(randn(p.shape, 0.3))
            elif name.endswith("wpe.weight"):
                p.copy_(randn(p.shape, 0.2))
            elif ".ln_" in name or name.startswith("ln_f"):
                if name.endswith("weight"):
                    p.copy_(1.0 + randn(p.shape, 0.1))
                else:
                    p.copy_(randn(p.shape, 0.05))
            elif name.endswith("weight"):
                p.copy_(randn(p.shape, 1.0 / math.sqrt(p.shape[0])))
            else:
                p.copy_(randn(p.shape, 0.05))


def export(model, path, kv_dtype):
    cfg = model.cfg
    L, H, D = cfg["n_layer"], cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    batch, seq, past_len = 2, 3, 5  # traced with a non-empty past, like Optimum
    g = torch.Generator().manual_seed(1)
    input_ids = torch.randint(3, cfg["vocab_size"], (batch, seq), generator=g)
    attention_mask = torch.ones(batch, past_len + seq, dtype=torch.int64)
    position_ids = torch.arange(past_len, past_len + seq, dtype=torch.int64).unsqueeze(0).expand(batch, seq).contiguous()
    flat_past = []
    names_in = ["input_ids", "attention_mask", "position_ids"]
    names_out = ["logits"]
    axes = {
        "input_ids": {0: "batch_size", 1: "sequence_length"},
        "attention_mask": {0: "batch_size", 1: "past_sequence_length + sequence_length"},
        "position_ids": {0: "batch_size", 1: "sequence_length"},
        "logits": {0: "batch_size", 1: "sequence_length"},
    }
    for i in range(L):
        for kind in ("key", "value"):
            flat_past.append(torch.randn(batch, H, past_len, D, generator=g).to(kv_dtype))
            names_in.append(f"past_key_values.{i}.{kind}")
            names_out.append(f"present.{i}.{kind}")
            axes[names_in[-1]] = {0: "batch_size", 2: "past_sequence_length"}
            axes[names_out[-1]] = {0: "batch_size", 2: "past_sequence_length + sequence_length"}
    wrapper = OptimumWrapper(model, kv_dtype).eval()
    with torch.no_grad():
        torch.onnx.export(
            wrapper,
            (input_ids, attention_mask, position_ids, *flat_past),
            path,
            input_names=names_in,
            output_names=names_out,
            dynamic_axes=axes,
            opset_version=14,
            do_constant_folding=True,
        )


def run(model, ids, past=None):
    """Runs one sequence (batch 1) in float64; returns logits [seq, vocab] and the new past."""
    cfg = model.cfg
    L, H, D = cfg["n_layer"], cfg["n_head"], cfg["n_embd"] // cfg["n_head"]
    if past is None:
        past = [(torch.zeros(1, H, 0, D, dtype=torch.float64), torch.zeros(1, H, 0, D, dtype=torch.float64)) for _ in range(L)]
    p = past[0][0].shape[2]
    input_ids = torch.tensor([ids], dtype=torch.int64)
    attention_mask = torch.ones(1, p + len(ids), dtype=torch.int64)
    position_ids = torch.arange(p, p + len(ids), dtype=torch.int64).unsqueeze(0)
    with torch.no_grad():
        logits, presents = model(input_ids, attention_mask, position_ids, past)
    return logits[0], presents


def rounded(t):
    return [round(float(x), 6) for x in t.reshape(-1).tolist()]


def prompt(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, CONFIG["vocab_size"], (n - 1,), generator=g).tolist()


def top2_margin(row):
    top = torch.topk(row, 2).values
    return float(top[0] - top[1])


def main():
    torch.manual_seed(SEED)
    model = GPT2LMHeadModel(CONFIG).eval()
    init_weights(model)

    os.makedirs(OUT, exist_ok=True)
    export(model, os.path.join(OUT, "model.onnx"), torch.float32)
    f16 = os.path.join(OUT, "f16kv")
    os.makedirs(f16, exist_ok=True)
    export(model, os.path.join(f16, "model.onnx"), torch.float16)
    for d in (OUT, f16):
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(CONFIG, f, indent=2)
            f.write("\n")
        with open(os.path.join(d, "generation_config.json"), "w") as f:
            json.dump(GENERATION_CONFIG, f, indent=2)
            f.write("\n")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copyfile(os.path.join(TOKENIZER_DIR, name), os.path.join(d, name))

    ref_model = GPT2LMHeadModel(CONFIG).eval()
    ref_model.load_state_dict(model.state_dict())
    ref_model = ref_model.double()

    ref = {"vocab_size": CONFIG["vocab_size"], "full": [], "cached": [], "greedy": []}
    # Full-sequence logits, no cache.
    for seed, n in ((11, 12), (12, 7), (13, 4), (14, 1)):
        ids = prompt(seed, n)
        logits, _ = run(ref_model, ids)
        ref["full"].append({"tokens": ids, "logits": rounded(logits)})
    # Cached decode: prefill, then single-token greedy steps through the model's past.
    for seed, n, steps in ((21, 5, 6), (22, 9, 4)):
        ids = prompt(seed, n)
        logits, past = run(ref_model, ids)
        rows, fed = [logits[-1]], []
        for _ in range(steps):
            nxt = int(torch.argmax(rows[-1]))
            fed.append(nxt)
            logits, past = run(ref_model, [nxt], past)
            rows.append(logits[-1])
        ref["cached"].append({"prompt": ids, "fed": fed, "logits": rounded(torch.stack(rows))})
    # Greedy continuations (eos ignored) for the engine test; the smallest top-2
    # margin along the way shows how safe an exact token comparison is.
    worst = math.inf
    for i in range(8):
        ids = prompt(100 + i, 1 + (i * 5) % 23)
        n_new = 6 + (i * 3) % 11
        seq, past, out = list(ids), None, []
        logits, past = run(ref_model, seq)
        for _ in range(n_new):
            worst = min(worst, top2_margin(logits[-1]))
            nxt = int(torch.argmax(logits[-1]))
            out.append(nxt)
            logits, past = run(ref_model, [nxt], past)
        ref["greedy"].append({"prompt": ids, "tokens": out})
    ref["greedy_min_top2_margin"] = round(worst, 6)
    if worst < 1e-3:
        sys.exit(f"greedy top-2 margin {worst} too small for an exact comparison; change SEED")
    with open(os.path.join(OUT, "reference.json"), "w") as f:
        json.dump(ref, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", OUT, "greedy min top-2 margin", worst)


if __name__ == "__main__":
    main()
