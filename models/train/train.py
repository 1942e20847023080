#!/usr/bin/env python3
"""Trains Conveyor's default model: a small Llama on the Brown corpus + nlp-corpus, on the CPU.

Inputs are the uint16 token-id files written by the Go tokenizer program (train.bin, val.bin: documents stored as
<s> ... </s>, concatenated). Training samples are random windows of the training stream. AdamW with linear warmup
and cosine decay; everything is seeded, so the same command reproduces the same weights on the same machine
(PyTorch CPU kernels are deterministic for a fixed thread count).

Writes the Hugging Face layout to --out: config.json, generation_config.json, model.safetensors (float16) and
training_log.txt (train/validation loss; tokenizer.json and tokenizer_config.json are written there by the Go
tokenizer program).

  /usr/bin/python3 models/train/train.py --bench 5          # time a few steps, print tokens/s
  /usr/bin/python3 models/train/train.py --steps 2485 --decay-start 1988   # the shipped model's run

With --deadline UNIX_TIME instead of --decay-start, the decay phase starts when the measured pace says it just fits
before the deadline; the log then records the --steps/--decay-start pair that reproduces the run.
"""

import argparse
import json
import math
import os
import random
import sys
import time

# On a shared machine, OpenMP threads that spin while waiting for each other slow training down by an order of
# magnitude (measured here: 2.8 s/step passive vs 21 s/step active, under load). Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama import LlamaForCausalLM, hf_state_dict, save_safetensors  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 4096,
    "hidden_size": 256,
    "intermediate_size": 768,
    "num_hidden_layers": 6,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 512,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "tie_word_embeddings": True,
    "use_cache": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "torch_dtype": "float16",
    "transformers_version": "4.44.0",
}

GENERATION_CONFIG = {
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "do_sample": True,
    "temperature": 0.8,
    "top_p": 0.95,
    "max_new_tokens": 128,
    "transformers_version": "4.44.0",
}


def log(fh, msg):
    print(msg, flush=True)
    if fh:
        fh.write(msg + "\n")
        fh.flush()


def batch(data, seq_len, batch_size, gen):
    """Random windows [batch, seq_len+1] of the token stream."""
    starts = torch.randint(0, len(data) - seq_len - 1, (batch_size,), generator=gen)
    return torch.stack([data[s:s + seq_len + 1] for s in starts.tolist()])


@torch.no_grad()
def evaluate(model, data, seq_len, max_windows=None):
    """Mean next-token loss over consecutive non-overlapping windows of data."""
    model.eval()
    n = (len(data) - 1) // seq_len
    if max_windows:
        n = min(n, max_windows)
    total, count = 0.0, 0
    for i in range(0, n, 16):
        rows = [data[j * seq_len:j * seq_len + seq_len + 1] for j in range(i, min(n, i + 16))]
        x = torch.stack(rows)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum")
        total += loss.item()
        count += x[:, 1:].numel()
    model.train()
    return total / count


