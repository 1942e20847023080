#!/usr/bin/env bash
# Conveyor against llama.cpp's server on the CPU, on the same model shapes, one server at
# a time, with `conveyor bench` as the client for both.
#
# Needs: a built llama.cpp tree in LLAMA_CPP (build/bin/llama-server, llama-quantize;
# gguf-py/ for the writer), /usr/bin/python3 (or PYTHON) with numpy, curl, the tokenizer
# files (`make tokenizer-files`) and Go (bin/conveyor is built from this tree at each run;
# CONVEYOR names another binary). It is not part of `make test`: CI has no llama.cpp.
#
# The shapes (random weights, the same for both engines):
#   - 0.5B: Qwen2.5-0.5B's (models/testdata/qwen2-0.5b, Qwen3's tokenizer). Conveyor
#     serves the Hugging Face checkpoint with --quantize int8 (built into the cache on
#     first start), llama.cpp the Q8_0 file its own llama-quantize makes from the F16 GGUF
#     that scripts/gguf_write.py writes of the same checkpoint;
#   - 56M: hidden 768, 8 layers, 12/4 heads, MLP 2,048, vocabulary 8,192 (Llama, the
#     default model's tokenizer), int8 and Q8_0 as above, so that both read int8 weights.
# The workloads (closed-loop streaming clients, random token-id prompts, ignore_eos,
# temperature 0; each after a warm-up of one request per stream):
#   1. 0.5B, 1 stream, 128 -> 128, 10 requests, twice;
#   2. 0.5B, 16 streams, 128 -> 256, 48 requests;
#   3. 56M, 16 streams, 256 -> 1,024, 32 requests (decode-heavy).
# Servers: `llama-server -t T -tb T -cb -np N -c N*ctx -fa` and `conveyor serve
# --max-num-seqs 64 --kv-cache-memory 2GiB` (its defaults otherwise).
#
# Usage: LLAMA_CPP=/path/to/llama.cpp scripts/llama-compare.sh [OUT_DIR]
# Writes OUT_DIR/report.md (default $TMPDIR/llama-compare). LLAMA_COMPARE_THREADS (default 2)
# is llama.cpp's -t; about 15 minutes on two cores, most of it the first builds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
: "${LLAMA_CPP:?set LLAMA_CPP to a built llama.cpp tree (build/bin/llama-server ...)}"
lbin=$LLAMA_CPP/build/bin
out=${1:-${TMPDIR:-/tmp}/llama-compare}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
py=${PYTHON:-/usr/bin/python3}
threads=${LLAMA_COMPARE_THREADS:-2}
lport=${LLAMA_COMPARE_LLAMA_PORT:-8411}
cport=${LLAMA_COMPARE_CONVEYOR_PORT:-8412}
export CONVEYOR_CACHE_DIR=$out/cache
export PYTHONPATH=$LLAMA_CPP/gguf-py${PYTHONPATH:+:$PYTHONPATH}
for b in llama-server llama-quantize; do
	[ -x "$lbin/$b" ] || { echo "llama-compare: $lbin/$b missing: build llama.cpp first"; exit 1; }
done
[ -f .tokenizers/qwen3/tokenizer.json ] || { echo "llama-compare: run 'make tokenizer-files' first"; exit 1; }

script_name=llama-compare
. scripts/servers.sh

# checkpoint NAME CONFIG TOKENIZER_DIR: a random Hugging Face checkpoint of CONFIG in
# $out/NAME-hf and its Q8_0 GGUF in $out/NAME-q8_0.gguf (made once).
checkpoint() {
	local name=$1 src=$out/$1-src
	[ -f "$out/$name-q8_0.gguf" ] && return 0
	mkdir -p "$src"
	cp "$2" "$src/config.json"
	cp "$3/tokenizer.json" "$3/tokenizer_config.json" "$src/"
	"$conveyor" build-model --random --hf-checkpoint --config "$src/config.json" --out "$out/$name-hf" >"$out/logs/$name-hf.log" 2>&1
	"$py" scripts/gguf_write.py "$out/$name-hf" "$out/$name-f16.gguf" --outtype f16 >"$out/logs/$name-gguf.log" 2>&1
	"$lbin/llama-quantize" "$out/$name-f16.gguf" "$out/$name-q8_0.gguf" Q8_0 >"$out/logs/$name-quantize.log" 2>&1
	rm -f "$out/$name-f16.gguf"
}

