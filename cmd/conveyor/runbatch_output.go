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
	"path/filepath"
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

// add counts one result line.
func (s *resumeState) add(r resultFields) {
	s.lines++
	switch {
	case r.CustomID == nil:
		s.anonymous++
	case r.Error != nil && r.Error.Code == "duplicate_custom_id":
		s.dups[*r.CustomID]++
	default:
		s.answered[*r.CustomID] = true
	}
}

// resultFields are the members of a result line that resuming reads.
type resultFields struct {
	CustomID *string `json:"custom_id"`
	Error    *struct {
		Code string `json:"code"`
	} `json:"error"`
}

// parseResult reads line (without its line ending) as a result line: a JSON object with
// a custom_id or an error, which is what this command writes and what OpenAI's batch
// output holds.
func parseResult(line []byte) (resultFields, bool) {
	var r resultFields
	if json.Unmarshal(line, &r) != nil || (r.CustomID == nil && r.Error == nil) {
		return r, false
	}
	return r, true
}

// batchOutput is the --output file as the run found it. openBatchOutput only reads it;
// begin, called once the model has loaded, cuts a partial last line or creates a missing
// file. A run that fails to start therefore leaves the output as it was.
type batchOutput struct {
	path string
	f    *os.File // nil while the file does not exist
	size int64    // bytes read
	prev *resumeState
	// cut: the bytes after prev.bytes are the start of a result line a killed run was
	// writing, which begin drops. newline: the last line is whole but lacks its line
	// ending, which begin adds.
	cut, newline bool
}

// openBatchOutput reads the output at path, if any, for what it already answers. Every
// complete line must be a result line (or blank). A last line without its line ending
// is kept when it is a whole result, dropped (by begin) when it can be the start of a
// line lineWriter writes (see isResultPrefix), and refused otherwise: a file this
// command did not write is never cut. Nothing is written here.
func openBatchOutput(path string) (*batchOutput, error) {
	o := &batchOutput{path: path, prev: &resumeState{answered: map[string]bool{}, dups: map[string]int{}}}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if errors.Is(err, fs.ErrNotExist) {
		// Created by begin; its directory is checked now, not after the model has loaded.
		dir := filepath.Dir(path)
		if st, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("run-batch: --output %s: %w", path, err)
		} else if !st.IsDir() {
			return nil, fmt.Errorf("run-batch: --output %s: %s is not a directory", path, dir)
		}
		return o, nil
	}
	if err != nil {
		return nil, fmt.Errorf("run-batch: %w", err)
	}
	notResult := func(n int) error {
		f.Close()
		return fmt.Errorf("run-batch: --output %s line %d is not a run-batch result; give a new --output", path, n)
	}
	br := bufio.NewReaderSize(f, 1<<20)
	for n := 1; ; n++ {
		line, err := br.ReadBytes('\n')
		o.size += int64(len(line))
		if err != nil && err != io.EOF {
			f.Close()
			return nil, fmt.Errorf("run-batch: read %s: %w", path, err)
		}
		t := bytes.TrimSpace(line)
		r, ok := parseResult(t)
		if err == io.EOF { // line, if any, has no line ending
			switch {
			case len(line) == 0:
			case len(t) == 0:
				o.newline = true
			case ok:
				o.prev.add(r)
				o.newline = true
			case isResultPrefix(line):
				o.cut = true
			default:
				return nil, notResult(n)
			}
			break
		}
		o.prev.bytes += int64(len(line))
		if len(t) == 0 {
			continue
		}
		if !ok {
			return nil, notResult(n)
		}
		o.prev.add(r)
	}
	if !o.cut {
		o.prev.bytes = o.size
	}
	o.f = f
	return o, nil
}

// resultHead is how every line lineWriter writes begins (resultLine's and
// errorResultLine's alike): the id, "batch_req_" and resultIDDigits lowercase hex digits,
// then the custom_id member.
const (
	resultHead     = `{"id":"batch_req_`
	resultIDDigits = 24
	resultNext     = `","custom_id":`
)

// isResultPrefix reports whether b can be the start of a line lineWriter writes, cut
// short by a kill: it begins as every such line does (as much of it as b holds) and
// holds no NUL byte and no line ending, which JSON never has outside strings and
// escapes inside them. A file system that zero-fills the end of a file after a crash
// leaves NULs, which this refuses rather than cuts.
func isResultPrefix(b []byte) bool {
	if bytes.IndexByte(b, 0) >= 0 || bytes.ContainsAny(b, "\r\n") {
		return false
	}
	n := min(len(b), len(resultHead))
	if string(b[:n]) != resultHead[:n] {
		return false
	}
	b = b[n:]
	for i := 0; i < len(b) && i < resultIDDigits; i++ {
		if c := b[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	if len(b) <= resultIDDigits {
		return true
	}
	b = b[resultIDDigits:]
	n = min(len(b), len(resultNext))
	return string(b[:n]) == resultNext[:n]
}

// begin makes the output ready for this run's lines, once the run is sure to start: it
// creates a missing file, or cuts a partial last line or ends a whole one, and returns the
// file, positioned to append. It fails when the file changed since openBatchOutput read
// it (another run, or an editor).
func (o *batchOutput) begin() (*os.File, error) {
	if o.f == nil {
		f, err := os.OpenFile(o.path, os.O_RDWR|os.O_CREATE|os.O_EXCL|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("run-batch: %w", err)
		}
		o.f = f
		return f, nil
	}
	st, err := o.f.Stat()
	if err != nil {
		return nil, fmt.Errorf("run-batch: %w", err)
	}
	if st.Size() != o.size {
		return nil, fmt.Errorf("run-batch: --output %s changed since the run read it (%d bytes, now %d); run the same command again", o.path, o.size, st.Size())
	}
	switch {
	case o.cut:
		if err := o.f.Truncate(o.prev.bytes); err != nil {
			return nil, fmt.Errorf("run-batch: %w", err)
		}
	case o.newline:
		if _, err := o.f.Write([]byte("\n")); err != nil {
			return nil, fmt.Errorf("run-batch: write %s: %w", o.path, err)
		}
		o.prev.bytes++
	}
	o.cut, o.newline = false, false
	o.size = o.prev.bytes
	return o.f, nil
}

// Close closes the file, if it was opened.
func (o *batchOutput) Close() error {
	if o.f == nil {
		return nil
	}
	return o.f.Close()
}

// lineWriter appends whole lines to the output: one Write per line under a mutex, so
// lines never interleave and a kill leaves at most a partial last line (which a resumed
// run truncates away: see isResultPrefix). The file is not buffered: a line is in the kernel once written.
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
