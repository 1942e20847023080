# Conveyor — build, test and run.
#
#   make run    serve the default model
#   make test   run every test

SHELL := /bin/bash
GO ?= go

ORT_VERSION := 1.24.3
ORT_DIR := .ort
ORT_LIB := $(ORT_DIR)/libonnxruntime.so.1
ORT_SHA256 := 92ba8e44d31b80a34f5e805076a044122c3be1fffe0d88ed790de7267b0b2682
export CONVEYOR_ORT_LIB ?= $(abspath $(ORT_LIB))

BIN := bin/conveyor

.PHONY: all build ort test vet run clean

all: build

# ONNX Runtime's CPU library ships inside the npm package onnxruntime-node.
ort: $(ORT_LIB)

$(ORT_LIB):
	@mkdir -p $(ORT_DIR)/pack
	cd $(ORT_DIR)/pack && npm pack --silent onnxruntime-node@$(ORT_VERSION) >/dev/null
	tar -xzf $(ORT_DIR)/pack/onnxruntime-node-$(ORT_VERSION).tgz -C $(ORT_DIR)/pack package/bin/napi-v6/linux/x64/libonnxruntime.so.1
	echo "$(ORT_SHA256)  $(ORT_DIR)/pack/package/bin/napi-v6/linux/x64/libonnxruntime.so.1" | sha256sum -c --quiet
	mv $(ORT_DIR)/pack/package/bin/napi-v6/linux/x64/libonnxruntime.so.1 $(ORT_LIB)
	rm -rf $(ORT_DIR)/pack

build:
	$(GO) build -o $(BIN) ./cmd/conveyor

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); echo "gofmt needed"; exit 1; }

test: ort vet
	$(GO) test -count=1 -timeout 30m ./...

clean:
	rm -rf bin $(ORT_DIR)
