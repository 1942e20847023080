"""Minimal byte-level BPE encoder/decoder for the default model's tokenizer.json (ASCII text only).

Good enough for fixture prompts and sample completions without a tokenizer library; the Go tokenizer (sugarme) is
the reference, and the cross-check test compares the two on the fixture prompts.
"""

import json
import re

# The ByteLevel pre-tokenizer's split, restricted to ASCII (where \p{L} is [A-Za-z] and \p{N} is [0-9]).
SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1)) + \
        list(range(ord("\xae"), ord("\xff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


class Tokenizer:
    def __init__(self, path):
        with open(path) as f:
            tj = json.load(f)
        self.vocab = tj["model"]["vocab"]
        self.inv = {i: t for t, i in self.vocab.items()}
        merges = tj["model"]["merges"]
        self.ranks = {(m[0], m[1]) if isinstance(m, list) else tuple(m.split(" ")): i for i, m in enumerate(merges)}
        self.special = {t["id"] for t in tj["added_tokens"] if t["special"]}
        self.b2u = bytes_to_unicode()
        self.u2b = {u: b for b, u in self.b2u.items()}

    def _bpe(self, word):
        parts = list(word)
        while len(parts) > 1:
            best, best_rank = None, None
            for i in range(len(parts) - 1):
                r = self.ranks.get((parts[i], parts[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best, best_rank = i, r
            if best is None:
                break
            parts = parts[:best] + [parts[best] + parts[best + 1]] + parts[best + 2:]
        return parts

    def encode(self, text, bos=True):
        ids = [1] if bos else []
        for piece in SPLIT.findall(text):
            word = "".join(self.b2u[b] for b in piece.encode("utf-8"))
            ids.extend(self.vocab[p] for p in self._bpe(word))
        return ids

    def decode(self, ids, skip_special=True):
        toks = [self.inv[i] for i in ids if not (skip_special and i in self.special)]
        return bytes(self.u2b[c] for c in "".join(toks)).decode("utf-8", errors="replace")