def lr_at(step, warmup, peak, floor, decay_start, total):
    """Warmup-stable-decay: linear warmup, constant peak, then cosine decay to floor over [decay_start, total)."""
    if step < warmup:
        return peak * (step + 1) / warmup
    if decay_start is None or step < decay_start:
        return peak
    p = (step - decay_start) / max(1, total - decay_start)
    return floor + 0.5 * (peak - floor) * (1 + math.cos(math.pi * min(1.0, p)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.path.join(HERE, ".corpus"))
    ap.add_argument("--out", default=os.path.join(HERE, "..", "default"))
    ap.add_argument("--steps", type=int, default=3000,
                    help="total steps; with --deadline and no --decay-start, the upper bound on them")
    ap.add_argument("--decay-start", type=int, default=None,
                    help="step at which the learning rate starts decaying (fixes the schedule: reproducible run)")
    ap.add_argument("--decay-frac", type=float, default=0.2, help="fraction of the steps spent decaying")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--bench", type=int, default=0, help="time this many steps and exit")
    ap.add_argument("--deadline", type=float, default=0,
                    help="unix time by which training must end: without --decay-start, the decay phase starts when "
                         "the measured step time says it just fits before the deadline; training also stops there")
    args = ap.parse_args()

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    np.random.seed(args.seed)

    train = torch.from_numpy(np.fromfile(os.path.join(args.data, "train.bin"), dtype="<u2").astype(np.int64))
    val = torch.from_numpy(np.fromfile(os.path.join(args.data, "val.bin"), dtype="<u2").astype(np.int64))
    assert int(train.max()) < CONFIG["vocab_size"] and int(val.max()) < CONFIG["vocab_size"]

    cfg = dict(CONFIG)
    model = LlamaForCausalLM(cfg)
    init_gen = torch.Generator().manual_seed(args.seed)
    model.init_weights(init_gen)
    n_params = sum(p.numel() for p in model.parameters())

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8)
    data_gen = torch.Generator().manual_seed(args.seed + 1)
    tokens_per_step = args.batch * args.seq

    if args.bench:
        model.train()
        for i in range(args.bench + 1):
            if i == 1:
                t0 = time.time()
            x = batch(train, args.seq, args.batch, data_gen)
            loss = F.cross_entropy(model(x[:, :-1]).reshape(-1, cfg["vocab_size"]), x[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        dt = (time.time() - t0) / args.bench
        print(f"params {n_params}  {dt:.3f} s/step  {tokens_per_step / dt:.0f} tokens/s  loss {loss.item():.3f}")
        t1 = time.time()
        evaluate(model, val, args.seq, max_windows=32)
        print(f"eval of 32 windows: {time.time() - t1:.2f} s")
        return

    os.makedirs(args.out, exist_ok=True)
    fh = open(os.path.join(args.out, "training_log.txt"), "w")
    log(fh, "command: " + " ".join(["python3"] + [os.path.relpath(sys.argv[0])] + sys.argv[1:]))
    log(fh, f"torch {torch.__version__}, threads {args.threads}, seed {args.seed}")
    log(fh, f"train tokens {len(train)}, val tokens {len(val)}")
    log(fh, f"parameters {n_params} ({n_params / 1e6:.2f} M), tokens/step {tokens_per_step}, "
            f"at most {args.steps} steps = {args.steps * tokens_per_step} tokens "
            f"({args.steps * tokens_per_step / len(train):.2f} epochs)")
    log(fh, "config " + json.dumps({k: cfg[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                         "num_attention_heads", "num_key_value_heads", "vocab_size")}))

    decay_start, total = args.decay_start, args.steps
    if decay_start is None and not args.deadline:
        decay_start = int(round(args.steps * (1 - args.decay_frac)))
    if decay_start is not None:
        log(fh, f"schedule: decay from step {decay_start}, total steps {total}")
    ratio = args.decay_frac / (1 - args.decay_frac)
    model.train()
    t_start = time.time()
    step_times = []
    smooth = None
    step = 0
    while step < total:
        if decay_start is None and step >= args.warmup:
            # Start decaying once a decay phase of ratio*step steps at the measured pace (+10%) fills the time left,
            # or when the step bound says so.
            recent = step_times[-100:]
            pace = 1.1 * sum(recent) / len(recent)
            if step >= (1 - args.decay_frac) * args.steps or ratio * step * pace >= args.deadline - time.time():
                decay_start = step
                total = min(args.steps, step + int(math.ceil(ratio * step)))
                log(fh, f"schedule: decay from step {decay_start}, total steps {total} "
                        f"(reproduce with --steps {total} --decay-start {decay_start})")
        t_step = time.time()
        lr = lr_at(step, args.warmup, args.lr, args.min_lr, decay_start, total)
        for g in opt.param_groups:
            g["lr"] = lr
        x = batch(train, args.seq, args.batch, data_gen)
        logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, cfg["vocab_size"]), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        smooth = loss.item() if smooth is None else 0.95 * smooth + 0.05 * loss.item()
        step_times.append(time.time() - t_step)
        elapsed = time.time() - t_start
        if step % 20 == 0 or step == total - 1:
            log(fh, f"step {step:5d}  lr {lr:.2e}  train_loss {loss.item():.4f}  smoothed {smooth:.4f}  "
                    f"elapsed {elapsed / 60:.1f} min  {(step + 1) * tokens_per_step / elapsed:.0f} tok/s")
        if (step + 1) % args.eval_every == 0 and step != total - 1:
            v = evaluate(model, val, args.seq, max_windows=64)
            log(fh, f"step {step:5d}  val_loss(64 windows) {v:.4f}  ppl {math.exp(v):.2f}")
        step += 1
        if args.deadline and time.time() > args.deadline and step < total:
            log(fh, f"deadline reached after {step} steps: stopping early")
            break
    total_time = time.time() - t_start
    step -= 1

    v = evaluate(model, val, args.seq)
    log(fh, f"final: steps {step + 1}, tokens trained {(step + 1) * tokens_per_step}, time {total_time / 60:.1f} min, "
            f"train_loss(smoothed) {smooth:.4f}, val_loss {v:.4f}, val_ppl {math.exp(v):.2f} (full validation set)")

    with open(os.path.join(args.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out, "generation_config.json"), "w") as f:
        json.dump(GENERATION_CONFIG, f, indent=2)
        f.write("\n")
    save_safetensors(os.path.join(args.out, "model.safetensors"), hf_state_dict(model), torch.float16)
    log(fh, "wrote config.json, generation_config.json, model.safetensors")
    fh.close()


if __name__ == "__main__":
    main()
