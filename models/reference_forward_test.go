package models

import (
	"fmt"
	"math"
	"testing"

	"github.com/conveyor-llm/conveyor/models/convert"
)

// refModel is a plain-Go Llama forward pass in float64 with naive loops, written from
// the model's math (not from the ONNX builder) to check the ONNX graphs against:
// RMSNorm, rotary embeddings with Hugging Face's rotate_half convention, grouped-query
// causal softmax attention, SwiGLU MLP, tied or untied lm_head. It recomputes the whole
// sequence every call and keeps no cache.
type refModel struct {
	cfg                          *convert.Config
	w                            convert.Weights
	hidden, heads, kvHeads, hdim int
	eps, theta                   float64
	inter, vocab                 int
	embed, lmHead                []float32
}

func newRefModel(tb testing.TB, cfg *convert.Config, w convert.Weights) *refModel {
	tb.Helper()
	m := &refModel{
		cfg: cfg, w: w,
		hidden: cfg.HiddenSize, heads: cfg.NumAttentionHeads, kvHeads: cfg.NumKeyValueHeads,
		hdim: cfg.HeadDim, eps: cfg.RMSNormEps, theta: cfg.RopeTheta,
		inter: cfg.IntermediateSize, vocab: cfg.VocabSize,
	}
	if m.kvHeads == 0 {
		m.kvHeads = m.heads
	}
	if m.hdim == 0 {
		m.hdim = m.hidden / m.heads
	}
	if m.theta == 0 {
		m.theta = 10000
	}
	if m.eps == 0 {
		m.eps = 1e-6
	}
	m.embed = m.tensor(tb, "model.embed_tokens.weight", m.vocab, m.hidden)
	if lm, ok := w["lm_head.weight"]; ok && !cfg.TieWordEmbeddings {
		m.lmHead = lm.Data
	} else {
		m.lmHead = m.embed
	}
	return m
}

// tensor returns a weight's data after checking its shape.
func (m *refModel) tensor(tb testing.TB, name string, shape ...int) []float32 {
	tb.Helper()
	t, ok := m.w[name]
	if !ok {
		tb.Fatalf("reference: weight %s missing", name)
	}
	n := 1
	for _, d := range shape {
		n *= d
	}
	if len(t.Data) != n {
		tb.Fatalf("reference: weight %s has %d values, want %v", name, len(t.Data), shape)
	}
	return t.Data
}

// optional returns a weight's data or nil when the checkpoint lacks it (biases).
func (m *refModel) optional(name string) []float32 {
	if t, ok := m.w[name]; ok {
		return t.Data
	}
	return nil
}

// refLinear computes W x + b for W of shape [out, in] (Hugging Face layout).
func refLinear(wt []float32, b []float32, x []float64, out int) []float64 {
	in := len(x)
	y := make([]float64, out)
	for o := 0; o < out; o++ {
		s := 0.0
		row := wt[o*in : (o+1)*in]
		for i, xi := range x {
			s += float64(row[i]) * xi
		}
		if b != nil {
			s += float64(b[o])
		}
		y[o] = s
	}
	return y
}

// refRMSNorm computes x / sqrt(mean(x^2) + eps) * w.
func refRMSNorm(x []float64, w []float32, eps float64) []float64 {
	ss := 0.0
	for _, v := range x {
		ss += v * v
	}
	inv := 1 / math.Sqrt(ss/float64(len(x))+eps)
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = v * inv * float64(w[i])
	}
	return y
}

// refRoPE rotates each head of x (heads*hdim values) in place for position pos:
// x*cos + rotate_half(x)*sin with rotate_half(x) = [-x2, x1] and frequencies
// theta^(-2i/hdim) repeated over both halves.
func refRoPE(x []float64, heads, hdim int, pos int, theta float64) {
	half := hdim / 2
	for h := 0; h < heads; h++ {
		v := x[h*hdim : (h+1)*hdim]
		for i := 0; i < half; i++ {
			freq := math.Pow(theta, -float64(2*i)/float64(hdim))
			c, s := math.Cos(float64(pos)*freq), math.Sin(float64(pos)*freq)
			x1, x2 := v[i], v[i+half]
			v[i] = x1*c - x2*s
			v[i+half] = x2*c + x1*s
		}
	}
}

