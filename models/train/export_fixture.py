#!/usr/bin/env python3
"""Writes the cross-check fixture for the Go ONNX builder and prints greedy sample completions.

Loads models/default (config.json + the float16 model.safetensors, upcast to float32 — exactly the weights the Go
builder reads), runs the PyTorch reference Llama on a few prompts and stores, for every position, the first
HEAD_VOCAB logits, the argmax and the log-sum-exp of the whole row, plus the full logits row of each prompt's last
position, in models/default/reference_logits.json. models/default_crosscheck_test.go compares Conveyor's ONNX
graph against it.

  /usr/bin/python3 models/train/export_fixture.py [--samples]
"""

import argparse
import json
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see train.py

import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bpe import Tokenizer  # noqa: E402
from llama import load_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
HEAD_VOCAB = 64

PROMPTS = [
    "The jury said that the city",
    "Once upon a time, there was a little",
    "In 1961, the President of the United States",
    # A longer prompt, so that positions well past the short ones are covered (rotary embeddings, masking).
    "It is not contended that the section should prescribe the survival of all of the tax attributes. "
    "Such an interpretation could not be justified by a construction of the statute alone, and it would "
    "certainly violate the intention of the committee as expressed in its report on the bill.",
]

SAMPLE_PROMPTS = [
    "The jury said that",
    "Once upon a time, there was a little girl who",
    "The President of the United States",
    "My favorite food is",
    "In the morning, the children",
]


def r(x):
    return round(float(x), 5)


@torch.no_grad()
def greedy(model, ids, n, eos=2, max_pos=512):
    ids = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([ids[-max_pos:]]))[0, -1]
        nxt = int(logits.argmax())
        if nxt == eos:
            break
        ids.append(nxt)
    return ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=os.path.join(HERE, "..", "default"))
    ap.add_argument("--samples", action="store_true", help="also print greedy completions")
    args = ap.parse_args()
    torch.set_num_threads(2)

    model, cfg = load_model(args.model)
    tok = Tokenizer(os.path.join(args.model, "tokenizer.json"))

    prompts = []
    with torch.no_grad():
        for text in PROMPTS:
            ids = tok.encode(text, bos=True)
            logits = model(torch.tensor([ids]))[0].to(torch.float32)
            prompts.append({
                "text": text,
                "ids": ids,
                "logits_head": [[r(v) for v in row[:HEAD_VOCAB]] for row in logits],
                "argmax": [int(row.argmax()) for row in logits],
                "logsumexp": [r(torch.logsumexp(row, dim=0)) for row in logits],
                "last_logits": [r(v) for v in logits[-1]],
            })
    fixture = {
        "description": "Reference logits of models/default from the PyTorch Llama in models/train/llama.py "
                       "(float32 math on the float16 checkpoint). Regenerate with "
                       "/usr/bin/python3 models/train/export_fixture.py after retraining.",
        "vocab_size": cfg["vocab_size"],
        "head_vocab": HEAD_VOCAB,
        "prompts": prompts,
    }
    out = os.path.join(args.model, "reference_logits.json")
    with open(out, "w") as f:
        json.dump(fixture, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {out}: {len(prompts)} prompts, {[len(p['ids']) for p in prompts]} tokens")

    if args.samples:
        for text in SAMPLE_PROMPTS:
            ids = tok.encode(text, bos=True)
            out_ids = greedy(model, ids, 48)
            print(f"PROMPT: {text}\nGREEDY: {text}{tok.decode(out_ids[len(ids):])}\n")


if __name__ == "__main__":
    main()
