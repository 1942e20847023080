package bench

import (
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

// WriteReport writes report.md and the charts throughput.png, ttft.png and itl.png to dir.
func WriteReport(dir string, meta ReportMeta, points []Point) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := throughputChart(filepath.Join(dir, "throughput.png"), points); err != nil {
		return err
	}
	if err := ttftChart(filepath.Join(dir, "ttft.png"), points); err != nil {
		return err
	}
	if err := itlChart(filepath.Join(dir, "itl.png"), points); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(dir, "report.md"))
	if err != nil {
		return err
	}
	writeMarkdown(f, meta, points)
	return f.Close()
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

func finite(points []Point) []Point {
	var out []Point
	for _, p := range points {
		if !math.IsInf(p.Rate, 0) {
			out = append(out, p)
		}
	}
	return out
}

func throughputChart(path string, points []Point) error {
	p := newPlot("Output throughput vs request rate", "offered request rate (req/s)", "output tokens/s")
	for _, pol := range policies(points) {
		var xys plotter.XYs
		for _, pt := range finite(points) {
			if pt.Policy == pol {
				xys = append(xys, plotter.XY{X: pt.Rate, Y: pt.Report.OutputThroughput})
			}
		}
		if err := addLine(p, pol, xys, colorFor(pol), false); err != nil {
			return err
		}
	}
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}

func ttftChart(path string, points []Point) error {
	p := newPlot("Time to first token vs request rate", "offered request rate (req/s)", "TTFT (ms, log scale)")
	p.Y.Scale = plot.LogScale{}
	p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	for _, pol := range policies(points) {
		var p50, p99 plotter.XYs
		for _, pt := range finite(points) {
			if pt.Policy == pol && pt.Report.Completed > 0 {
				p50 = append(p50, plotter.XY{X: pt.Rate, Y: math.Max(pt.Report.TTFT.P50, 0.1)})
				p99 = append(p99, plotter.XY{X: pt.Rate, Y: math.Max(pt.Report.TTFT.P99, 0.1)})
			}
		}
		if err := addLine(p, pol+" p50", p50, colorFor(pol), false); err != nil {
			return err
		}
		if err := addLine(p, pol+" p99", p99, colorFor(pol), true); err != nil {
			return err
		}
	}
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}

// itlChart draws the cumulative distribution of inter-token latency of each policy at
// the highest rate it ran.
func itlChart(path string, points []Point) error {
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
			return err
		}
		l.Color = colorFor(pol)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(fmt.Sprintf("%s @ %s req/s", pol, Rate(top.Rate)), l)
	}
	p.Legend.Left = false
	p.Legend.Top = false
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}
