package main

import (
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/conveyor-llm/conveyor/api/responses"
	"github.com/conveyor-llm/conveyor/api/respstore"
)

// responsesFlags defines serve's /v1/responses flags.
func responsesFlags(fs *flag.FlagSet, o *serveOptions) {
	fs.StringVar(&o.dataDir, "data-dir", "auto", "directory of the stored /v1/responses database (responses.db); auto = $XDG_STATE_HOME/conveyor, else ~/.local/state/conveyor; empty = keep nothing (store:true is then refused)")
	fs.StringVar(&o.responsesRetention, "responses-retention", "720h,10000", "how long and how many stored responses are kept: a duration, a count, or both comma-separated (\"168h\", \"5000\", \"30d,10000\"); 0 = no limit of that kind")
}

// defaultDataDir is the user's state directory for conveyor: $XDG_STATE_HOME/conveyor,
// else $HOME/.local/state/conveyor; "" when neither is set.
func defaultDataDir(getenv func(string) string) string {
	if d := getenv("XDG_STATE_HOME"); d != "" && filepath.IsAbs(d) {
		return filepath.Join(d, "conveyor")
	}
	if h := getenv("HOME"); h != "" {
		return filepath.Join(h, ".local", "state", "conveyor")
	}
	return ""
}

// parseRetention reads --responses-retention: a duration (Go syntax, or whole days as
// "30d"), a record count, or both separated by a comma.
func parseRetention(s string) (maxAge time.Duration, maxRecords int, err error) {
	seenAge, seenCount := false, false
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if n, err := strconv.Atoi(part); err == nil {
			if n < 0 || seenCount {
				return 0, 0, fmt.Errorf("--responses-retention %q: one count >= 0", s)
			}
			maxRecords, seenCount = n, true
			continue
		}
		var d time.Duration
		if days, ok := strings.CutSuffix(part, "d"); ok {
			n, err := strconv.Atoi(days)
			if err != nil {
				return 0, 0, fmt.Errorf("--responses-retention %q: %q is not a duration", s, part)
			}
			d = time.Duration(n) * 24 * time.Hour
		} else if d, err = time.ParseDuration(part); err != nil {
			return 0, 0, fmt.Errorf("--responses-retention %q: %q is neither a duration nor a count", s, part)
		}
		if d < 0 || seenAge {
			return 0, 0, fmt.Errorf("--responses-retention %q: one duration >= 0", s)
		}
		maxAge, seenAge = d, true
	}
	return maxAge, maxRecords, nil
}

// openResponseStore opens the response store the flags ask for. A store that cannot be
// opened (no data dir, not writable, locked by another server) is not an error: the
// server runs without it, says so here, and refuses store:true with a 400 giving the
// reason. A malformed --responses-retention is an error.
func (o *serveOptions) openResponseStore(log *slog.Logger, getenv func(string) string) (responses.Config, func(), error) {
	maxAge, maxRecords, err := parseRetention(o.responsesRetention)
	if err != nil {
		return responses.Config{}, func() {}, fmt.Errorf("%s: %w", o.name(), err)
	}
	dir := o.dataDir
	if dir == "auto" {
		dir = defaultDataDir(getenv)
	}
	unavailable := func(reason string) (responses.Config, func(), error) {
		log.Warn("responses: no response store; /v1/responses refuses store:true (send store:false)", "reason", reason)
		return responses.Config{Unavailable: reason}, func() {}, nil
	}
	if dir == "" {
		return unavailable("no --data-dir was given")
	}
	cfg := respstore.DefaultConfig(dir)
	cfg.MaxAge, cfg.MaxRecords = maxAge, maxRecords
	st, err := respstore.Open(cfg)
	if err != nil {
		return unavailable(strings.TrimPrefix(err.Error(), "respstore: "))
	}
	log.Info("responses: store open", "path", st.Path(), "max_age", maxAge, "max_records", maxRecords)
	return responses.Config{Store: st}, func() {
		if err := st.Close(); err != nil {
			log.Error("responses: closing the store", "err", err)
		}
	}, nil
}
