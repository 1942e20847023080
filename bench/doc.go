// Package bench is Conveyor's load generator: an open-loop client for any
// OpenAI-compatible /v1/completions endpoint, and the sweep that compares batching
// policies on the same workload.
//
// A workload (Generate) is a seeded list of requests whose prompts are random token ids,
// so a prompt of N ids is exactly N tokens on any server that accepts token-id prompts,
// and whose output lengths are enforced with max_tokens and ignore_eos. Lengths are
// fixed, uniform, or a lognormal mix resembling chat traffic.
//
// Run sends each request at its arrival time: Poisson arrivals at a request rate, gamma
// arrivals with a burstiness (the gamma shape; 1 is Poisson), or all at once; a
// concurrency cap turns that into a closed loop. Every request streams, and the client
// measures time to first token (TTFT), the gaps between text chunks (inter-token latency,
// ITL), time per output token after the first (TPOT) and end-to-end latency (E2E). SSE
// events are split with github.com/r3labs/sse/v2's EventStreamReader over the POST
// response body. A request that fails (an HTTP error, an in-band error event, a dropped
// connection, a stream without [DONE]) is counted and reported with its error.
//
// Soak is the long-haul check (`conveyor bench soak`): a closed loop of clients sends a
// seeded mix of request kinds (plain and streamed completions and chat, chat with n > 1,
// streams the client hangs up on, json_schema replies, required tool calls, malformed and
// over-context requests) for an hour or more, and judges every reply: a json_schema reply
// and a tool call's arguments must validate against their schema (with the independent
// validator github.com/santhosh-tekuri/jsonschema), a stream must end with a finish_reason
// and [DONE], a bad request must get a 400 with an OpenAI error object (code
// context_length_exceeded when too long), and nothing may get a 5xx. Each period it prints
// the requests by kind, the unexpected outcomes, the server's RSS, the KV blocks in use and
// the latency percentiles; at the end the server must go idle with no KV block in use.
//
// Compare starts one server per policy through an injected StartFunc, runs the same
// workload at each rate, and WriteReport writes a Markdown report with PNG charts drawn
// with gonum.org/v1/plot.
//
//	items, _ := bench.Generate(bench.DefaultWorkloadConfig())
//	rep, _, err := bench.Run(ctx, bench.RunConfig{
//		Target:      bench.Target{BaseURL: "http://127.0.0.1:8000", Model: "default"},
//		Items:       items,
//		RequestRate: 4, // requests/s, Poisson
//	})
//	rep.Format(os.Stdout)
package bench
