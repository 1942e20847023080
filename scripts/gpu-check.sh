#!/usr/bin/env bash
# The GPU check: on a machine with an NVIDIA GPU, the CUDA 13 and cuDNN 9 libraries and
# ONNX Runtime's CUDA provider (`make ort-gpu`), in about eight minutes:
#   1. the model families' PyTorch fixtures through the float16 and bfloat16 step graphs
#      on the GPU, and speculative decoding's verifying step (1 + 4 tokens) timed against
#      a decode step (BenchmarkVerifyStepGPU);
#   2. the Qwen2.5-0.5B shape (random weights, float16) served with --device cuda (its
#      default block size, FlashAttention's), and `conveyor bench` at 1, 16, 64 and 128
#      streams, 128 -> 128 tokens, closed loop; sampled rows (temperature 1, top_p 0.9) at
#      64 streams; a 2,048-token prompt at one stream; n=2 and a repeated 1,100-token prompt
#      (block copies on the GPU, prefix-cache hits); sampled rows at 128 streams too;
#   3. ONNX Runtime's profile of 1-row and 64-row steps (profile.md, by
#      scripts/ort-profile.py), which must show every node of the step graph on the GPU;
#   4. `conveyor bench compare` (continuous vs static vs sequential) on the GPU;
#   5. a short report: the GPU, every figure, and where the logs are.
# It exits 1 when the fixtures fail or a node of the step graph ran on the CPU.
#
# Usage: scripts/gpu-check.sh [OUT_DIR]        (default gpu-check/)
#
# GPU_CHECK_DEVICE=cpu runs the same steps on the CPU (float32 step graph, --attention graph,
# a tiny model by default: GPU_CHECK_CONFIG, GPU_CHECK_MAX_TOKEN_ID), to try the script
# itself on a machine without a GPU.
#
# It uses bin/conveyor and bin/models.test when they exist (built elsewhere with `make build`
# and `go test -c -o bin/models.test ./models/`), and builds them when Go is at hand. ONNX
# Runtime is found as serve finds it (CONVEYOR_ORT_LIB, default .ort/libonnxruntime.so.1;
# CONVEYOR_ORT_CUDA_PROVIDER, default .ort/gpu/libonnxruntime_providers_cuda.so); a library
# shipped compressed as FILE.xz beside that path is unpacked first. The CUDA and cuDNN
# libraries come from LD_LIBRARY_PATH, or from the nvidia-*-cu13 Python wheels when python3
# has them.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${1:-gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=$(mktemp -d)
port=${GPU_CHECK_PORT:-8123}
device=${GPU_CHECK_DEVICE:-cuda}
case $device in
cuda) dtype=float16 config=${GPU_CHECK_CONFIG:-models/testdata/qwen2-0.5b/config.json} maxid=${GPU_CHECK_MAX_TOKEN_ID:-8000} kv=8GiB long=2048 share=1100 compare_n=32
	tok=${GPU_CHECK_TOKENIZER:-.tokenizers/qwen3} ;;
cpu) dtype=float32 config=${GPU_CHECK_CONFIG:-models/testdata/tiny-llama/config.json} maxid=${GPU_CHECK_MAX_TOKEN_ID:-500} kv=512MiB long=400 share=300 compare_n=32 ;;
*) echo "gpu-check: GPU_CHECK_DEVICE=$device: want cuda or cpu"; exit 1 ;;
esac
server=""
cleanup() {
	[ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null
	rm -rf "$work"
}
trap cleanup EXIT
log() { printf '%s %s\n' "$(date +%T)" "$*" | tee -a "$out/check.log"; }

# --- the libraries -------------------------------------------------------------------
export CONVEYOR_ORT_LIB=${CONVEYOR_ORT_LIB:-$root/.ort/libonnxruntime.so.1}
export CONVEYOR_ORT_CUDA_PROVIDER=${CONVEYOR_ORT_CUDA_PROVIDER:-$root/.ort/gpu/libonnxruntime_providers_cuda.so}
unpack() { # FILE: unpack FILE.xz when FILE is missing
	[ -f "$1" ] || [ ! -f "$1.xz" ] || {
		log "unpacking $1.xz"
		if command -v xz >/dev/null; then xz -dk "$1.xz"; else python3 -c 'import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1.xz" "$1"; fi
	}
}
for f in "$CONVEYOR_ORT_LIB" "$CONVEYOR_ORT_CUDA_PROVIDER" "$(dirname "$CONVEYOR_ORT_CUDA_PROVIDER")/libonnxruntime_providers_shared.so"; do
	unpack "$f"
done
cuda_dirs=$(python3 - <<'EOF' 2>/dev/null || true
import glob, os, site
dirs = []
for sp in site.getsitepackages():
    dirs += glob.glob(os.path.join(sp, "nvidia", "*", "lib"))
print(":".join(sorted(set(dirs))))
EOF
)
export LD_LIBRARY_PATH="$(dirname "$CONVEYOR_ORT_LIB"):$(dirname "$CONVEYOR_ORT_CUDA_PROVIDER")${cuda_dirs:+:$cuda_dirs}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

# --- the binaries --------------------------------------------------------------------
if command -v go >/dev/null; then
	log "building bin/conveyor and bin/models.test"
	go build -o bin/conveyor ./cmd/conveyor
	go test -c -o bin/models.test ./models/
fi
[ -x bin/conveyor ] || { echo "gpu-check: bin/conveyor is missing: run \`make build\` (or carry it here)"; exit 1; }
bin=$root/bin/conveyor

if [ "$device" = cuda ]; then
	gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | head -n 1 || true)
	[ -n "$gpu" ] || { echo "gpu-check: no NVIDIA GPU answers nvidia-smi"; exit 1; }