checkpoint qwen05 models/testdata/qwen2-0.5b/config.json .tokenizers/qwen3
"$py" - "$out/m56.json" <<'PY'
import json, sys
json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 8192,
           "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 8,
           "num_attention_heads": 12, "num_key_value_heads": 4, "hidden_act": "silu",
           "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
           "torch_dtype": "float32"}, open(sys.argv[1], "w"), indent=1)
PY
checkpoint m56 "$out/m56.json" models/default

report=$out/report.md
{
	echo "# Conveyor against llama.cpp's server, CPU"
	echo
	echo "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) cores; llama.cpp $(git -C "$LLAMA_CPP" describe --tags 2>/dev/null || echo "${LLAMA_COMPARE_LLAMA_VERSION:-unknown}"), -t $threads; $(date -u +%Y-%m-%d)."
	echo
	echo "| Workload | Server | Requests (failed) | Output tok/s | TTFT p50 (ms) | TPOT p50 (ms) | Gap p50 / p99 (ms) | Load before |"
	echo "|---|---|---|---|---|---|---|---|"
} >"$report"

# bench NAME SERVER URL STREAMS IN OUT REQUESTS: one closed-loop run after a warm-up.
bench() {
	local j=$out/logs/bench-$1-$2-$4-$(date +%s).json load
	"$conveyor" bench --base-url "$3" --dataset fixed --input-len 16 --output-len 8 --max-concurrency "$4" \
		--request-rate inf --num-requests "$4" --max-token-id 8000 --no-progress --json >/dev/null
	load=$(cut -d' ' -f1 /proc/loadavg)
	"$conveyor" bench --base-url "$3" --dataset fixed --input-len "$5" --output-len "$6" --max-concurrency "$4" \
		--request-rate inf --num-requests "$7" --max-token-id 8000 --no-progress --json >"$j"
	"$py" - "$j" "$1" "$2" "$load" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
f = lambda x: f"{x:.1f}"
print(f"| {sys.argv[2]} | {sys.argv[3]} | {r['completed']} ({r['failed']}) | {f(r['output_throughput'])} | "
      f"{f(r['ttft']['p50_ms'])} | {f(r['tpot']['p50_ms'])} | {f(r['itl']['p50_ms'])} / {f(r['itl']['p99_ms'])} | {sys.argv[4]} |")
PY
}

# llama_run NAME GGUF STREAMS CTX IN OUT REQUESTS [REPEAT]
llama_run() {
	local log=$out/logs/llama-server-$1-$3.log
	"$lbin/llama-server" -m "$2" --host 127.0.0.1 --port "$lport" -t "$threads" -tb "$threads" -cb -np "$3" -c $(($3 * $4)) -fa >"$log" 2>&1 &
	local pid=$!
	pids+=("$pid")
	wait_ready "http://127.0.0.1:$lport/health" "$pid" "$log"
	for _ in $(seq "${8:-1}"); do
		bench "$1" "llama.cpp Q8_0" "http://127.0.0.1:$lport" "$3" "$5" "$6" "$7" >>"$report"
	done
	down "$pid"
}

# conveyor_up CHECKPOINT: conveyor serve with int8 weights; sets cpid.
conveyor_up() {
	local log=$out/logs/conveyor-$(basename "$1")-$(date +%s).log
	"$conveyor" serve --model "$1" --quantize int8 --port "$cport" --max-num-seqs 64 --kv-cache-memory 2GiB >"$log" 2>&1 &
	cpid=$!
	pids+=("$cpid")
	wait_ready "http://127.0.0.1:$cport/health" "$cpid" "$log"
}

C=http://127.0.0.1:$cport
conveyor_up "$out/qwen05-hf"
bench "0.5B, 1 stream, 128 -> 128" "Conveyor int8" "$C" 1 128 128 10 >>"$report"
bench "0.5B, 1 stream, 128 -> 128" "Conveyor int8" "$C" 1 128 128 10 >>"$report"
bench "0.5B, 16 streams, 128 -> 256" "Conveyor int8" "$C" 16 128 256 48 >>"$report"
down "$cpid"
llama_run "0.5B, 1 stream, 128 -> 128" "$out/qwen05-q8_0.gguf" 1 512 128 128 10 2
llama_run "0.5B, 16 streams, 128 -> 256" "$out/qwen05-q8_0.gguf" 16 512 128 256 48
conveyor_up "$out/m56-hf"
bench "56M, 16 streams, 256 -> 1,024" "Conveyor int8" "$C" 16 256 1024 32 >>"$report"
down "$cpid"
llama_run "56M, 16 streams, 256 -> 1,024" "$out/m56-q8_0.gguf" 16 1536 256 1024 32
echo "llama-compare: report in $report"
cat "$report"
