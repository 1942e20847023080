#!/usr/bin/env bash
# The GGUF check: Conveyor against llama.cpp on the same GGUF files, on the CPU.
#
# Needs: a built llama.cpp tree in LLAMA_CPP (build/bin/llama-server, llama-quantize,
# llama-perplexity; gguf-py/ for the writer), /usr/bin/python3 (or PYTHON) with numpy, curl,
# and Go (bin/conveyor is built from this tree at each run; CONVEYOR names another
# binary). It is not part of `make test`: CI has no llama.cpp.
#
# What it does, writing every file under OUT_DIR (default $TMPDIR/gguf-check or /tmp/gguf-check)
# and the figures to OUT_DIR/report.md:
#   0. writes the GGUF files: the default model (models/default) as F32 and F16 with
#      scripts/gguf_write.py (what llama.cpp's convert_hf_to_gguf.py writes), Q8_0 and Q4_K_M
#      from the F32 file with llama-quantize; a random Qwen2.5-0.5B-shaped checkpoint
#      (models/testdata/qwen2-0.5b with Qwen3's tokenizer, `conveyor build-model --random`)
#      as F16, and Q8_0 and Q4_K_M from it;
#   1. llama-server loads each file;
#   2. token ids of llama-server's /tokenize and Conveyor's /tokenize on the same file, over
#      the tokenizer's multilingual reference texts (tokenizer/testdata/hf_refs.json) and
#      tokenizer/testdata/corpus.txt's lines, for the default model's file, the Qwen one
#      and tiny files carrying the real tokenizers of Llama 3.1, Llama 2 and Gemma 3 (from
#      `make tokenizer-files`; SentencePiece ones written as tokenizer.ggml.model "llama"
#      by scripts/gguf_write.py); a Qwen text that differs only because llama.cpp does not
#      NFC-normalize is counted apart;
#   3. 64 greedy tokens from llama-server and from Conveyor (--quantize none) on the
#      default model's F32 and F16 files, ten prompts: identical ids, and where they part,
#      whether llama.cpp's top two probabilities were within 1e-4 (a tie); the same on the
#      model families' float32 files of every architecture b4747 runs (needs Go);
#   4. perplexity of the same text with the default model's F32, Q8_0 and Q4_K_M files:
#      llama-perplexity, `conveyor perplexity` (each its own method), and llama-perplexity's
#      method (chunks of 256 tokens starting with BOS, the second half scored) computed
#      from Conveyor's prompt logprobs, so the two engines are compared on one metric;
#   5. with GGUF_CHECK_SPEED=1: `conveyor bench` (128 -> 128 tokens, 1 and 16 streams)
#      against llama-server (-t 2, -np 1 or 16) and `conveyor serve` (default flags) on the
#      0.5B Q8_0 and Q4_K_M files, one server at a time; and Conveyor's time from start to
#      ready for the 0.5B Q8_0 file, built first, then cached.
#
# Usage: LLAMA_CPP=/path/to/llama.cpp scripts/gguf-check.sh [OUT_DIR]
# (GGUF_CHECK_LLAMA_VERSION names llama.cpp's release in the report when its tree has no .git;
# GGUF_CHECK_THREADS, default 2, is llama.cpp's -t and Conveyor perplexity's --threads.)
# Steps 0-4 take about five minutes on two cores; step 5 about fifteen more.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
: "${LLAMA_CPP:?set LLAMA_CPP to a built llama.cpp tree (build/bin/llama-server ...)}"
lbin=$LLAMA_CPP/build/bin
out=${1:-${TMPDIR:-/tmp}/gguf-check}
rm -rf "$out/cache" "$out/logs"  # a fresh cache: the first Conveyor start on a file builds it
mkdir -p "$out/files" "$out/logs"
out=$(cd "$out" && pwd)
files=$out/files
py=${PYTHON:-/usr/bin/python3}
threads=${GGUF_CHECK_THREADS:-2}
lport=${GGUF_CHECK_LLAMA_PORT:-8401}
cport=${GGUF_CHECK_CONVEYOR_PORT:-8402}
export CONVEYOR_CACHE_DIR=$out/cache
export PYTHONPATH=$LLAMA_CPP/gguf-py${PYTHONPATH:+:$PYTHONPATH}
for b in llama-server llama-quantize llama-perplexity; do
	[ -x "$lbin/$b" ] || { echo "gguf-check: $lbin/$b missing: build llama.cpp first"; exit 1; }