else
	gpu="none: a dry run on the CPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores)"
fi
log "GPU: $gpu"

# --- 1. the families' fixtures on the GPU ---------------------------------------------
failed=""
fixtures="not run (bin/models.test missing, or a CPU dry run)"
if [ -x bin/models.test ] && [ "$device" = cuda ]; then
	log "family fixtures through the float16 and bfloat16 step graphs on the GPU"
	if (cd models && CONVEYOR_TEST_DEVICE=cuda timeout 170 ../bin/models.test -test.run 'TestStepGraphFamiliesOnGPU' -test.v -test.count=1 -test.timeout 160s) >"$out/fixtures.log" 2>&1; then
		fixtures="passed"
	else
		fixtures="FAILED (see fixtures.log)"
		failed="$failed fixtures"
	fi
	log "fixtures: $fixtures"
	grep -E '^(=== RUN|--- |\s+families|ok|FAIL|PASS)' "$out/fixtures.log" | tail -n 40 >>"$out/check.log" || true
fi

# --- 1b. speculative decoding's verifying step against a decode step ------------------
verify="not run (bin/models.test missing, or a CPU dry run)"
if [ -x bin/models.test ] && [ "$device" = cuda ]; then
	log "the verifying step (1 + 4 tokens, every position's logits) against a 1-token decode step"
	if (cd models && CONVEYOR_TEST_DEVICE=cuda timeout 240 ../bin/models.test -test.run '^$' -test.bench 'BenchmarkVerifyStepGPU' -test.benchtime 50x -test.timeout 230s) >"$out/verify.log" 2>&1; then
		verify=$(python3 - "$out/verify.log" <<'PY'
import re, sys
ms = {}
for line in open(sys.argv[1]):
    m = re.search(r"tokens(\d+)\S*\s+\d+\s+\d+ ns/op\s+([\d.]+) ms/step", line)
    if m:
        ms[int(m.group(1))] = float(m.group(2))
if 1 in ms and 5 in ms:
    print(f"1 + 4 tokens {ms[5]:.2f} ms, 1 token {ms[1]:.2f} ms: {ms[5] / ms[1]:.2f}x")
else:
    print("no timings (see verify.log)")
PY
)
	else
		verify="FAILED (see verify.log)"
	fi
	log "verifying step: $verify"
fi

# --- 2. the 0.5B shape, served on the GPU, at 1, 16 and 64 streams --------------------
# A config without tokenizer files beside it gets GPU_CHECK_TOKENIZER's (Qwen3's from
# `make tokenizer-files` by default, the Qwen2.5 vocabulary).
if [ ! -f "$(dirname "$config")/tokenizer.json" ]; then
	[ -f "${tok:-}/tokenizer.json" ] || { log "gpu-check: $config has no tokenizer.json beside it: set GPU_CHECK_TOKENIZER to a folder with one (make tokenizer-files)"; exit 1; }
	mkdir -p "$work/config"
	cp "$config" "$tok"/tokenizer*.json "$work/config/"
	config=$work/config/config.json
fi
model=$work/model
log "building $config (random weights) with a $dtype step graph"
"$bin" build-model --random --config "$config" --out "$model" --dtype "$dtype" >"$out/build.log" 2>&1
log "serving it with --device $device --attention graph on port $port"
"$bin" serve --model "$model" --served-model-name q05 --device "$device" --attention graph --host 127.0.0.1 --port "$port" \
	--kv-cache-memory "$kv" --max-num-seqs 128 --step-trace "$out/steps.jsonl" >"$out/serve.log" 2>&1 &
