package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// batchURLs are the endpoints a batch line may call.
var batchURLs = map[string]bool{"/v1/completions": true, "/v1/chat/completions": true, "/v1/responses": true}

// scanLines calls fn with each non-blank line of r (1-based line numbers count every
// line), without its line ending and surrounding white space, until fn returns false.
func scanLines(r io.Reader, fn func(n int, line []byte) bool) error {
	br := bufio.NewReaderSize(r, 1<<20)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if n == 1 {
			line = bytes.TrimPrefix(line, []byte("\ufeff")) // a UTF-8 byte order mark
		}
		if t := bytes.TrimSpace(line); len(t) > 0 && !fn(n, t) {
			return nil
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// Kinds of action for an input line.
const (
	actSkip  = iota // answered by an earlier run
	actError        // written at once as an error line
	actRun          // run through the API
)

// batchAction is what to do with one input line.
type batchAction struct {
	kind     int
	customID *string // nil for a line without a usable custom_id
	code     string  // actError
	msg      string  // actError
	url      string  // actRun
	body     []byte  // actRun
}

// batchPlanner classifies input lines in order. It is deterministic, so the counting
// pass and the run agree, and a resumed run skips exactly the lines written before.
type batchPlanner struct {
	prev      *resumeState
	seen      map[string]int // custom_id -> line of its first occurrence
	dupsSeen  map[string]int
	anonymous int
}

func newBatchPlanner(prev *resumeState) *batchPlanner {
	return &batchPlanner{prev: prev, seen: map[string]int{}, dupsSeen: map[string]int{}}
}

// classify decides what line n needs. Lines that cannot be identified (not JSON, no
// custom_id) are matched to earlier runs by their order; every other line by custom_id.
func (p *batchPlanner) classify(n int, line []byte) batchAction {
	var l struct {
		CustomID json.RawMessage `json:"custom_id"`
		Method   json.RawMessage `json:"method"`
		URL      json.RawMessage `json:"url"`
		Body     json.RawMessage `json:"body"`
	}
	anon := func(code, msg string) batchAction {
		p.anonymous++
		if p.anonymous <= p.prev.anonymous {
			return batchAction{kind: actSkip}
		}
		return batchAction{kind: actError, code: code, msg: fmt.Sprintf("line %d: %s", n, msg)}
	}
	if line[0] != '{' {
		return anon("invalid_json", "the line is not a JSON object")
	}
	if err := json.Unmarshal(line, &l); err != nil {
		return anon("invalid_json", "the line is not valid JSON: "+err.Error())
	}
	var id string
	if l.CustomID == nil || isJSONNull(l.CustomID) {
		return anon("missing_custom_id", "custom_id is required")
	}
	if json.Unmarshal(l.CustomID, &id) != nil || id == "" {
		return anon("invalid_custom_id", "custom_id must be a non-empty string")
	}
	if first, dup := p.seen[id]; dup {
		p.dupsSeen[id]++
		if p.dupsSeen[id] <= p.prev.dups[id] {
			return batchAction{kind: actSkip}
		}
		return batchAction{kind: actError, customID: &id, code: "duplicate_custom_id",
			msg: fmt.Sprintf("line %d: custom_id %q already appeared on line %d; custom_ids must be unique", n, id, first)}
	}
	p.seen[id] = n
	if p.prev.answered[id] {
		return batchAction{kind: actSkip}
	}
	var method, url string
	if json.Unmarshal(l.Method, &method) != nil || method != http.MethodPost {
		return batchAction{kind: actError, customID: &id, code: "invalid_method",
			msg: fmt.Sprintf("line %d: method must be \"POST\", got %s", n, orMissing(l.Method))}
	}
	if json.Unmarshal(l.URL, &url) != nil || !batchURLs[url] {
		return batchAction{kind: actError, customID: &id, code: "invalid_url",
			msg: fmt.Sprintf("line %d: url must be \"/v1/completions\", \"/v1/chat/completions\" or \"/v1/responses\", got %s", n, orMissing(l.URL))}
	}
	var body []byte
	if l.Body != nil && !isJSONNull(l.Body) {
		body = l.Body // the API itself answers a missing or malformed body (400)
	}
	return batchAction{kind: actRun, customID: &id, url: url, body: body}
}

func isJSONNull(v json.RawMessage) bool { return string(bytes.TrimSpace(v)) == "null" }

// orMissing shows a raw JSON value in an error message.
func orMissing(v json.RawMessage) string {
	if v == nil {
		return "nothing"
	}
	if len(v) > 64 {
		return string(v[:64]) + "…"
	}
	return string(v)
}