done

script_name=gguf-check
. scripts/servers.sh

# llama_up FILE [ARGS...]: llama-server on FILE at $lport; sets lpid.
llama_up() {
	local f=$1 log=$out/logs/llama-server-$(basename "$1" .gguf).log
	shift
	"$lbin/llama-server" -m "$f" --host 127.0.0.1 --port "$lport" -t "$threads" "$@" >"$log" 2>&1 &
	lpid=$!
	pids+=("$lpid")
	wait_ready "http://127.0.0.1:$lport/health" "$lpid" "$log"
}

# conveyor_up FILE [ARGS...]: conveyor serve FILE at $cport; sets cpid and ready_s (seconds
# from start to ready).
conveyor_up() {
	local f=$1 log=$out/logs/conveyor-$(basename "$1" .gguf)-$(date +%s).log t0
	shift
	t0=$(date +%s.%N)
	"$conveyor" serve --model "$f" --port "$cport" "$@" >"$log" 2>&1 &
	cpid=$!
	pids+=("$cpid")
	wait_ready "http://127.0.0.1:$cport/health" "$cpid" "$log"
	ready_s=$(awk "BEGIN { printf \"%.1f\", $(date +%s.%N) - $t0 }")
}


# The comparisons, in Python (stdlib, plus gguf-py and numpy for reading a file's vocabulary).
cat >"$out/compare.py" <<'PY'
import json, math, sys, unicodedata, urllib.request

def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())

def llama_ids(lurl, text):
    return post(lurl + "/tokenize", {"content": text, "add_special": True})["tokens"]

def conveyor_ids(curl, text):
    return post(curl + "/tokenize", {"prompt": text})["tokens"]

def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

def tokenize(lurl, curl, texts_file, label, nfc):
    """Prints a markdown row and the mismatches; nfc: count NFC-only differences apart."""
    texts = json.load(open(texts_file))
    same = nfc_only = 0
    bad = []
    for t in texts:
        a, b = llama_ids(lurl, t), conveyor_ids(curl, t)
        if a == b:
            same += 1
        elif nfc and llama_ids(lurl, unicodedata.normalize("NFC", t)) == b:
            nfc_only += 1
            if nfc_only <= 2:
                i = first_diff(a, b)
                print(f"| NFC only, {label} | {json.dumps(t)[:80]} | position {i} | llama.cpp {a[max(0, i-2):i+4]} | Conveyor {b[max(0, i-2):i+4]} |", file=sys.stderr)
        else:
            bad.append((t, a, b))
    print(f"| {label} | {len(texts)} | {same} | {nfc_only if nfc else '-'} | {len(bad)} |")
    for t, a, b in bad[:10]:
        i = first_diff(a, b)
        print(f"|   mismatch | {json.dumps(t, ensure_ascii=False)[:80]} | position {i} | llama.cpp {a[max(0, i-2):i+4]} | Conveyor {b[max(0, i-2):i+4]} |", file=sys.stderr)

def vocab_bytes(gguf_path):
    """token bytes -> id for the file's byte-level vocabulary (normal and user tokens)."""
    import types
    for mod in ("sentencepiece", "yaml"):  # gguf-py imports them; unused here
        try:
            __import__(mod)
        except ImportError:
            sys.modules[mod] = types.ModuleType(mod)
            sys.modules[mod].SentencePieceProcessor = None
    import gguf
    r = gguf.GGUFReader(gguf_path)
    f, ft = r.fields["tokenizer.ggml.tokens"], r.fields["tokenizer.ggml.token_type"]
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    dec = {chr(c): b for b, c in zip(bs, cs)}
    out = {}
    for i, (p, t) in enumerate(zip(f.data, ft.data)):
        if int(ft.parts[t][0]) in (1, 4):  # NORMAL, USER_DEFINED
            s = bytes(f.parts[p]).decode("utf-8")
            try:
                out.setdefault(bytes(dec[c] for c in s), i)
            except KeyError:
                out.setdefault(s.encode(), i)
    return out, int(r.fields["tokenizer.ggml.eos_token_id"].parts[-1][0])