server=$!
for _ in $(seq 120); do
	curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	kill -0 "$server" 2>/dev/null || { log "the server exited:"; tail -n 20 "$out/serve.log" | tee -a "$out/check.log"; exit 1; }
	sleep 1
done
grep -m1 ready "$out/serve.log" | tee -a "$out/check.log" || true
# bench_run NAME STREAMS IN OUT [bench flags]: a warm-up, then the measured run into bench_NAME.json.
bench_run() {
	local name=$1 c=$2 in=$3 outl=$4
	shift 4
	local n=$((c * 3 > 24 ? c * 3 : 24))
	log "bench $name: $c streams, $n requests of $in -> $outl tokens $*"
	timeout 60 "$bin" bench --base-url "http://127.0.0.1:$port" --dataset fixed --input-len "$in" --output-len "$outl" \
		--num-requests $((n / 4)) --max-concurrency "$c" --request-rate inf --max-token-id "$maxid" --no-progress --json "$@" >/dev/null 2>&1 || true
	timeout 90 "$bin" bench --base-url "http://127.0.0.1:$port" --dataset fixed --input-len "$in" --output-len "$outl" \
		--num-requests "$n" --max-concurrency "$c" --request-rate inf --max-token-id "$maxid" --no-progress --json "$@" >"$out/bench_$name.json" || true
}
for c in 1 16 64 128; do
	bench_run "$c" "$c" 128 128
done
bench_run 64_sampled 64 128 128 --temperature 1 --top-p 0.9
bench_run 128_sampled 128 128 128 --temperature 1 --top-p 0.9
bench_run prompt_long 1 "$long" 16

