package respstore

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// Errors of the store.
var (
	// ErrNotFound is returned for an id that was never stored, was deleted or expired.
	ErrNotFound = errors.New("respstore: not found")
	// ErrTooLarge is returned by Put for a record over Config.MaxRecordBytes.
	ErrTooLarge = errors.New("respstore: record too large")
)

// FileName is the database's file name inside Config.Dir.
const FileName = "responses.db"

// Config configures a Store. Start from DefaultConfig.
type Config struct {
	// Dir is the directory holding the database file; it is created when missing.
	Dir string
	// MaxAge deletes records created longer ago than this; 0 keeps them regardless of age.
	MaxAge time.Duration
	// MaxRecords deletes the oldest records past this many; 0 means no limit by count.
	MaxRecords int
	// MaxRecordBytes refuses a larger record (its JSON encoding) with ErrTooLarge.
	MaxRecordBytes int
	// LockTimeout is how long Open waits for another process's lock on the file.
	LockTimeout time.Duration
	// now is the clock; nil means time.Now.
	now func() time.Time
}

// DefaultConfig returns a configuration for dir: 30 days, 10,000 records, 8 MiB a record.
func DefaultConfig(dir string) Config {
	return Config{Dir: dir, MaxAge: 30 * 24 * time.Hour, MaxRecords: 10000, MaxRecordBytes: 8 << 20, LockTimeout: time.Second}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Dir == "":
		return errors.New("respstore: Dir must not be empty")
	case c.MaxAge < 0:
		return fmt.Errorf("respstore: MaxAge must be >= 0, got %v", c.MaxAge)
	case c.MaxRecords < 0:
		return fmt.Errorf("respstore: MaxRecords must be >= 0, got %d", c.MaxRecords)
	case c.MaxRecordBytes <= 0:
		return fmt.Errorf("respstore: MaxRecordBytes must be > 0, got %d", c.MaxRecordBytes)
	}
	return nil
}

// Record is one stored response. Data is the caller's, stored as is.
type Record struct {
	ID string `json:"id"`
	// Created is when the record was first stored; Put keeps the first value for an id.
	Created time.Time `json:"created"`
	// Status is the response's status, for Unfinished.
	Status string          `json:"status"`
	Data   json.RawMessage `json:"data"`
}

// Store is an open response database. Its methods are safe for concurrent use.
type Store struct {
	db  *bolt.DB
	cfg Config
}

var (
	bucketResponses = []byte("responses")
	bucketByTime    = []byte("by_time")
	bucketMeta      = []byte("meta")
	keyCount        = []byte("count")
)

// Open opens (creating when missing) the database in cfg.Dir.
func Open(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.now == nil {
		cfg.now = time.Now
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("respstore: %w", err)
	}
	path := filepath.Join(cfg.Dir, FileName)
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: cfg.LockTimeout})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("respstore: %s is locked by another process", path)
		}
		return nil, fmt.Errorf("respstore: open %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketResponses, bucketByTime, bucketMeta} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("respstore: open %s: %w", path, err)
	}
	return &Store{db: db, cfg: cfg}, nil
}

// MaxRecordBytes is the largest record Put accepts, in bytes of its JSON encoding.
func (s *Store) MaxRecordBytes() int { return s.cfg.MaxRecordBytes }

// Path is the database file's path.
func (s *Store) Path() string { return s.db.Path() }

// Close closes the database. Every committed Put is already on disk.
func (s *Store) Close() error { return s.db.Close() }

// timeKey is a by_time key: created (big-endian Unix nanoseconds) then the id.
func timeKey(created time.Time, id string) []byte {
	k := make([]byte, 8, 8+len(id))
	binary.BigEndian.PutUint64(k, uint64(created.UnixNano()))
	return append(k, id...)
}

// Put stores r, replacing the record with its id (whose creation time it keeps), then
// applies retention; the write is on disk when it returns.
func (s *Store) Put(r Record) error {
	if r.ID == "" {
		return errors.New("respstore: empty id")
	}
	return s.db.Update(func(tx *bolt.Tx) error {
		resp, idx, meta := tx.Bucket(bucketResponses), tx.Bucket(bucketByTime), tx.Bucket(bucketMeta)
		count := getCount(meta)
		if old := resp.Get([]byte(r.ID)); old != nil {
			var o Record
			if err := json.Unmarshal(old, &o); err == nil {
				r.Created = o.Created
			}
		} else {
			if r.Created.IsZero() {
				r.Created = s.cfg.now()
			}
			if err := idx.Put(timeKey(r.Created, r.ID), nil); err != nil {
				return err
			}
			count++
		}
		b, err := json.Marshal(r)
		if err != nil {
			return err
		}
		if len(b) > s.cfg.MaxRecordBytes {
			return fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooLarge, len(b), s.cfg.MaxRecordBytes)
		}
		if err := resp.Put([]byte(r.ID), b); err != nil {
			return err
		}
		return s.retainLocked(tx, count, r.ID)
	})
}