def greedy(lurl, curl, model, gguf_path, prompts_file, label, n=64):
    """Greedy continuations from both engines on the same prompt ids. llama-server's ignore_eos
    takes end of sequence out of the choices (a -inf bias on it); Conveyor's, as vLLM's, only
    does not stop there, so Conveyor gets a -100 bias on it too."""
    vb, eos = vocab_bytes(gguf_path)
    prompts = json.load(open(prompts_file))
    rows, ident, ties_total, gaps = [], 0, 0, []
    for p in prompts:
        ids = p if isinstance(p, list) else llama_ids(lurl, p)  # a list is prompt ids
        lr = post(lurl + "/completion", {"prompt": ids, "n_predict": n, "temperature": 0, "n_probs": 2,
                                          "ignore_eos": True, "return_tokens": True, "cache_prompt": False})
        la = lr["tokens"]
        lp = lr["completion_probabilities"]
        cr = post(curl + "/v1/completions", {"model": model, "prompt": ids, "max_tokens": n, "temperature": 0,
                                              "logprobs": 2, "ignore_eos": True, "logit_bias": {str(eos): -100}})
        lg = cr["choices"][0]["logprobs"]
        cb = [vb.get(t.encode(), -1) if "\ufffd" not in t else -1 for t in lg["tokens"]]
        # a token Conveyor shows as U+FFFD (part of a character) is taken as llama.cpp's when its piece is too
        cb = [c if c >= 0 or lp[i]["token"] != lg["tokens"][i] else la[i] for i, c in enumerate(cb)]
        ties = []
        for i, e in enumerate(lp):
            top = sorted((math.exp(x["logprob"]) for x in e["top_logprobs"]), reverse=True)
            if len(top) > 1 and top[0] - top[1] < 1e-4:
                ties.append(i)
        d = first_diff(la, cb)
        m = min(d, len(la), len(cb))
        for i in range(m):
            gaps.append(abs(lp[i]["logprob"] - lg["token_logprobs"][i]))
        same = la == cb
        ident += same
        ties_total += len(ties)
        note = "identical" if same else f"differ at {d}: llama.cpp {la[d:d+3]}, Conveyor {cb[d:d+3]}" + (
            " (llama.cpp top-2 tie there)" if d in ties else "")
        rows.append(f"| {label} | {json.dumps(p)[:40]} | {len(ids)} | {note} | {len(ties)} |")
    print("\n".join(rows))
    print(f"| {label} | **all** | | **{ident}/{len(prompts)} identical**; max abs diff of the chosen token's "
          f"logprob before any divergence: {max(gaps):.2e} | {ties_total} |")

