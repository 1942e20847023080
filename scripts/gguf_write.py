#!/usr/bin/env python3
"""Write a Hugging Face checkpoint directory as a GGUF file, as llama.cpp's converter would.

    PYTHONPATH=LLAMA_CPP/gguf-py python3 scripts/gguf_write.py CHECKPOINT_DIR OUT.gguf [--outtype f32|f16] [--pre NAME]

CHECKPOINT_DIR holds config.json, *.safetensors (F32, F16 or BF16), tokenizer.json and
tokenizer_config.json. The file written is what llama.cpp's convert_hf_to_gguf.py (b4747)
writes for the same directory, for its two classes used here, through gguf-py's
GGUFWriter:

  - LlamaForCausalLM (LlamaModel): the base hyperparameters, vocab_size and
    rope.dimension_count; the query and key rows permuted into llama.cpp's rotary layout
    (LlamaModel.permute, with the key/value head count for the keys);
  - Qwen2ForCausalLM (Qwen2Model): the base hyperparameters, tensors as they are (biases
    included).

Tensors are renamed with gguf-py's tensor map; 1-D tensors and norm weights are F32, the
others F32 or F16 (--outtype). llama-quantize makes Q8_0, Q4_K_M, ... from this file.

The vocabulary is the "gpt2" (byte-level BPE) path, _set_vocab_gpt2: every id below the
config's vocab_size, [PAD<i>] (UNUSED) for ids the tokenizer lacks, added tokens CONTROL
when special or when they look special (<|...|>), USER_DEFINED otherwise, the merges,
bos/eos/unk/pad ids, add_bos/add_eos and the chat template (gguf-py's SpecialVocab).

One difference: convert_hf_to_gguf.py picks tokenizer.ggml.pre by hashing the ids that
transformers gives for a fixed text, which needs transformers. Here the name is chosen
from tokenizer.json's pre-tokenizer instead: Llama 3's split pattern is "llama-bpe",
Qwen2's is "qwen2", a lone GPT-2 ByteLevel(use_regex) is "gpt-2". --pre NAME overrides.

A SentencePiece-style tokenizer.json (BPE with byte fallback: Llama 2, Gemma) is written as
tokenizer.ggml.model "llama", as convert_hf_to_gguf.py writes a tokenizer.model: pieces in
id order with scores falling with the id (SentencePiece orders a BPE model's pieces by
score; 0 for byte, control and unknown pieces), and add_space_prefix from the normalizer's
Prepend. tokenizer.model itself is not read.

Needs numpy and gguf-py only; gguf-py's optional imports (sentencepiece, yaml) are stubbed
when absent, as neither is used on this path.
"""

import argparse
import json
import re
import struct
import sys
import types
from pathlib import Path

import numpy as np

for _mod in ("sentencepiece", "yaml"):  # imported by gguf-py's vocab.py and metadata.py, unused here
    try:
        __import__(_mod)
    except ImportError:
        stub = types.ModuleType(_mod)
        stub.SentencePieceProcessor = None
        sys.modules[_mod] = stub

import gguf  # noqa: E402  (after the stubs)

# The pre-tokenizer split patterns of tokenizer.json, as llama.cpp's pre names know them.
LLAMA3_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
QWEN2_SPLIT = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
               "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")

ARCHS = {"LlamaForCausalLM": gguf.MODEL_ARCH.LLAMA, "Qwen2ForCausalLM": gguf.MODEL_ARCH.QWEN2}


def read_safetensors(path):
    """Yields (name, float16 or float32 array) for every tensor of one .safetensors file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            f.seek(base + start)
            raw = f.read(end - start)
            dtype = info["dtype"]
            if dtype == "F32":
                a = np.frombuffer(raw, dtype="<f4")
            elif dtype == "F16":
                a = np.frombuffer(raw, dtype="<f2")
            elif dtype == "BF16":  # as prepare_tensors: anything but F16/F32 becomes F32
                a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                raise SystemExit(f"{path}: tensor {name}: dtype {dtype} not handled")
            yield name, a.reshape(info["shape"])


def permute(w, n_head, n_head_kv):
    """LlamaModel.permute: HF's rotate-half row order to llama.cpp's interleaved pairs."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def pre_tokenizer_name(tok):
    """The tokenizer.ggml.pre name for tokenizer.json's pre-tokenizer, or None."""
    pre = tok.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    splits = [s["pattern"].get("Regex") for s in steps if s.get("type") == "Split"]
    if splits == [LLAMA3_SPLIT]:
        return "llama-bpe"
    if splits == [QWEN2_SPLIT]:
        return "qwen2"
    if not splits and len(steps) == 1 and steps[0].get("type") == "ByteLevel" and steps[0].get("use_regex", True):
        return "gpt-2"
    return None