// retainLocked deletes expired records and the oldest ones past MaxRecords (never keep,
// the record just written), then saves the count. REQUIRES: a write transaction.
func (s *Store) retainLocked(tx *bolt.Tx, count uint64, keep string) error {
	resp, idx, meta := tx.Bucket(bucketResponses), tx.Bucket(bucketByTime), tx.Bucket(bucketMeta)
	cutoff := int64(-1 << 63)
	if s.cfg.MaxAge > 0 {
		cutoff = s.cfg.now().Add(-s.cfg.MaxAge).UnixNano()
	}
	// Keys are collected first: deleting under a cursor while it walks skips keys.
	var doomed [][]byte
	c := idx.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		over := s.cfg.MaxRecords > 0 && count-uint64(len(doomed)) > uint64(s.cfg.MaxRecords)
		old := int64(binary.BigEndian.Uint64(k[:8])) < cutoff
		if !over && !old {
			break
		}
		if string(k[8:]) != keep {
			doomed = append(doomed, append([]byte(nil), k...))
		}
	}
	for _, k := range doomed {
		if err := idx.Delete(k); err != nil {
			return err
		}
		if err := resp.Delete(k[8:]); err != nil {
			return err
		}
		count--
	}
	return putCount(meta, count)
}

func getCount(meta *bolt.Bucket) uint64 {
	if v := meta.Get(keyCount); len(v) == 8 {
		return binary.BigEndian.Uint64(v)
	}
	return 0
}

func putCount(meta *bolt.Bucket, n uint64) error {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], n)
	return meta.Put(keyCount, v[:])
}

// Get returns the record with id, or ErrNotFound (also for a record past MaxAge).
func (s *Store) Get(id string) (Record, error) {
	var r Record
	err := s.db.View(func(tx *bolt.Tx) error {
		v := tx.Bucket(bucketResponses).Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		return json.Unmarshal(v, &r)
	})
	if err != nil {
		return Record{}, err
	}
	if s.cfg.MaxAge > 0 && s.cfg.now().Sub(r.Created) > s.cfg.MaxAge {
		return Record{}, ErrNotFound
	}
	return r, nil
}

// Delete deletes the record with id, or returns ErrNotFound.
func (s *Store) Delete(id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		resp, idx, meta := tx.Bucket(bucketResponses), tx.Bucket(bucketByTime), tx.Bucket(bucketMeta)
		v := resp.Get([]byte(id))
		if v == nil {
			return ErrNotFound
		}
		var r Record
		if err := json.Unmarshal(v, &r); err != nil {
			return err
		}
		if err := idx.Delete(timeKey(r.Created, id)); err != nil {
			return err
		}
		if err := resp.Delete([]byte(id)); err != nil {
			return err
		}
		return putCount(meta, getCount(meta)-1)
	})
}

// Len returns the number of records (expired ones not yet deleted included).
func (s *Store) Len() int {
	var n uint64
	_ = s.db.View(func(tx *bolt.Tx) error {
		n = getCount(tx.Bucket(bucketMeta))
		return nil
	})
	return int(n)
}

// Unfinished returns the records whose Status is one of statuses, oldest first.
func (s *Store) Unfinished(statuses ...string) ([]Record, error) {
	want := map[string]bool{}
	for _, st := range statuses {
		want[st] = true
	}
	var out []Record
	err := s.db.View(func(tx *bolt.Tx) error {
		resp := tx.Bucket(bucketResponses)
		return tx.Bucket(bucketByTime).ForEach(func(k, _ []byte) error {
			v := resp.Get(k[8:])
			if v == nil {
				return nil
			}
			var r Record
			if err := json.Unmarshal(v, &r); err != nil {
				return err
			}
			if want[r.Status] {
				out = append(out, r)
			}
			return nil
		})
	})
	return out, err
}