def ppl_llama_method(curl, model, text_file, n_ctx, label):
    """llama-perplexity's metric from Conveyor's prompt logprobs: chunks of n_ctx tokens of the
    BOS-prefixed text, the first replaced by BOS, tokens n_ctx/2+1 .. n_ctx-1 scored."""
    text = open(text_file).read()
    toks = conveyor_ids(curl, text)
    bos = toks[0]
    first = n_ctx // 2
    nll, count = 0.0, 0
    for c in range(len(toks) // n_ctx):
        chunk = toks[c * n_ctx:(c + 1) * n_ctx]
        chunk[0] = bos
        r = post(curl + "/v1/completions", {"model": model, "prompt": chunk, "max_tokens": 0, "echo": True,
                                             "logprobs": 1, "temperature": 0})
        lps = r["choices"][0]["logprobs"]["token_logprobs"]
        nll -= sum(lps[first + 1:n_ctx])
        count += n_ctx - 1 - first
    print(f"{math.exp(nll / count):.4f}")

cmd = sys.argv[1]
if cmd == "tokenize":
    tokenize(*sys.argv[2:6], nfc=sys.argv[6] == "nfc")
elif cmd == "greedy":
    greedy(*sys.argv[2:8])
elif cmd == "ppl":
    ppl_llama_method(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
PY
compare() { "$py" "$out/compare.py" "$@"; }
L=http://127.0.0.1:$lport
C=http://127.0.0.1:$cport
report=$out/report.md
{
	echo "# GGUF check: Conveyor against llama.cpp"
	echo
	echo "$(date -u +%FT%TZ); CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores;"
	echo "llama.cpp ${GGUF_CHECK_LLAMA_VERSION:-$(git -C "$LLAMA_CPP" describe --tags 2>/dev/null || "$lbin/llama-server" --version 2>&1 | grep -m1 version)} ($LLAMA_CPP);"
	echo "Conveyor $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet || echo ' (with local changes)')."
} >"$report"

# 0. The files.
if [ ! -f "$files/default-q4_k_m.gguf" ]; then
	"$py" scripts/gguf_write.py models/default "$files/default-f32.gguf" --outtype f32
	"$py" scripts/gguf_write.py models/default "$files/default-f16.gguf" --outtype f16
	"$lbin/llama-quantize" "$files/default-f32.gguf" "$files/default-q8_0.gguf" Q8_0 >"$out/logs/quantize.log" 2>&1
	"$lbin/llama-quantize" "$files/default-f32.gguf" "$files/default-q4_k_m.gguf" Q4_K_M >>"$out/logs/quantize.log" 2>&1
fi
if [ ! -f "$files/qwen05-q4_k_m.gguf" ]; then
	mkdir -p "$out/q05src"
	cp models/testdata/qwen2-0.5b/config.json .tokenizers/qwen3/tokenizer.json .tokenizers/qwen3/tokenizer_config.json "$out/q05src/"
	"$conveyor" build-model --random --hf-checkpoint --config "$out/q05src/config.json" --out "$out/q05hf" >"$out/logs/q05hf.log" 2>&1
	"$py" scripts/gguf_write.py "$out/q05hf" "$files/qwen05-f16.gguf" --outtype f16
	"$lbin/llama-quantize" "$files/qwen05-f16.gguf" "$files/qwen05-q8_0.gguf" Q8_0 >>"$out/logs/quantize.log" 2>&1
	"$lbin/llama-quantize" "$files/qwen05-f16.gguf" "$files/qwen05-q4_k_m.gguf" Q4_K_M >>"$out/logs/quantize.log" 2>&1
	rm -rf "$out/q05hf"
fi

# 1. llama-server loads every file.
{
	echo
	echo "## 1. llama-server loads the files"
	echo
	echo "| File | Size (MB) | llama-server |"
	echo "|---|---|---|"
} >>"$report"
for f in default-f32 default-f16 default-q8_0 default-q4_k_m qwen05-f16 qwen05-q8_0 qwen05-q4_k_m; do
	if llama_up "$files/$f.gguf" -c 512; then r=loaded; else r="**failed** (logs/llama-server-$f.log)"; fi
	down "$lpid"
	echo "| $f.gguf | $(($(stat -c %s "$files/$f.gguf") / 1000000)) | $r |" >>"$report"
done

# 2. Token ids. The texts: the reference texts and corpus.txt's lines.
"$py" - "$out/texts.json" <<'PY'
import json, sys
t = json.load(open("tokenizer/testdata/hf_refs.json"))["texts"]
t += [l for l in open("tokenizer/testdata/corpus.txt").read().split("\n") if l.strip()]
json.dump(t, open(sys.argv[1], "w"), ensure_ascii=False)
PY
{
	echo
	echo "## 2. Token ids: llama-server /tokenize vs Conveyor /tokenize (add special tokens)"
	echo
	echo "| File | Texts | Identical | Differ only by NFC | Differ |"
	echo "|---|---|---|---|---|"
} >>"$report"
llama_up "$files/default-f32.gguf" -c 512
conveyor_up "$files/default-f32.gguf" --quantize none
compare tokenize "$L" "$C" "$out/texts.json" "default (gpt-2 pre)" plain >>"$report" 2>"$out/mismatch-default.md"
# 3 reuses these two servers (F32, --quantize none).
prompts=$out/prompts.json
cat >"$prompts" <<'JSON'
["Once upon a time", "The quick brown fox", "One day a traveller arrived at the village.", "The old man looked at the sea and said",
 "In the morning the children", "She opened the door and", "It was a dark and stormy night;", "The president of the company announced",
 "\"Where are you going?\" asked the baker,", "After the war, the town"]
JSON
{
	echo
	echo "## 3. Greedy decoding: 64 tokens, llama-server vs Conveyor (--quantize none), same prompt ids"
	echo
	echo "| File | Prompt | Prompt tokens | Generated ids | llama.cpp top-2 ties (< 1e-4) |"
	echo "|---|---|---|---|---|"
} >"$report.greedy"
compare greedy "$L" "$C" default-f32.gguf "$files/default-f32.gguf" "$prompts" F32 >>"$report.greedy"
down "$lpid"
down "$cpid"
llama_up "$files/default-f16.gguf" -c 512
conveyor_up "$files/default-f16.gguf" --quantize none
compare greedy "$L" "$C" default-f16.gguf "$files/default-f16.gguf" "$prompts" F16 >>"$report.greedy"
down "$lpid"
down "$cpid"
llama_up "$files/qwen05-q8_0.gguf" -c 512
conveyor_up "$files/qwen05-q8_0.gguf"
first_build_s=$ready_s
compare tokenize "$L" "$C" "$out/texts.json" "qwen05 (qwen2 pre)" nfc >>"$report" 2>"$out/mismatch-qwen.md"
down "$lpid"
down "$cpid"
# The families' real tokenizers (make tokenizer-files): Llama 3.1's (byte-level BPE, llama-bpe
# pre), and Llama 2's and Gemma 3's (SentencePiece BPE with byte fallback), each in a tiny
# random llama-architecture file of its vocabulary.
: >"$out/mismatch-families.md"
for fam in llama3_1 llama2 gemma3; do
	[ -f ".tokenizers/$fam/tokenizer.json" ] || { echo "| $fam | not run: no .tokenizers/$fam (make tokenizer-files) | | | |" >>"$report"; continue; }
	mkdir -p "$out/$fam-src"
	cp ".tokenizers/$fam/tokenizer.json" ".tokenizers/$fam/tokenizer_config.json" "$out/$fam-src/"
	"$py" - "$out/$fam-src" <<'PY'
import json, os, sys
d = sys.argv[1]
tok = json.load(open(os.path.join(d, "tokenizer.json")))
tc = json.load(open(os.path.join(d, "tokenizer_config.json")))
ids = dict(tok["model"]["vocab"], **{a["content"]: a["id"] for a in tok.get("added_tokens", [])})
def tid(name):
    v = tc.get(name)
    return ids.get(v.get("content") if isinstance(v, dict) else v)
cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": max(ids.values()) + 1, "hidden_size": 64,
       "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
       "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": True,
       "bos_token_id": tid("bos_token"), "eos_token_id": tid("eos_token"), "torch_dtype": "float32"}
json.dump(cfg, open(os.path.join(d, "config.json"), "w"))
PY
	"$conveyor" build-model --random --hf-checkpoint --config "$out/$fam-src/config.json" --out "$out/$fam-hf" >"$out/logs/$fam-hf.log" 2>&1
	"$py" scripts/gguf_write.py "$out/$fam-hf" "$files/tok-$fam.gguf" --outtype f32 >>"$out/logs/$fam-hf.log" 2>&1
	rm -rf "$out/$fam-hf"
	llama_up "$files/tok-$fam.gguf" -c 512
	conveyor_up "$files/tok-$fam.gguf"
	compare tokenize "$L" "$C" "$out/texts.json" "$fam's tokenizer" plain >>"$report" 2>>"$out/mismatch-families.md"
	down "$lpid"
	down "$cpid"
done
if [ -s "$out/mismatch-default.md" ] || [ -s "$out/mismatch-qwen.md" ] || [ -s "$out/mismatch-families.md" ]; then
	{
		echo
		echo "Differences (ids around the first differing position; at most ten per file, two NFC-only):"
		echo
		echo "| | Text | Where | llama.cpp | Conveyor |"
		echo "|---|---|---|---|---|"
		cat "$out/mismatch-default.md" "$out/mismatch-qwen.md" "$out/mismatch-families.md"
	} >>"$report"
fi
# 3b. The other architectures llama.cpp b4747 runs, on the families' float32 files as
# TestGGUFFamiliesMatchCheckpoint writes them (random tiny weights, a byte-level vocabulary):
# llama (llama3, llama_linear), qwen2, gemma, phi3 (phi3, phi35, phi4mini), and Gemma 2 at
# 26 layers (TestGGUFFamiliesForLlamaCpp: b4747 runs gemma2 only at its 2B/9B/27B layer
# counts). Mistral's and Qwen2's sliding-window fixtures are left out: b4747's llama and
# qwen2 graphs have no sliding window.
fam=$files/families
mkdir -p "$fam"
# Their vocabulary is 128 made-up tokens ("tok0" ...), so the prompts are ids.
fam_prompts=$out/family-prompts.json
"$py" -c 'import json, random; r = random.Random(5); print(json.dumps([[r.randrange(1, 128) for _ in range(r.randrange(4, 16))] for _ in range(10)]))' >"$fam_prompts"
if (cd models && CONVEYOR_GGUF_FAMILIES_OUT=$fam go test -count=1 -run 'TestGGUFFamiliesMatchCheckpoint|TestGGUFFamiliesForLlamaCpp' .) >"$out/logs/families.log" 2>&1; then
	for f in llama3 llama_linear qwen2 gemma gemma2_26 phi3 phi35 phi4mini; do
		if llama_up "$fam/$f.gguf" -c 512; then
			conveyor_up "$fam/$f.gguf" --quantize none
			compare greedy "$L" "$C" "$f.gguf" "$fam/$f.gguf" "$fam_prompts" "$f F32" >>"$report.greedy"
			down "$cpid"
		else
			echo "| $f F32 | - | - | llama-server did not load it (see logs/llama-server-$f.log) | - |" >>"$report.greedy"
		fi
		down "$lpid"
	done
else
	echo "| families | - | - | the family files were not written (see logs/families.log) | - |" >>"$report.greedy"
fi
cat "$report.greedy" >>"$report"
rm -f "$report.greedy"

# 4. Perplexity on one text: corpus.txt and the README as one line (one document for
# `conveyor perplexity`, the same tokens for llama-perplexity), at most 16,000 bytes.
"$py" - "$out/ppl.txt" <<'PY'
import sys
t = " ".join((open("tokenizer/testdata/corpus.txt").read() + "\n" + open("README.md").read()).split())
open(sys.argv[1], "w").write(t[:16000] + "\n")
PY
nctx=256
{
	echo
	echo "## 4. Perplexity ($(wc -c <"$out/ppl.txt") bytes: tokenizer/testdata/corpus.txt + README.md as one line)"
	echo
	echo "llama-perplexity -c $nctx (chunks of $nctx tokens, BOS first, second half scored); the same metric from"
	echo "Conveyor's prompt logprobs (/v1/completions echo); and \`conveyor perplexity --context $nctx\` (its own"
	echo "method: windows of $((nctx + 1)) tokens, all but the first scored)."
	echo
	echo "| File | Conveyor weights | llama-perplexity | Conveyor, llama.cpp's method | Ratio | conveyor perplexity |"
	echo "|---|---|---|---|---|---|"
} >>"$report"
# "default" is what serve chooses for the file (int4 for a Q4_K_M file, with the tensors it
# holds in Q5_0, Q6_K or Q8_0 as int8).
for f in default-f32:none default-q8_0:int8 default-q4_k_m:default default-q4_k_m:int4 default-q4_k_m:int8; do
	name=${f%%:*} q=${f##*:}
	qflag=(--quantize "$q")
	[ "$q" = default ] && qflag=()
	"$lbin/llama-perplexity" -m "$files/$name.gguf" -f "$out/ppl.txt" -c "$nctx" -b "$nctx" -t "$threads" >"$out/logs/llama-perplexity-$name.log" 2>&1
	lppl=$(grep -o 'Final estimate: PPL = [0-9.]*' "$out/logs/llama-perplexity-$name.log" | awk '{print $NF}')
	conveyor_up "$files/$name.gguf" "${qflag[@]}"
	cppl=$(compare ppl "$C" "$name.gguf" "$out/ppl.txt" "$nctx" "$name")
	down "$cpid"
	"$conveyor" perplexity --model "$files/$name.gguf" "${qflag[@]}" --file "$out/ppl.txt" --context "$nctx" \
		--threads "$threads" >"$out/logs/conveyor-perplexity-$name-$q.log" 2>&1
	own=$(grep -oE 'perplexity [0-9.]+' "$out/logs/conveyor-perplexity-$name-$q.log" | tail -1 | cut -d' ' -f2)
	echo "| $name.gguf | $q | $lppl | $cppl | $(awk "BEGIN { printf \"%.4f\", $cppl / $lppl }") | $own |" >>"$report"
done

# 5. Speed.
if [ "${GGUF_CHECK_SPEED:-0}" = 1 ]; then
	conveyor_up "$files/qwen05-q8_0.gguf"
	cached_s=$ready_s
	down "$cpid"
	{
		echo
		echo "## 5. Speed: 0.5B shape (random weights), 128 -> 128 tokens, closed loop, \`conveyor bench\`"
		echo
		echo "Conveyor from start to ready on qwen05-q8_0.gguf: ${first_build_s} s built (int8), ${cached_s} s cached."
		echo
		echo "Conveyor serves each file with its default weights (the log's quantization= names them). The last"
		echo "column is the 1-minute load average before the run (this script's earlier runs count in it; well above 2: something else shared the CPUs)."
		echo
		echo "| File | Server | Streams | Requests | Output tokens/s | TTFT p50 (ms) | TPOT p50 (ms) | Load before |"
		echo "|---|---|---|---|---|---|---|---|"
	} >>"$report"
	bench() { # bench FILE SERVER STREAMS URL
		local n=$(($3 == 1 ? 4 : 32)) j=$out/logs/bench-$1-$2-$3.json load
		load=$(cut -d' ' -f1 /proc/loadavg)
		"$conveyor" bench --base-url "$4" --dataset fixed --input-len 128 --output-len 128 --max-concurrency "$3" \
			--request-rate inf --num-requests "$n" --max-token-id 8000 --no-progress --json >"$j"
		"$py" - "$j" "$1" "$2" "$3" "$n" "$load" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
tps, ttft, tpot = r["output_throughput"], r["ttft"]["p50_ms"], r["tpot"]["p50_ms"]
f = lambda x: f"{x:.1f}"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {sys.argv[4]} | {sys.argv[5]} | {f(tps)} | {f(ttft)} | {f(tpot)} | {sys.argv[6]} |")
PY
	}
	for f in qwen05-q8_0 qwen05-q4_k_m; do
		for s in 1 16; do
			llama_up "$files/$f.gguf" -c $((s * 512)) -np "$s"
			bench "$f" llama-server "$s" "$L" >>"$report"
			down "$lpid"
		done
		conveyor_up "$files/$f.gguf"
		for s in 1 16; do
			bench "$f" conveyor "$s" "$C" >>"$report"
		done
		down "$cpid"
	done
fi
echo "gguf-check: report in $report"
cat "$report"
