package scheduler

import (
	"math"
	"time"
)

// StepShape is what a step's duration depends on: the new tokens fed to the model, the
// rows (sequences) they belong to, and the attention work, the sum over rows of
// new tokens × keys each of them attends to.
type StepShape struct {
	Tokens   int
	Rows     int
	AttnWork float64
}

// add appends one row of n new tokens after past computed ones.
func (sh *StepShape) add(past, n int) {
	sh.Tokens += n
	sh.Rows++
	sh.AttnWork += attnWork(past, n)
}

// attnWork is the number of (query, key) pairs of n causal queries after past keys.
func attnWork(past, n int) float64 {
	return float64(n) * (float64(past) + float64(n+1)/2)
}

// Feature scales keep the normal equations well conditioned (all features near 1 for a
// typical step).
const (
	tokenScale = 1.0 / 256
	rowScale   = 1.0 / 64
	attnScale  = 1.0 / (256 * 1024)
)

// numCostFeatures: constant, tokens, rows, attention work.
const numCostFeatures = 4

// costForget is the weight an observation keeps per newer one: the model follows a
// machine whose speed drifts (other load, thermal) within a few hundred steps.
const costForget = 0.995

// minCostObservations is how many steps the model needs before it predicts.
const minCostObservations = 8

// StepCost is a linear model of a step's duration, learned online from measured steps:
//
//	seconds = c0 + c1·tokens + c2·rows + c3·attention work
//
// fitted by exponentially weighted ridge regression, coefficients kept non-negative.
// It is pure arithmetic (no clock): the engine measures, the scheduler predicts.
type StepCost struct {
	xx   [numCostFeatures][numCostFeatures]float64
	xy   [numCostFeatures]float64
	n    int
	coef [numCostFeatures]float64
	// fitted reports whether coef reflects every observation so far.
	fitted bool
	// maxSeenTokens is the most tokens of any observed step: predictions are trusted up to
	// twice that (TrustedTokens), not extrapolated further.
	maxSeenTokens int
}

func costFeatures(sh StepShape) [numCostFeatures]float64 {
	return [numCostFeatures]float64{1, float64(sh.Tokens) * tokenScale, float64(sh.Rows) * rowScale, sh.AttnWork * attnScale}
}

// Observe records that a step of shape sh took d.
func (c *StepCost) Observe(sh StepShape, d time.Duration) {
	if sh.Tokens <= 0 || d <= 0 {
		return
	}
	x := costFeatures(sh)
	y := d.Seconds()
	for i := range x {
		for j := range x {
			c.xx[i][j] = costForget*c.xx[i][j] + x[i]*x[j]
		}
		c.xy[i] = costForget*c.xy[i] + x[i]*y
	}
	c.n++
	c.fitted = false
	c.maxSeenTokens = max(c.maxSeenTokens, sh.Tokens)
}

// TrustedTokens returns the most tokens a step may carry on the model's word: twice the
// largest step observed. A model fitted on small steps cannot tell a step's per-token
// cost from its fixed cost well, so prompt chunks grow by at most doubling, each step
// measured before the next extrapolation.
func (c *StepCost) TrustedTokens() int { return 2 * c.maxSeenTokens }

// Ready reports whether the model has seen enough steps to predict.
func (c *StepCost) Ready() bool { return c.n >= minCostObservations }

// Predict returns the expected duration of a step of shape sh (0 before Ready).
func (c *StepCost) Predict(sh StepShape) time.Duration {
	if !c.Ready() || sh.Tokens <= 0 {
		return 0
	}
	c.fit()
	x := costFeatures(sh)
	var s float64
	for i := range x {
		s += c.coef[i] * x[i]
	}
	return time.Duration(s * float64(time.Second))
}

// marginal returns the expected extra time of one more row of n tokens after past.
func (c *StepCost) marginal(past, n int) time.Duration {
	c.fit()
	s := c.coef[1]*float64(n)*tokenScale + c.coef[2]*rowScale + c.coef[3]*attnWork(past, n)*attnScale
	return time.Duration(s * float64(time.Second))
}

// maxTokens returns the most of n tokens after past whose marginal cost fits in budget.
func (c *StepCost) maxTokens(past, n int, budget time.Duration) int {
	if budget <= 0 {
		return 0
	}
	lo, hi := 0, n // marginal is increasing in the token count
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if c.marginal(past, mid) <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// fit solves the ridge-regularised normal equations, then refits without any feature
// whose coefficient came out negative (a cost is never negative).
func (c *StepCost) fit() {
	if c.fitted {
		return
	}
	c.fitted = true
	active := [numCostFeatures]bool{true, true, true, true}
	for range numCostFeatures {
		coef, ok := solveRidge(c.xx, c.xy, active)
		if !ok {
			return
		}
		neg := false
		for i, v := range coef {
			if v < 0 {
				active[i] = false
				neg = true
			}
		}
		c.coef = coef
		if !neg {
			return
		}
	}
	for i := range c.coef {
		c.coef[i] = math.Max(c.coef[i], 0)
	}
}

// solveRidge solves (XX + λI) b = XY over the active features by Gaussian elimination.
func solveRidge(xx [numCostFeatures][numCostFeatures]float64, xy [numCostFeatures]float64, active [numCostFeatures]bool) ([numCostFeatures]float64, bool) {
	var idx []int
	for i, a := range active {
		if a {
			idx = append(idx, i)
		}
	}
	n := len(idx)
	var out [numCostFeatures]float64
	if n == 0 {
		return out, true
	}
	var trace float64
	for _, i := range idx {
		trace += xx[i][i]
	}
	lambda := 1e-6*trace/float64(n) + 1e-12
	a := make([][]float64, n)
	for r, i := range idx {
		a[r] = make([]float64, n+1)
		for col, j := range idx {
			a[r][col] = xx[i][j]
		}
		a[r][r] += lambda
		a[r][n] = xy[i]
	}
	for col := range n {
		piv := col
		for r := col + 1; r < n; r++ {
			if math.Abs(a[r][col]) > math.Abs(a[piv][col]) {
				piv = r
			}
		}
		if a[piv][col] == 0 {
			return out, false
		}
		a[col], a[piv] = a[piv], a[col]
		for r := range n {
			if r == col {
				continue
			}
			f := a[r][col] / a[col][col]
			for k := col; k <= n; k++ {
				a[r][k] -= f * a[col][k]
			}
		}
	}
	for r, i := range idx {
		out[i] = a[r][n] / a[r][r]
	}
	return out, true
}