# n=2 greedy choices must be identical (the fork's partial block copied on the GPU), and a
# repeated prompt longer than two blocks must be served partly from the prefix cache.
log "n=2 and prefix sharing"
timeout 90 python3 - "$port" "$maxid" "$share" >"$out/sharing.json" 2>"$out/sharing.err" <<'EOF2' || true
import json, random, sys, urllib.request
port, maxid, share = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(7)
prompt = [rng.randrange(1, maxid) for _ in range(share)]
def complete(body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    return json.load(urllib.request.urlopen(req, timeout=300))
a = complete({"model": "q05", "prompt": prompt, "max_tokens": 48, "temperature": 0, "n": 2, "ignore_eos": True})
b = complete({"model": "q05", "prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True})
texts = [c["text"] for c in a["choices"]]
cached = ((b.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens", 0)
print(json.dumps({"n2_identical": len(texts) == 2 and texts[0] == texts[1], "repeat_identical": b["choices"][0]["text"] == texts[0],
                  "cached_tokens": cached, "prompt_tokens": len(prompt)}))
EOF2
log "sharing: $(cat "$out/sharing.json" 2>/dev/null) $(tail -n 1 "$out/sharing.err" 2>/dev/null)"
kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
server=""

# --- 3. where a step's time goes: ONNX Runtime's profile of a short run -----------------
# A second server with CONVEYOR_ORT_PROFILE: two requests at one stream, then 64 at once;
# scripts/ort-profile.py summarises the trace (runs by token count, operators, nodes on the
# CPU) into profile.md, and the check fails if a node of the step graph ran on the CPU.
log "ONNX Runtime profile of 1-row and 64-row steps"
mkdir -p "$work/prof"
CONVEYOR_ORT_PROFILE=$work/prof/trace "$bin" serve --model "$model" --served-model-name q05 --device "$device" --attention graph \
	--host 127.0.0.1 --port "$port" --kv-cache-memory "$kv" --max-num-seqs 128 >"$out/serve_profile.log" 2>&1 &
server=$!
for _ in $(seq 120); do
	curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
	kill -0 "$server" 2>/dev/null || break
	sleep 0.5
done
for spec in "1 2 32" "64 64 24"; do
	set -- $spec
	timeout 60 "$bin" bench --base-url "http://127.0.0.1:$port" --dataset fixed --input-len 128 --output-len "$3" --num-requests "$2" \
		--max-concurrency "$1" --request-rate inf --max-token-id "$maxid" --no-progress --json >/dev/null 2>&1 || true
done
kill "$server" 2>/dev/null && wait "$server" 2>/dev/null || true
server=""
placement="no trace"
if ls "$work"/prof/*.json >/dev/null 2>&1; then
	python3 scripts/ort-profile.py "$work"/prof/*.json >"$out/profile.md" 2>&1 || true
	placement=$(grep -m1 '^Nodes on the CPU' "$out/profile.md" || echo "every node on the $device")
fi
case $placement in "Nodes on the CPU in a device session: 0" | "every node"*) ;; *) failed="$failed placement" ;; esac
log "profile: $placement"

# --- 4. continuous vs static vs sequential on the GPU ----------------------------------
log "bench compare: continuous, static and sequential on the $device"
compare="passed"
timeout 240 "$bin" bench compare --model "$model" --device "$device" --attention graph --out "$out/compare" --dataset fixed --input-len 128 --output-len 128 \
	--num-requests "$compare_n" --rates 8,inf --max-num-seqs 64 --max-batch-size 16 --kv-cache-memory "$kv" \
	--max-token-id "$maxid" --server-log "$out/compare-servers.log" >"$out/compare.log" 2>&1 || compare="FAILED (see compare.log)"
log "bench compare: $compare"

# --- 5. the report ---------------------------------------------------------------------
python3 - "$out" "$gpu" "$fixtures" "$compare" "$config" "$dtype" "$placement" "$verify" >"$out/report.md" <<'EOF'
import json, os, sys
out, gpu, fixtures, compare, config, dtype, placement, verify = sys.argv[1:9]
print("# Conveyor GPU check\n")
print(f"- GPU: {gpu}")
print(f"- family fixtures (float16 and bfloat16 step graphs): {fixtures}")
print(f"- step graph placement (ONNX Runtime's profile, profile.md): {placement}")
print(f"- speculative decoding's verifying step, 0.5B shape, float16, past 128 (verify.log): {verify}")
try:
    sh = json.load(open(os.path.join(out, "sharing.json")))
    print(f"- n=2 greedy choices identical: {sh['n2_identical']}; a repeated {sh['prompt_tokens']}-token prompt: "
          f"{sh['cached_tokens']} tokens from the prefix cache, same reply: {sh['repeat_identical']}")
except Exception as e:
    print(f"- n=2 and prefix sharing: not measured ({e})")
print(f"- bench compare: {compare} (report: compare/report.md)\n")
print(f"{config}, random weights, {dtype} step graph, 128 -> 128 tokens, closed loop:\n")
print("| run | streams | tok/s | TTFT p50 ms | ITL p50 ms | ITL p99 ms | completed | failed |")
print("|---|---|---|---|---|---|---|---|")
runs = [("1", 1, "greedy"), ("16", 16, "greedy"), ("64", 64, "greedy"), ("128", 128, "greedy"),
        ("64_sampled", 64, "temperature 1, top_p 0.9"), ("128_sampled", 128, "temperature 1, top_p 0.9"), ("prompt_long", 1, "a long prompt (2,048 on the GPU) -> 16 tokens")]
tps = {}
for name, c, what in runs:
    p = os.path.join(out, f"bench_{name}.json")
    try:
        r = json.load(open(p))
    except Exception as e:
        print(f"| {what} | {c} | - | - | - | - | - | {e} |")
        continue
    tps[name] = r["output_throughput"]
    print(f"| {what} | {c} | {r['output_throughput']:.0f} | {r['ttft']['p50_ms']:.1f} | {r['itl']['p50_ms']:.2f} | "
          f"{r['itl']['p99_ms']:.2f} | {r['completed']} | {r['failed']} |")
if "64" in tps and "64_sampled" in tps and tps["64"] > 0:
    print(f"\nSampled rows at 64 streams: {tps['64_sampled'] / tps['64']:.2f}x the greedy tokens/s.")
if "128" in tps and "128_sampled" in tps and tps["128"] > 0:
    print(f"Sampled rows at 128 streams: {tps['128_sampled'] / tps['128']:.2f}x the greedy tokens/s.")

# Where a step's time goes (serve --step-trace), by the step's rows.
steps = {}
try:
    for line in open(os.path.join(out, "steps.jsonl")):
        s = json.loads(line)
        steps.setdefault(s.get("rows", 0), []).append(s)
except Exception as e:
    print(f"\nno step trace: {e}")
if steps:
    def med(xs):
        xs = sorted(xs)
        return xs[len(xs) // 2] if xs else float("nan")
    keys = [k for k in ("duration_ms", "forward_ms", "sample_ms", "emit_ms", "schedule_ms") if any(k in s for v in steps.values() for s in v)]
    print("\nWhere a step's time goes (medians of serve --step-trace, ms):\n")
    print("| rows | steps | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for rows in sorted(steps):
        if rows in (1, 16, 64, 128) or len(steps[rows]) >= 50:
            v = steps[rows]
            print(f"| {rows} | {len(v)} | " + " | ".join(f"{med([s.get(k, float('nan')) for s in v]):.2f}" for k in keys) + " |")
EOF
cat "$out/report.md" | tee -a "$out/check.log"
[ -z "$failed" ] || { log "gpu-check: failed:$failed"; exit 1; }
