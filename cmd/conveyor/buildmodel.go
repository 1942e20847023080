package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/conveyor-llm/conveyor/models"
	"github.com/conveyor-llm/conveyor/models/convert"
	"github.com/conveyor-llm/conveyor/models/plan"
)

func init() {
	register(command{
		name:    "build-model",
		summary: "write an ONNX model directory from a Hugging Face checkpoint (Llama, Mistral, Qwen2, Qwen3, Gemma, Phi-3), a GGUF file, or seeded random weights",
		run:     runBuildModel,
	})
}

func runBuildModel(args []string) error {
	fs := flag.NewFlagSet("build-model", flag.ContinueOnError)
	from := fs.String("from", "", "Hugging Face checkpoint directory (config.json + *.safetensors), or a GGUF file (llama.cpp's; its tokenizer and chat template come from its metadata)")
	random := fs.Bool("random", false, "use seeded random weights instead of a checkpoint (needs --config)")
	configPath := fs.String("config", "", "config.json for --random (tokenizer files next to it are copied)")
	out := fs.String("out", "", "output model directory: built beside it and moved into place once the build has succeeded, replacing an existing one whole (which must hold only files a build writes); a failed build leaves it as it was")
	seed := fs.Int64("seed", 1, "random weight seed (--random)")
	quantize := fs.String("quantize", "", "store every linear layer's weights as int8 (per output channel, times per-token int8 activations; Conveyor's int8 kernel) or int4 (blocks of 32 along the input axis; MatMulNBits), or none; a GGUF file's default is the nearest to its own types (int4 for 4-bit files, int8 for 5- to 8-bit ones)")
	dtype := fs.String("dtype", "float32", "float type of the step graph (step/, served with --attention graph): float32 runs on CPUs, float16 or bfloat16 on NVIDIA GPUs (--device cuda)")
	kvDType := fs.String("kv-cache-dtype", models.KVCacheAuto, "KV cache element type of the float32 step graph (the CPU's): float16 (half the memory per token; auto) or float32; a 16-bit graph's cache is its own type")
	hfCheckpoint := fs.Bool("hf-checkpoint", false, "with --random: write a Hugging Face checkpoint (config.json, model.safetensors in the config's torch_dtype) instead of a model directory")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: conveyor build-model --from HF_DIR|FILE.gguf --out DIR [--quantize int8|int4] [--dtype float32|float16|bfloat16] [--kv-cache-dtype auto|float16|float32]\n       conveyor build-model --random --config CONFIG.json --out DIR [--seed N] [--hf-checkpoint]\n\nflags:")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return err
	}
	switch {
	case *out == "":
		return errors.New("build-model: --out is required")
	case *random && *from != "":
		return errors.New("build-model: use either --from or --random, not both")
	case *random && *configPath == "":
		return errors.New("build-model: --random needs --config CONFIG.json")
	case !*random && *from == "":
		return errors.New("build-model: give --from HF_DIR (or FILE.gguf), or --random --config CONFIG.json")
	case !*random && *configPath != "":
		return errors.New("build-model: --config only goes with --random (--from reads HF_DIR/config.json)")
	case *hfCheckpoint && !*random:
		return errors.New("build-model: --hf-checkpoint only goes with --random")
	case !*random && flagSet(fs, "seed"):
		return errors.New("build-model: --seed only goes with --random (--from takes the checkpoint's weights)")
	}
	quant, err := convert.ParseQuantization(*quantize)
	if err != nil {
		return fmt.Errorf("build-model: --quantize: %w", err)
	}
	stepType, err := convert.ParseDType(*dtype)
	if err != nil {
		return fmt.Errorf("build-model: --dtype: %w", err)
	}
	if *kvDType != models.KVCacheAuto && *kvDType != "float32" && *kvDType != "float16" {
		return fmt.Errorf("build-model: --kv-cache-dtype %q: want float32, float16 or auto", *kvDType)
	}
	opts := convert.Options{Quantize: quant, StepDType: stepType}
	switch {
	case stepType == convert.Float32:
		opts.StepKVDType = plan.CPUKVDType(*kvDType)
	case *kvDType != models.KVCacheAuto && *kvDType != stepType.String():
		return fmt.Errorf("build-model: --kv-cache-dtype %s: a %v step graph's cache is its own type (leave it auto)", *kvDType, stepType)
	}
	if *hfCheckpoint && quant.Bits != 0 {
		return errors.New("build-model: --quantize applies to model directories, not --hf-checkpoint")
	}
	start := time.Now()
	if *hfCheckpoint {
		files, err := convert.WriteRandomCheckpoint(*configPath, *out, *seed)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stdout, "wrote a random checkpoint in %.1f s:\n", time.Since(start).Seconds())
		for _, f := range files {
			fmt.Fprintf(os.Stdout, "  %s\n", f)
		}
		return nil
	}
	var res *convert.BuildResult
	if *random {
		res, err = convert.BuildRandom(*configPath, *out, *seed, opts)
	} else if convert.IsGGUF(*from) {
		if *quantize == "" {
			var holds string
			if quant, holds, err = convert.GGUFQuantization(*from, stepType != convert.Float32); err != nil {
				return err
			}
			fmt.Fprintf(os.Stdout, "%s: %s: building with %s weights (--quantize says otherwise)\n", *from, holds, quant)
		}
		opts.Quantize = quant
		res, err = convert.BuildFromGGUF(*from, *out, opts)
	} else if err = convert.CheckTokenizer(*from); err == nil {
		res, err = convert.BuildFromHF(*from, *out, opts)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stdout, "built %.1fM-parameter model (weights %s) in %.1f s:\n", float64(res.Params)/1e6, quant, time.Since(start).Seconds())
	if res.ContextCapped > 0 {
		fmt.Fprintf(os.Stdout, "note: context limited to %d tokens (longrope's original context; config.json's max_position_embeddings is rewritten)\n", res.ContextCapped)
	}
	for _, f := range res.Files {
		fmt.Fprintf(os.Stdout, "  %s\n", f)
	}
	return nil
}
