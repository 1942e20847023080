// Package webui is Conveyor's built-in chat page: plain HTML, CSS and JavaScript embedded
// in the binary (static/), with no build step and nothing fetched from elsewhere at run
// time.
//
// The page streams replies from /v1/chat/completions with stream: true, reading the SSE
// body with fetch and a stream reader, and shows text as it arrives. It keeps the
// conversation as history, has a system prompt and temperature / max tokens / seed
// settings, and a Stop button that aborts the fetch: the server sees the client go away
// and aborts the sequence, whose KV blocks return to the pool. Each reply shows its time
// to first token and tokens/s. HTTP errors (with the server's message) and in-band
// stream errors are shown in one error box; a turn that produced no text is taken back
// and its prompt returned to the input box. When the server answers 401, the page asks
// for the API key (kept in localStorage) and sends it as a bearer token. All text, the
// model's included, is inserted with textContent, never as HTML.
//
// The live engine view polls GET /v1/engine/stats (the Stats shape, built by StatsFrom)
// about once a second: running and waiting sequences, the batch size of recent forward
// passes, KV blocks used / cached / free, and the prefix-cache hit rate.
//
// The api package mounts the page:
//
//	page := gin.WrapH(webui.Handler())
//	r.GET("/", page)
//	r.GET("/app.js", page)
//	r.GET("/style.css", page)
//	r.GET("/v1/engine/stats", func(c *gin.Context) {
//		c.JSON(http.StatusOK, webui.StatsFrom(eng.Stats()))
//	})
//
// The package's browser test drives the page in headless Chromium (Debian's chromium
// package; CONVEYOR_CHROMIUM overrides the path) against the real server, engine and a
// tiny random model; it fails when Chromium is missing. `go test -tags conveyorgen
// ./api/webui -run TestREADMEScreenshot` rewrites docs/webui.png.
package webui