def does_token_look_special(text):
    """Model.does_token_look_special."""
    return (text in ("<pad>", "<mask>", "<2mass>", "[@BOS@]")
            or (text.startswith("<|") and text.endswith("|>"))
            or (text.startswith("<｜") and text.endswith("｜>"))
            or (text.startswith("<unused") and text.endswith(">")))


def set_vocab_gpt2(w, d, hparams, pre):
    """Model._set_vocab_gpt2 with get_vocab_base's tokens and types."""
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = dict(tok["model"]["vocab"])
    added = {a["content"]: a for a in tok.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    vocab_size = hparams.get("vocab_size", len(vocab))
    assert max(vocab.values()) < vocab_size
    pre = pre or pre_tokenizer_name(tok)
    if pre is None:
        raise SystemExit(f"{d}: pre-tokenizer not recognized; pass --pre NAME (llama.cpp's tokenizer.ggml.pre)")
    reverse = {i: t for t, i in vocab.items()}
    tokens, types_ = [], []
    for i in range(vocab_size):
        if i not in reverse:
            tokens.append(f"[PAD{i}]")
            types_.append(gguf.TokenType.UNUSED)
            continue
        t = reverse[i]
        if t in added:
            # get_vocab_base decodes(encodes) an unnormalized added token: the identity for
            # these byte-level tokenizers, whose added tokens are matched whole.
            if added[t].get("special") or does_token_look_special(t):
                types_.append(gguf.TokenType.CONTROL)
            else:
                t = t.replace("\u2581", " ")
                types_.append(gguf.TokenType.USER_DEFINED)
        else:
            types_.append(gguf.TokenType.NORMAL)
        tokens.append(t)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types_)
    gguf.SpecialVocab(d, load_merges=True).add_to_gguf(w)
    return pre


