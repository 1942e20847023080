package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/conveyor-llm/conveyor/api"
	"github.com/conveyor-llm/conveyor/engine"
	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/attention"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/int8gemm"
	"github.com/conveyor-llm/conveyor/tokenizer"
)

// loadedModel is a model loaded from the flags with its engine running: what `conveyor
// serve` and `conveyor run-batch` put behind an api.Server with SetBackend.
type loadedModel struct {
	dir          string // the built model directory
	runner       models.Model
	eng          *engine.Engine
	stopEngine   context.CancelFunc
	backend      api.Backend
	quantization string
	start        time.Time // when loading began
}

// loadModel builds the model directory when it is a Hugging Face checkpoint, loads the
// tokenizer and the ONNX graph, and starts an engine configured by ecfg. Errors name
// the command (o.name()). The caller ends it with shutdown.
func (o *serveOptions) loadModel(log *slog.Logger, ecfg engine.Config) (*loadedModel, error) {
	log.Info("loading model", "dir", o.modelDir)
	start := time.Now()
	quant, _ := convert.ParseQuantization(o.quantize) // validated
	dir, built, err := convert.PrepareWith(o.modelDir, convert.Options{Quantize: quant})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	if built {
		log.Info("built the checkpoint's ONNX graph", "dir", dir, "seconds", time.Since(start).Seconds())
	}
	tok, err := tokenizer.Load(dir)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	ropts := models.RunnerOptions{ORTLib: o.ortLib, IntraOpThreads: o.threads, NoSpin: !o.spin, Attention: o.attention, KVCacheDType: o.kvCacheDType}
	runner, err := models.Open(dir, ropts)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	// After several failed forward passes in a row the engine reopens the model from its
	// directory (engine.Config.ReopenModel).
	ecfg.ReopenModel = func() (engine.Model, error) {
		m, err := models.Open(dir, ropts)
		if err != nil {
			return nil, err
		}
		return m, nil
	}
	eng, err := engine.New(ecfg, runner, tok)
	if err != nil {
		runner.Close()
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	defaults, err := o.samplingDefaults(log, dir, eng.Limits())
	if err != nil {
		_ = eng.Close()
		runner.Close()
		return nil, fmt.Errorf("%s: %w", o.name(), err)
	}
	engCtx, stopEngine := context.WithCancel(context.Background())
	eng.Start(engCtx)
	quantization := convert.BuiltQuantization(dir)
	return &loadedModel{
		dir: dir, runner: runner, eng: eng, stopEngine: stopEngine, quantization: quantization, start: start,
		backend: api.Backend{Engine: eng, Tokenizer: api.NewTokenizer(tok), MaxModelLen: eng.MaxModelLen(), Defaults: defaults,
			Quantization: quantization, KVCacheDType: runner.Spec().KVDType.String(),
			Formats: api.NewFormats(tok, runner.Spec().VocabSize, eng.EOSTokenIDs()), ToolCallParser: o.toolCallParser},
	}, nil
}

// logReady logs the "ready" line with what is being served; attrs come first (addr).
func (m *loadedModel) logReady(log *slog.Logger, o *serveOptions, modelName string, attrs ...any) {
	attrs = append(attrs, "model", modelName, "load_seconds", time.Since(m.start).Seconds(),
		"max_model_len", m.eng.MaxModelLen(), "kv_blocks", m.eng.NumKVBlocks(), "scheduler", o.scheduler, "attention", m.runner.Attention(),
		"kv_cache_dtype", m.runner.Spec().KVDType.String(), "quantization", m.quantization)
	log.Info("ready", append(attrs, kernelAttrs(m.runner.Attention(), m.quantization)...)...)
}

// kernelAttrs names the instruction sets Conveyor's own kernels picked on this CPU for
// a model served on attentionPath with quantization: attention_isa on the paged path,
// and int8_isa when its int8 products run on Int8Linear.
func kernelAttrs(attentionPath, quantization string) []any {
	if attentionPath != models.AttentionPaged {
		return nil
	}
	attrs := []any{"attention_isa", attention.ISA()}
	if quantization == "int8" {
		attrs = append(attrs, "int8_isa", int8gemm.ISA())
	}
	return attrs
}

// shutdown lets the engine finish its live requests for up to grace, aborts the rest,
// stops the engine loop and closes the model.
func (m *loadedModel) shutdown(log *slog.Logger, grace time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := m.eng.Shutdown(ctx); err != nil {
		log.Warn("engine aborted remaining requests", "err", err)
	}
	m.stopEngine()
	m.runner.Close()
}
