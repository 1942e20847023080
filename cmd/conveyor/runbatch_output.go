package main

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sync"
)

// resumeState is what an existing output file already answers.
type resumeState struct {
	answered  map[string]bool // custom_ids with a result (an error line counts)
	dups      map[string]int  // duplicate_custom_id lines per custom_id
	anonymous int             // error lines without a custom_id (unparsable input lines)
	lines     int
	bytes     int64 // the size of the whole lines, where this run appends
}

// openBatchOutput opens path for appending, creating it when missing. An existing file
// is read first: a trailing partial line (a run killed mid-write) is truncated away and
// the complete lines say which input lines are already answered.
func openBatchOutput(path string) (*os.File, *resumeState, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("run-batch: %w", err)
	}
	prev := &resumeState{answered: map[string]bool{}, dups: map[string]int{}}
	br := bufio.NewReaderSize(f, 1<<20)
	var complete int64
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		if err == io.EOF {
			break // line, if any, is partial
		}
		if err != nil {
			f.Close()
			return nil, nil, fmt.Errorf("run-batch: read %s: %w", path, err)
		}
		complete += int64(len(line))
		var r struct {
			CustomID *string `json:"custom_id"`
			Error    *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		if t := bytes.TrimSpace(line); len(t) == 0 {
			continue
		} else if json.Unmarshal(t, &r) != nil || (r.CustomID == nil && r.Error == nil) {
			f.Close()
			return nil, nil, fmt.Errorf("run-batch: --output %s line %d is not a run-batch result; give a new --output", path, n)
		}
		prev.lines++
		switch {
		case r.CustomID == nil:
			prev.anonymous++
		case r.Error != nil && r.Error.Code == "duplicate_custom_id":
			prev.dups[*r.CustomID]++
		default:
			prev.answered[*r.CustomID] = true
		}
	}
	if err := f.Truncate(complete); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("run-batch: %w", err)
	}
	prev.bytes = complete
	return f, prev, nil
}

// lineWriter appends whole lines to the output: one Write per line under a mutex, so
// lines never interleave and a kill leaves at most a partial last line (which a resumed
// run truncates away). The file is not buffered: a line is in the kernel once written.
// A write that fails (a full disk: part of the line written, then ENOSPC) stops the run
// and cuts the file back to its last whole line, so that the output holds only whole
// lines and a rerun resumes right after them.
type lineWriter struct {
	mu      sync.Mutex
	f       *os.File
	out     io.Writer // f, or a test's wrapper of it
	size    int64     // bytes of whole lines in f
	err     error
	n       int
	fail    func()
	onWrite func(int)
	stats   *batchStats
}

// write appends line (which ends in "\n") and counts it.
func (w *lineWriter) write(line []byte, ok bool, tokens int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return
	}
	if n, err := w.out.Write(line); err != nil || n != len(line) {
		var pe *fs.PathError
		switch {
		case err == nil:
			err = io.ErrShortWrite
		case errors.As(err, &pe):
			err = pe.Err // the error names the file already
		}
		if terr := w.f.Truncate(w.size); terr != nil {
			err = fmt.Errorf("%w; cutting the partial line failed too (a rerun cuts it): %w", err, terr)
		}
		w.err = err
		if w.fail != nil {
			w.fail()
		}
		return
	}
	w.size += int64(len(line))
	w.n++
	if w.stats != nil {
		w.stats.written.Add(1)
		if !ok {
			w.stats.failed.Add(1)
		}
		w.stats.tokens.Add(int64(tokens))
	}
	if w.onWrite != nil {
		w.onWrite(w.n)
	}
}

func (w *lineWriter) error() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// resultLine is the output line of an answered request: body is the API's JSON response.
func resultLine(customID string, status int, requestID string, body []byte) []byte {
	var b bytes.Buffer
	b.Grow(len(body) + 160)
	b.WriteString(`{"id":`)
	b.Write(jsonString(newHexID("batch_req_")))
	b.WriteString(`,"custom_id":`)
	b.Write(jsonString(customID))
	fmt.Fprintf(&b, `,"response":{"status_code":%d,"request_id":`, status)
	b.Write(jsonString(requestID))
	b.WriteString(`,"body":`)
	b.Write(body)
	b.WriteString("},\"error\":null}\n")
	return b.Bytes()
}

// errorResultLine is the output line of a line that could not be run.
func errorResultLine(customID *string, code, msg string) []byte {
	type errObj struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	}
	line, _ := json.Marshal(struct {
		ID       string  `json:"id"`
		CustomID *string `json:"custom_id"`
		Response any     `json:"response"`
		Error    errObj  `json:"error"`
	}{newHexID("batch_req_"), customID, nil, errObj{code, msg}})
	return append(line, '\n')
}

func jsonString(s string) []byte {
	b, _ := json.Marshal(s)
	return b
}

// newHexID returns prefix and 24 random hex digits.
func newHexID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}