def set_vocab_spm(w, d, hparams):
    """A SentencePiece-style tokenizer (tokenizer.json's BPE with byte fallback: Llama 2,
    Gemma) as tokenizer.ggml.model "llama", the way a tokenizer.model converts: pieces in id
    order, scores falling with the id (SentencePiece orders a BPE model's pieces by score,
    and Hugging Face's conversion orders the merges the same way; 0 for byte, control and
    unknown pieces), types from the added tokens and byte pieces, and add_space_prefix from
    the normalizer's Prepend."""
    tok = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    model = tok["model"]
    vocab = dict(model["vocab"])
    added = {a["id"]: a for a in tok.get("added_tokens", [])}
    for a in added.values():
        vocab[a["content"]] = a["id"]
    vocab_size = hparams.get("vocab_size", max(vocab.values()) + 1)
    reverse = {i: t for t, i in vocab.items()}
    unk = model.get("unk_token")
    tokens, scores, types_ = [], [], []
    for i in range(vocab_size):
        t = reverse.get(i)
        if t is None:
            tokens.append(f"[PAD{i}]")
            scores.append(-1000.0)
            types_.append(gguf.TokenType.UNUSED)
            continue
        tokens.append(t)
        if i in added and t != unk:
            a = added[i]
            types_.append(gguf.TokenType.CONTROL if a.get("special") or does_token_look_special(t) else gguf.TokenType.USER_DEFINED)
            scores.append(0.0)
        elif t == unk:
            types_.append(gguf.TokenType.UNKNOWN)
            scores.append(0.0)
        elif re.fullmatch(r"<0x[0-9A-Fa-f]{2}>", t):
            types_.append(gguf.TokenType.BYTE)
            scores.append(0.0)
        else:
            types_.append(gguf.TokenType.NORMAL)
            scores.append(-float(i))
    norm = tok.get("normalizer") or {}
    steps = norm.get("normalizers", [norm]) if norm.get("type") == "Sequence" else [norm]
    prepend = any(st and st.get("type") == "Prepend" for st in steps)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types_)
    w.add_add_space_prefix(prepend)
    gguf.SpecialVocab(d, load_merges=False).add_to_gguf(w)
    return "default (SentencePiece)"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--outtype", choices=("f32", "f16"), default="f16")
    ap.add_argument("--pre", help="tokenizer.ggml.pre to write instead of the one recognized")
    args = ap.parse_args()
    d = args.checkpoint
    hparams = json.loads((d / "config.json").read_text())
    arch_name = hparams["architectures"][0]
    if arch_name not in ARCHS:
        raise SystemExit(f"{d}: architecture {arch_name} not handled (want one of {', '.join(ARCHS)})")
    arch = ARCHS[arch_name]
    if (d / "tokenizer.model").exists():
        raise SystemExit(f"{d}: a SentencePiece tokenizer.model is not handled")
    ftype = gguf.LlamaFileType.ALL_F32 if args.outtype == "f32" else gguf.LlamaFileType.MOSTLY_F16
    n_layer = hparams["num_hidden_layers"]
    tmap = gguf.get_tensor_name_map(arch, n_layer)
    w = gguf.GGUFWriter(path=None, arch=gguf.MODEL_ARCH_NAMES[arch])

    # prepare_tensors
    n_head, n_kv = hparams["num_attention_heads"], hparams.get("num_key_value_heads")
    parts = sorted(p for p in d.iterdir() if p.name.startswith("model") and p.suffix == ".safetensors")
    if not parts:
        raise SystemExit(f"{d}: no model*.safetensors")
    n_params = 0
    for part in parts:
        for name, data in read_safetensors(part):
            if name.endswith((".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")):
                continue
            if arch == gguf.MODEL_ARCH.LLAMA:
                if name.endswith(("q_proj.weight", "q_proj.bias")):
                    data = permute(data, n_head, n_head)
                if name.endswith(("k_proj.weight", "k_proj.bias")):
                    data = permute(data, n_head, n_kv)
            new = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
            if new is None:
                raise SystemExit(f"{part}: can not map tensor {name!r}")
            if data.ndim <= 1 or new.endswith("_norm.weight") or not new.endswith(".weight") \
                    or ftype == gguf.LlamaFileType.ALL_F32:
                qtype = gguf.GGMLQuantizationType.F32
            else:
                qtype = gguf.GGMLQuantizationType.F16
            data = gguf.quants.quantize(np.ascontiguousarray(data), qtype)
            n_params += data.size
            w.add_tensor(new, data, raw_dtype=qtype)

    # prepare_metadata: name, parameters, vocabulary, quantization version
    w.add_type(gguf.GGUFType.MODEL)
    w.add_name(d.resolve().name)
    w.add_block_count(n_layer)
    for key, add in (("max_position_embeddings", w.add_context_length), ("hidden_size", w.add_embedding_length),
                     ("intermediate_size", w.add_feed_forward_length), ("num_attention_heads", w.add_head_count),
                     ("num_key_value_heads", w.add_head_count_kv), ("rope_theta", w.add_rope_freq_base),
                     ("rms_norm_eps", w.add_layer_norm_rms_eps)):
        if hparams.get(key) is not None:
            add(hparams[key])
    if hparams.get("head_dim") is not None:
        w.add_key_length(hparams["head_dim"])
        w.add_value_length(hparams["head_dim"])
    w.add_file_type(ftype)
    rs = hparams.get("rope_scaling")
    if arch == gguf.MODEL_ARCH.LLAMA:
        w.add_vocab_size(hparams["vocab_size"])
        w.add_rope_dimension_count(hparams.get("head_dim", hparams["hidden_size"] // hparams["num_attention_heads"]))
        if rs is not None and "factor" in rs:
            if rs.get("type") == "linear":
                w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
                w.add_rope_scaling_factor(rs["factor"])
            elif rs.get("rope_type", "").lower() == "llama3":
                raise SystemExit(f"{d}: llama3 rope scaling (rope_freqs) is not handled")
    elif rs is not None and "factor" in rs and rs.get("type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rs["factor"])
        w.add_rope_scaling_orig_ctx_len(rs["original_max_position_embeddings"])
    tokj = json.loads((d / "tokenizer.json").read_text(encoding="utf-8"))
    if tokj["model"].get("byte_fallback"):
        pre = set_vocab_spm(w, d, hparams)
    else:
        pre = set_vocab_gpt2(w, d, hparams, args.pre)
    if arch == gguf.MODEL_ARCH.LLAMA and not tokj["model"].get("byte_fallback"):
        cfg = d / "tokenizer_config.json"
        if cfg.is_file():
            tc = json.loads(cfg.read_text(encoding="utf-8"))
            if "add_prefix_space" in tc:
                w.add_add_space_prefix(tc["add_prefix_space"])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    w.write_header_to_file(path=args.out)
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{args.out}: {gguf.MODEL_ARCH_NAMES[arch]}, {args.outtype}, pre {pre}, {n_params} values")


if __name__ == "__main__":
    main()
