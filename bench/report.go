package bench

import (
	"bytes"
	"errors"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
)

// ReportMeta describes how a sweep was run, for the written report.
type ReportMeta struct {
	Title   string
	Command string   // the exact command line
	Machine string   // e.g. "2 cores (AVX2), 24 GiB, ONNX Runtime 1.24.3 CPU"
	Model   string   // model directory and size
	Server  []string // server flags shared by every policy
	Load    string   // the workload and arrivals, in words
	Date    string
	// Notes is Markdown appended to the report under "Notes" (for example what limits the
	// ratios on this machine).
	Notes string
}

var policyColors = map[string]color.Color{
	"continuous": color.RGBA{R: 0x1f, G: 0x77, B: 0xb4, A: 0xff},
	"static":     color.RGBA{R: 0xd6, G: 0x27, B: 0x28, A: 0xff},
	"sequential": color.RGBA{R: 0x7f, G: 0x7f, B: 0x7f, A: 0xff},
}

func colorFor(policy string) color.Color {
	if c, ok := policyColors[policy]; ok {
		return c
	}
	return color.Black
}

// ErrChart wraps the error of a chart WriteReport could not draw; report.md was
// written before it.
var ErrChart = errors.New("bench: chart")

// WriteReport writes report.md and then the charts throughput.png, ttft.png and itl.png
// to dir. The report comes first so that a chart that cannot be drawn loses no results: it
// does not stop the other charts, no file (and no stale one) is left under its name, and
// the error, wrapping ErrChart, names it.
func WriteReport(dir string, meta ReportMeta, points []Point) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	writeMarkdown(f, meta, points)
	if err := f.Close(); err != nil {
		return err
	}
	var errs []error
	for _, c := range []struct {
		name string
		draw func([]Point) (*plot.Plot, error)
	}{{"throughput.png", throughputChart}, {"ttft.png", ttftChart}, {"itl.png", itlChart}} {
		path := filepath.Join(dir, c.name)
		p, err := c.draw(points)
		if err == nil {
			err = savePlot(path, p)
		}
		if err != nil {
			_ = os.Remove(path)
			errs = append(errs, fmt.Errorf("%w %s: %v", ErrChart, c.name, err))
		}
	}
	return errors.Join(errs...)
}

