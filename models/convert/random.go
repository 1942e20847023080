package convert

import (
	"math"
	"math/rand/v2"
	"strings"
)

// RandomWeights returns seeded random weights for cfg (which must be valid and of a
// supported architecture), under the checkpoint's tensor names (see WeightShapes):
// the same cfg and seed always give the same values. Linear weights are normal with
// standard deviation 1/sqrt(fan-in), so every layer changes the residual stream by a
// comparable amount; the embedding's deviation 2/sqrt(hidden) gives logits of order
// one; norm weights are 1 + N(0, 0.1). The numbers mean nothing, but attention, the
// MLP and the mask all visibly shape the output, which is what tests need.
func RandomWeights(cfg *Config, seed int64) Weights {
	shapes, err := WeightShapes(cfg)
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x636f6e7665796f72)) // "conveyor"
	w := make(Weights, len(shapes))
	for _, name := range sortedKeys(shapes) {
		shape := shapes[name]
		t := &Tensor{Name: name, Shape: append([]int(nil), shape...)}
		t.Data = make([]float32, t.NumElements())
		switch {
		case strings.HasSuffix(name, "norm.weight"):
			for i := range t.Data {
				t.Data[i] = float32(1 + 0.1*rng.NormFloat64())
			}
		case strings.HasSuffix(name, ".bias"):
			fillNormal(rng, t.Data, 0.1)
		case name == "model.embed_tokens.weight" || name == "lm_head.weight":
			std := 2 / math.Sqrt(float64(shape[1]))
			fillNormal(rng, t.Data, std)
		default:
			fillNormal(rng, t.Data, 1/math.Sqrt(float64(shape[1])))
		}
		w[name] = t
	}
	return w
}

func fillNormal(rng *rand.Rand, dst []float32, std float64) {
	for i := range dst {
		dst[i] = float32(std * rng.NormFloat64())
	}
}
