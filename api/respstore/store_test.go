package respstore

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func open(t *testing.T, dir string, mod func(*Config)) *Store {
	t.Helper()
	cfg := DefaultConfig(dir)
	if mod != nil {
		mod(&cfg)
	}
	s, err := Open(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestPutGetDelete(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	if _, err := s.Get("resp_x"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get of an unknown id: %v", err)
	}
	if err := s.Put(Record{ID: "resp_1", Status: "in_progress", Data: []byte(`{"a":1}`)}); err != nil {
		t.Fatal(err)
	}
	r, err := s.Get("resp_1")
	if err != nil || r.Status != "in_progress" || string(r.Data) != `{"a":1}` || r.Created.IsZero() {
		t.Fatalf("Get = %+v, %v", r, err)
	}
	created := r.Created
	if err := s.Put(Record{ID: "resp_1", Status: "completed", Data: []byte(`{"a":2}`)}); err != nil {
		t.Fatal(err)
	}
	r, _ = s.Get("resp_1")
	if r.Status != "completed" || string(r.Data) != `{"a":2}` || !r.Created.Equal(created) || s.Len() != 1 {
		t.Fatalf("after replace: %+v, len %d", r, s.Len())
	}
	if err := s.Delete("resp_1"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete("resp_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: %v", err)
	}
	if _, err := s.Get("resp_1"); !errors.Is(err, ErrNotFound) || s.Len() != 0 {
		t.Fatalf("Get after Delete: %v, len %d", err, s.Len())
	}
}

func TestRetentionByCountAndAge(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_000_000, 0)}
	s := open(t, t.TempDir(), func(c *Config) { c.MaxRecords = 3; c.MaxAge = time.Hour; c.now = clk.now })
	for i := range 5 {
		clk.t = clk.t.Add(time.Minute)
		if err := s.Put(Record{ID: fmt.Sprint("r", i), Status: "completed"}); err != nil {
			t.Fatal(err)
		}
	}
	if s.Len() != 3 {
		t.Fatalf("len %d, want 3", s.Len())
	}
	for i := range 5 {
		_, err := s.Get(fmt.Sprint("r", i))
		if (i < 2) != errors.Is(err, ErrNotFound) {
			t.Fatalf("r%d: %v", i, err)
		}
	}
	// r2 and r3 were created at +3 and +4 minutes: past an hour they are no longer
	// returned, and the next Put deletes them.
	clk.t = time.Unix(1_000_000, 0).Add(4*time.Minute + time.Hour + 30*time.Second)
	if _, err := s.Get("r2"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("expired r2: %v", err)
	}
	if _, err := s.Get("r4"); err != nil {
		t.Fatalf("r4: %v", err)
	}
	if err := s.Put(Record{ID: "r5", Status: "completed"}); err != nil {
		t.Fatal(err)
	}
	if s.Len() != 2 {
		t.Fatalf("len %d after age retention, want 2 (r4, r5)", s.Len())
	}
}

func TestTooLarge(t *testing.T) {
	s := open(t, t.TempDir(), func(c *Config) { c.MaxRecordBytes = 100 })
	err := s.Put(Record{ID: "big", Data: []byte(`"` + strings.Repeat("x", 200) + `"`)})
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("Put: %v", err)
	}
	if _, err := s.Get("big"); !errors.Is(err, ErrNotFound) || s.Len() != 0 {
		t.Fatalf("a refused record was kept: %v", err)
	}
}

func TestSecondOpenIsRefused(t *testing.T) {
	dir := t.TempDir()
	open(t, dir, nil)
	cfg := DefaultConfig(dir)
	cfg.LockTimeout = 50 * time.Millisecond
	if s, err := Open(cfg); err == nil {
		s.Close()
		t.Fatal("a second Open of a locked file succeeded")
	}
}

func TestUnfinished(t *testing.T) {
	s := open(t, t.TempDir(), nil)
	for i, st := range []string{"queued", "completed", "in_progress", "failed"} {
		if err := s.Put(Record{ID: fmt.Sprint("r", i), Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	rs, err := s.Unfinished("queued", "in_progress")
	if err != nil || len(rs) != 2 || rs[0].ID != "r0" || rs[1].ID != "r2" {
		t.Fatalf("Unfinished = %+v, %v", rs, err)
	}
}

// TestSurvivesKill stores a record in a child process, SIGKILLs it without closing the
// database, and reads the record back.
func TestSurvivesKill(t *testing.T) {
	if dir := os.Getenv("RESPSTORE_CHILD_DIR"); dir != "" {
		s, err := Open(DefaultConfig(dir))
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		if err := s.Put(Record{ID: "resp_kill", Status: "completed", Data: []byte(`{"ok":true}`)}); err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Println("stored")
		time.Sleep(time.Minute) // killed here
		return
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSurvivesKill$")
	cmd.Env = append(os.Environ(), "RESPSTORE_CHILD_DIR="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "stored" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("child: %q", line)
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	s := open(t, dir, nil)
	r, err := s.Get("resp_kill")
	if err != nil || string(r.Data) != `{"ok":true}` {
		t.Fatalf("after kill -9: %+v, %v", r, err)
	}
}

// BenchmarkPut measures one durable write of a 4 KiB record (a short conversation), fsync
// included, with retention at its default.
func BenchmarkPut(b *testing.B) {
	s, err := Open(DefaultConfig(b.TempDir()))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	data := []byte(`"` + strings.Repeat("x", 4096) + `"`)
	b.ResetTimer()
	for i := range b.N {
		if err := s.Put(Record{ID: fmt.Sprint("resp_", i), Status: "completed", Data: data}); err != nil {
			b.Fatal(err)
		}
	}
}
