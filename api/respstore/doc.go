// Package respstore keeps the state of the /v1/responses endpoint — stored responses,
// their input items and the conversation a previous_response_id continues — in one
// embedded database file, so that a stored response survives a restart, a crash and
// kill -9, and the file never grows without bound.
//
// # Why bbolt
//
// The store needs durable single-key writes (a response is written when it is created
// in the background, and again when it ends), reads by id, deletes, and an ordered walk
// for retention; it is used by one process. go.etcd.io/bbolt does exactly that and no
// more: a pure-Go B+tree in one memory-mapped file (no cgo, so the server stays one
// static binary apart from ONNX Runtime), copy-on-write pages and a meta page switched
// at commit, and an fsync (fdatasync on Linux) before Update returns, so a committed
// write is on disk and a torn one is never seen. An exclusive file lock keeps a second
// server off the same file. The alternatives were heavier for what they add here:
// SQLite needs cgo (or a large translated driver) and a schema for what is a key-value
// workload; an LSM store (Pebble, Badger) brings compactions and background goroutines
// sized for write volumes far beyond a few responses a second; a hand-written
// append-only log would need its own torn-write recovery and compaction.
//
// # Layout and bounds
//
// Bucket "responses" maps an id to its Record (JSON); bucket "by_time" holds one key per
// record, its creation time (big-endian Unix nanoseconds) followed by its id, so the
// oldest records are the first keys; bucket "meta" keeps the record count. Every Put
// runs retention in the same transaction: records older than Config.MaxAge and, past
// Config.MaxRecords, the oldest ones are deleted. A record larger than
// Config.MaxRecordBytes is refused (ErrTooLarge). bbolt reuses freed pages, so the file
// stays near MaxRecords × the average record size; it does not shrink on its own.
// A record past MaxAge that retention has not deleted yet is not returned by Get.
//
// A Put of a 4 KiB record takes about 2.6 ms on the 2-core development machine
// (BenchmarkPut; two fsyncs per commit dominate it). A stored response costs one Put
// when it ends (a background one three: queued, in progress, ended), small next to
// generating it; so every Put is durable and none is batched.
//
// The store does not interpret a record's Data; it keeps Status so that a restarted
// server can find the responses that were still running (Unfinished) and mark them.
//
// # Example
//
//	st, err := respstore.Open(respstore.Config{Dir: dir, MaxAge: 30 * 24 * time.Hour, MaxRecords: 10000})
//	if err != nil { ... } // e.g. not writable: run without a store
//	defer st.Close()
//	err = st.Put(respstore.Record{ID: "resp_1", Status: "completed", Data: body})
//	r, err := st.Get("resp_1") // respstore.ErrNotFound when unknown, deleted or expired
package respstore