func refSiLU(x float64) float64 { return x / (1 + math.Exp(-x)) }

// forward returns the logits of every position of tokens (positions 0..n-1).
func (m *refModel) forward(tb testing.TB, tokens []int32) [][]float64 {
	tb.Helper()
	n, H := len(tokens), m.hidden
	x := make([][]float64, n)
	for t, id := range tokens {
		x[t] = make([]float64, H)
		for i := range x[t] {
			x[t][i] = float64(m.embed[int(id)*H+i])
		}
	}
	qDim, kvDim := m.heads*m.hdim, m.kvHeads*m.hdim
	group := m.heads / m.kvHeads
	scale := 1 / math.Sqrt(float64(m.hdim))
	for l := 0; l < m.cfg.NumHiddenLayers; l++ {
		p := fmt.Sprintf("model.layers.%d.", l)
		ln1 := m.tensor(tb, p+"input_layernorm.weight", H)
		wq := m.tensor(tb, p+"self_attn.q_proj.weight", qDim, H)
		wk := m.tensor(tb, p+"self_attn.k_proj.weight", kvDim, H)
		wv := m.tensor(tb, p+"self_attn.v_proj.weight", kvDim, H)
		wo := m.tensor(tb, p+"self_attn.o_proj.weight", H, qDim)
		ln2 := m.tensor(tb, p+"post_attention_layernorm.weight", H)
		wg := m.tensor(tb, p+"mlp.gate_proj.weight", m.inter, H)
		wu := m.tensor(tb, p+"mlp.up_proj.weight", m.inter, H)
		wd := m.tensor(tb, p+"mlp.down_proj.weight", H, m.inter)
		bq, bk, bv := m.optional(p+"self_attn.q_proj.bias"), m.optional(p+"self_attn.k_proj.bias"), m.optional(p+"self_attn.v_proj.bias")
		bo := m.optional(p + "self_attn.o_proj.bias")

		q, k, v := make([][]float64, n), make([][]float64, n), make([][]float64, n)
		for t := 0; t < n; t++ {
			h := refRMSNorm(x[t], ln1, m.eps)
			q[t], k[t], v[t] = refLinear(wq, bq, h, qDim), refLinear(wk, bk, h, kvDim), refLinear(wv, bv, h, kvDim)
			refRoPE(q[t], m.heads, m.hdim, t, m.theta)
			refRoPE(k[t], m.kvHeads, m.hdim, t, m.theta)
		}
		for t := 0; t < n; t++ {
			attn := make([]float64, qDim)
			for hh := 0; hh < m.heads; hh++ {
				g := hh / group
				qh := q[t][hh*m.hdim : (hh+1)*m.hdim]
				scores := make([]float64, t+1) // causal: keys 0..t only
				maxS := math.Inf(-1)
				for s := 0; s <= t; s++ {
					kh := k[s][g*m.hdim : (g+1)*m.hdim]
					d := 0.0
					for i := range qh {
						d += qh[i] * kh[i]
					}
					scores[s] = d * scale
					maxS = math.Max(maxS, scores[s])
				}
				sum := 0.0
				for s := range scores {
					scores[s] = math.Exp(scores[s] - maxS)
					sum += scores[s]
				}
				out := attn[hh*m.hdim : (hh+1)*m.hdim]
				for s := range scores {
					vh := v[s][g*m.hdim : (g+1)*m.hdim]
					for i := range out {
						out[i] += scores[s] / sum * vh[i]
					}
				}
			}
			o := refLinear(wo, bo, attn, H)
			for i := range x[t] {
				x[t][i] += o[i]
			}
			h := refRMSNorm(x[t], ln2, m.eps)
			gate, up := refLinear(wg, nil, h, m.inter), refLinear(wu, nil, h, m.inter)
			for i := range gate {
				gate[i] = refSiLU(gate[i]) * up[i]
			}
			d := refLinear(wd, nil, gate, H)
			for i := range x[t] {
				x[t][i] += d[i]
			}
		}
	}
	norm := m.tensor(tb, "model.norm.weight", H)
	logits := make([][]float64, n)
	for t := 0; t < n; t++ {
		logits[t] = refLinear(m.lmHead, nil, refRMSNorm(x[t], norm, m.eps), m.vocab)
	}
	return logits
}