// savePlot draws p and writes it as a PNG to path. gonum/plot panics on some data (a log
// scale over a range that is not positive); that is an error here, and nothing is written
// unless the whole image was drawn.
func savePlot(path string, p *plot.Plot) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	c, err := p.WriterTo(16*vg.Centimeter, 10*vg.Centimeter, "png")
	if err != nil {
		return err
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return err
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func policies(points []Point) []string {
	var out []string
	for _, p := range points {
		if !slices.Contains(out, p.Policy) {
			out = append(out, p.Policy)
		}
	}
	return out
}

func writeMarkdown(w io.Writer, meta ReportMeta, points []Point) {
	title := meta.Title
	if title == "" {
		title = "Continuous vs static vs sequential batching"
	}
	fmt.Fprintf(w, "# %s\n\n", title)
	if meta.Date != "" {
		fmt.Fprintf(w, "Measured %s.\n\n", meta.Date)
	}
	fmt.Fprintf(w, "- Machine: %s\n- Model: %s\n", meta.Machine, meta.Model)
	if len(meta.Server) > 0 {
		fmt.Fprintf(w, "- Server flags (every policy): `%s`\n", strings.Join(meta.Server, " "))
	}
	if meta.Load != "" {
		fmt.Fprintf(w, "- Workload: %s\n", meta.Load)
	}
	fmt.Fprintf(w, "- Command: `%s`\n\n", meta.Command)

	ratios := Ratios(points, "continuous", "static")
	if len(ratios) > 0 {
		fmt.Fprintf(w, "## Continuous ÷ static\n\n")
		fmt.Fprintf(w, "| rate (req/s) | output throughput ratio | p50 TTFT: times lower | static sustains the rate |\n|---|---|---|---|\n")
		for _, r := range ratios {
			sus := "?"
			for _, p := range points {
				if p.Policy == "static" && p.Rate == r.Rate {
					sus = yesNo(Sustained(p))
				}
			}
			fmt.Fprintf(w, "| %s | %.2f× | %.2f× | %s |\n", Rate(r.Rate), r.Throughput, r.TTFTp50, sus)
		}
		fmt.Fprintln(w)
		if h, ok := Headline(points); ok {
			fmt.Fprintf(w, "%s\n\n", h)
		}
	}

	fmt.Fprintf(w, "## Charts\n\n![output throughput vs request rate](throughput.png)\n\n")
	fmt.Fprintf(w, "![p50 and p99 TTFT vs request rate](ttft.png)\n\n![ITL distribution at the highest rate](itl.png)\n\n")

	fmt.Fprintf(w, "## Every run\n\n")
	fmt.Fprintf(w, "| policy | rate (req/s) | ok | failed | req/s | output tok/s | TTFT p50 / p99 (ms) | TPOT p50 (ms) | ITL p50 / p99 (ms) | E2E p50 (ms) | goodput (req/s) |\n")
	fmt.Fprintf(w, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, p := range points {
		r := p.Report
		fmt.Fprintf(w, "| %s | %s | %d | %d | %.2f | %.1f | %.0f / %.0f | %.1f | %.1f / %.1f | %.0f | %.2f |\n",
			p.Policy, Rate(p.Rate), r.Completed, r.Failed, r.RequestThroughput, r.OutputThroughput,
			r.TTFT.P50, r.TTFT.P99, r.TPOT.P50, r.ITL.P50, r.ITL.P99, r.E2E.P50, r.Goodput)
	}
	fmt.Fprintln(w)
	for _, p := range points {
		for msg, n := range p.Report.Errors {
			fmt.Fprintf(w, "- %s at %s req/s: %d × %s\n", p.Policy, Rate(p.Rate), n, msg)
		}
	}
	fmt.Fprintf(w, "\nA policy *sustains* a rate when every request completed and the completed-request\n"+
		"throughput over the whole run, drain included, reached 80%% of the offered rate.\n")
	if notes := strings.TrimSpace(meta.Notes); notes != "" {
		fmt.Fprintf(w, "\n## Notes\n\n%s\n", notes)
	}
}

// Headline states the two ratios the comparison is about: continuous ÷ static output
// throughput at the highest rate run (saturation), and how many times lower continuous
// batching's p50 TTFT is at the highest rate static sustains.
func Headline(points []Point) (string, bool) {
	ratios := Ratios(points, "continuous", "static")
	if len(ratios) == 0 {
		return "", false
	}
	top := ratios[0]
	for _, r := range ratios {
		if r.Rate > top.Rate {
			top = r
		}
	}
	s := fmt.Sprintf("**At %s req/s (the highest rate run), continuous batching delivers %.2f× the output throughput of static batching",
		Rate(top.Rate), top.Throughput)
	best := math.Inf(-1)
	var bestRatio Ratio
	for _, p := range points {
		if p.Policy == "static" && Sustained(p) && p.Rate > best {
			best = p.Rate
		}
	}
	for _, r := range ratios {
		if r.Rate == best {
			bestRatio = r
		}
	}
	if !math.IsInf(best, -1) {
		s += fmt.Sprintf("; at %s req/s, the highest rate static sustains, its p50 TTFT is %.2f× lower.**", Rate(best), bestRatio.TTFTp50)
	} else {
		s += fmt.Sprintf("; static sustained none of the rates run (p50 TTFT %.2f× lower at the top rate).**", top.TTFTp50)
	}
	return s, true
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	p.Add(plotter.NewGrid())
	return p
}

func addLine(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dashed bool) error {
	if len(xys) == 0 {
		return nil
	}
	l, s, err := plotter.NewLinePoints(xys)
	if err != nil {
		return err
	}
	l.Color, s.Color = c, c
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		s.Shape = draw.BoxGlyph{}
	}
	p.Add(l, s)
	p.Legend.Add(name, l, s)
	return nil
}

// rateAxis places request rates on a chart's x axis. Finite rates sit at their value on a
// linear axis. inf (all at once) has no place there, so a sweep that includes it gets one
// evenly spaced slot per rate run, labelled with the rate, inf last.
type rateAxis struct {
	slots []float64 // the distinct rates, ascending, when the axis is by slot; nil when linear
}

func newRateAxis(points []Point) rateAxis {
	var rates []float64
	for _, p := range points {
		if !slices.Contains(rates, p.Rate) {
			rates = append(rates, p.Rate)
		}
	}
	if !slices.ContainsFunc(rates, func(r float64) bool { return math.IsInf(r, 0) }) {
		return rateAxis{}
	}
	slices.Sort(rates)
	return rateAxis{slots: rates}
}

// x is where rate sits on the axis.
func (a rateAxis) x(rate float64) float64 {
	if a.slots == nil {
		return rate
	}
	return float64(slices.Index(a.slots, rate))
}

// label names the axis and, when it is by slot, marks each slot with its rate.
func (a rateAxis) label(p *plot.Plot) {
	p.X.Label.Text = "offered request rate (req/s)"
	if a.slots == nil {
		return
	}
	p.X.Label.Text = "offered request rate (req/s; inf = all at once; evenly spaced)"
	ticks := make(plot.ConstantTicks, len(a.slots))
	for i, r := range a.slots {
		ticks[i] = plot.Tick{Value: float64(i), Label: Rate(r).String()}
	}
	p.X.Tick.Marker = ticks
	p.X.Min, p.X.Max = -0.5, float64(len(a.slots))-0.5
}

func throughputChart(points []Point) (*plot.Plot, error) {
	axis := newRateAxis(points)
	p := newPlot("Output throughput vs request rate", "", "output tokens/s")
	axis.label(p)
	for _, pol := range policies(points) {
		var xys plotter.XYs
		for _, pt := range points {
			if pt.Policy == pol {
				xys = append(xys, plotter.XY{X: axis.x(pt.Rate), Y: pt.Report.OutputThroughput})
			}
		}
		if err := addLine(p, pol, xys, colorFor(pol), false); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// ttftChart draws p50 and p99 TTFT on a log scale; a sweep in which no request completed
// has nothing to draw there and gets an empty linear chart that says so.
func ttftChart(points []Point) (*plot.Plot, error) {
	axis := newRateAxis(points)
	p := newPlot("Time to first token vs request rate", "", "TTFT (ms, log scale)")
	axis.label(p)
	drawn := false
	for _, pol := range policies(points) {
		var p50, p99 plotter.XYs
		for _, pt := range points {
			if pt.Policy == pol && pt.Report.Completed > 0 {
				p50 = append(p50, plotter.XY{X: axis.x(pt.Rate), Y: math.Max(pt.Report.TTFT.P50, 0.1)})
				p99 = append(p99, plotter.XY{X: axis.x(pt.Rate), Y: math.Max(pt.Report.TTFT.P99, 0.1)})
			}
		}
		drawn = drawn || len(p50) > 0
		if err := addLine(p, pol+" p50", p50, colorFor(pol), false); err != nil {
			return nil, err
		}
		if err := addLine(p, pol+" p99", p99, colorFor(pol), true); err != nil {
			return nil, err
		}
	}
	if !drawn {
		p.Title.Text += " (no request completed)"
		p.Y.Label.Text = "TTFT (ms)"
		p.Y.Min, p.Y.Max = 0, 1
		return p, nil
	}
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	return p, nil
}

// itlChart draws the cumulative distribution of inter-token latency of each policy at
// the highest rate it ran.
func itlChart(points []Point) (*plot.Plot, error) {
	p := newPlot("Inter-token latency at the highest rate", "ITL (ms)", "fraction of gaps ≤ x")
	for _, pol := range policies(points) {
		var top *Point
		for i := range points {
			if points[i].Policy == pol && (top == nil || points[i].Rate > top.Rate) {
				top = &points[i]
			}
		}
		if top == nil || len(top.Report.ITLSamples) == 0 {
			continue
		}
		s := slices.Clone(top.Report.ITLSamples)
		slices.Sort(s)
		const steps = 200
		var xys plotter.XYs
		for i := 0; i <= steps; i++ {
			q := float64(i) / steps
			xys = append(xys, plotter.XY{X: Percentile(s, 99.5*q), Y: q * 0.995})
		}
		l, err := plotter.NewLine(xys)
		if err != nil {
			return nil, err
		}
		l.Color = colorFor(pol)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s @ %s req/s", pol, Rate(top.Rate)), l)
	}
	p.Legend.Left = false
	p.Legend.Top = false
	return p, nil
}
