package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestIsResultPrefixMatchesWriter ties the test a resumed run cuts a partial last line by
// to the writer: every prefix of every kind of line lineWriter writes passes it, and
// lines this command never writes do not.
func TestIsResultPrefixMatchesWriter(t *testing.T) {
	id := "c\n1"
	for _, line := range [][]byte{
		resultLine("a", 200, "req-1", []byte(`{"x":"y\n"}`)),
		resultLine("", 400, "", []byte(`{}`)),
		errorResultLine(&id, "invalid_url", "line 2: bad"),
		errorResultLine(nil, "invalid_json", "line 3: not JSON"),
	} {
		body := bytes.TrimSuffix(line, []byte("\n"))
		for n := 1; n <= len(body); n++ {
			if !isResultPrefix(body[:n]) {
				t.Fatalf("%q: the writer's prefix %q is refused", body, body[:n])
			}
		}
	}
	for _, b := range []string{
		`{"a":1}`, "\x00\x00\x00", `{"id":"batch_req_\x00`, `{"id":"batch_req_cut"`, "shopping list",
		`{"id": "batch_req_0123"`, `{"id":"batch_req_0123456789abcdef01234567"}`, `{"id":"batch_req_0123456789ABCDEF01234567"`,
		`{"id":"batch_req_0123456789abcdef01234567","custom_id":"a"` + "\n",
	} {
		if isResultPrefix([]byte(b)) {
			t.Errorf("%q passes as the start of a result line", b)
		}
	}
}

// TestRunBatchFailedStartLeavesOutput starts runs that cannot load their model over
// outputs of every kind: none is changed by a byte, a missing output is not created, and
// a last line this command did not write is refused by its line number before the model
// is tried.
func TestRunBatchFailedStartLeavesOutput(t *testing.T) {
	tmp := t.TempDir()
	noModel := t.TempDir()
	input := filepath.Join(tmp, "in.jsonl")
	writeLines(t, input, completionLine("a", `{"model":"x","prompt":"y"}`), completionLine("b", `{"model":"x","prompt":"z"}`))
	whole := `{"id":"batch_req_kept","custom_id":"a","response":{"status_code":200,"request_id":"r","body":{}},"error":null}`
	for _, tc := range []struct {
		name, content, refused string // refused: the line the error names, "" when the model load is what fails
	}{
		{"one-line JSON", `{"a":1}`, "line 1 "},
		{"NUL bytes", "\x00\x00\x00", "line 1 "},
		{"NULs after a line", whole + "\n\x00\x00", "line 2 "},
		{"pretty JSON", "{\n  \"custom_id\": \"a\"\n}", "line 1 "},
		{"partial result", whole + "\n" + `{"id":"batch_req_0123456789abcdef01234567","custom_id":"b","resp`, ""},
		{"whole result without newline", whole, ""},
		{"blank tail", whole + "\n  ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			output := filepath.Join(t.TempDir(), "out.jsonl")
			if err := os.WriteFile(output, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			o, err := parseBatchFlags([]string{"--model", noModel, "--input", input, "--output", output}, env(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			err = runBatch(context.Background(), o, io.Discard, false)
			switch {
			case err == nil:
				t.Fatal("a run without a model succeeded")
			case strings.Contains(err.Error(), "\n"):
				t.Errorf("error %q is not one line", err)
			case tc.refused != "" && !strings.Contains(err.Error(), "--output "+output+" "+tc.refused+"is not a run-batch result"):
				t.Errorf("error %q: want %q refused", err, tc.refused)
			case tc.refused == "" && strings.Contains(err.Error(), "not a run-batch result"):
				t.Errorf("error %q: a line this command writes was refused", err)
			}
			if got, _ := os.ReadFile(output); string(got) != tc.content {
				t.Errorf("output changed: %q, was %q", got, tc.content)
			}
		})
	}
	output := filepath.Join(tmp, "new.jsonl")
	o, err := parseBatchFlags([]string{"--model", noModel, "--input", input, "--output", output}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := runBatch(context.Background(), o, io.Discard, false); err == nil {
		t.Fatal("a run without a model succeeded")
	}
	if _, err := os.Stat(output); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a failed start left %s behind: %v", output, err)
	}
	o.output = filepath.Join(tmp, "no-dir", "out.jsonl")
	if err := runBatch(context.Background(), o, io.Discard, false); err == nil || !strings.Contains(err.Error(), "--output "+o.output) || strings.Contains(err.Error(), "neither a model") {
		t.Errorf("an output in a missing directory: %v, want it refused before the model loads", err)
	}
}

// TestRunBatchResumeKeepsUnendedLine resumes an output whose last line is a whole result
// without its line ending (an editor's save): the line is kept and counted, ended, and the
// run appends after it.
func TestRunBatchResumeKeepsUnendedLine(t *testing.T) {
	dir := tinyModelDir(t)
	tmp := t.TempDir()
	input, output := filepath.Join(tmp, "in.jsonl"), filepath.Join(tmp, "out.jsonl")
	writeLines(t, input, completionLines(3, "k%d", "keep", 2, false)...)
	kept := `{"id":"batch_req_kept","custom_id":"k1","response":{"status_code":200,"request_id":"r","body":{"kept":true}},"error":null}`
	if err := os.WriteFile(output, []byte(kept), 0o644); err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	if err := runBatch(context.Background(), newBatchOptions(t, dir, input, output), &stderr, false); err != nil {
		t.Fatalf("run-batch: %v\n%s", err, stderr.String())
	}
	data, _ := os.ReadFile(output)
	if !strings.HasPrefix(string(data), kept+"\n") {
		t.Fatalf("the unended line was not kept:\n%s", data)
	}
	got := byCustomID(readBatchOutput(t, output))
	for _, id := range []string{"k0", "k1", "k2"} {
		if len(got[id]) != 1 {
			t.Errorf("%s answered %d times, want once", id, len(got[id]))
		}
	}
}
