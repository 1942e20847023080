package kvcache

// freeQueue is the queue of blocks no sequence holds, in eviction order: blocks are taken
// from the front. It is an intrusive doubly linked list over block indices (the links live
// in two arrays indexed by block id), so a block leaves the middle of the queue in O(1) when
// a prefix-cache hit revives it. Index len(prev)-1 is the sentinel that closes the ring.
type freeQueue struct {
	prev, next []int32
	in         []bool // in[b] reports whether block b is queued
	n          int    // queued blocks
}

func newFreeQueue(numBlocks int) freeQueue {
	q := freeQueue{
		prev: make([]int32, numBlocks+1),
		next: make([]int32, numBlocks+1),
		in:   make([]bool, numBlocks),
	}
	s := q.sentinel()
	q.prev[s], q.next[s] = s, s
	for b := range numBlocks {
		q.pushBack(int32(b))
	}
	return q
}

func (q *freeQueue) sentinel() int32 { return int32(len(q.prev) - 1) }

// insertAfter links b after node at. REQUIRES: b is not queued.
func (q *freeQueue) insertAfter(at, b int32) {
	nx := q.next[at]
	q.prev[b], q.next[b] = at, nx
	q.next[at], q.prev[nx] = b, b
	q.in[b] = true
	q.n++
}

// pushBack queues b last (evicted last). REQUIRES: b is not queued.
func (q *freeQueue) pushBack(b int32) { q.insertAfter(q.prev[q.sentinel()], b) }

// pushFront queues b first (taken next). REQUIRES: b is not queued.
func (q *freeQueue) pushFront(b int32) { q.insertAfter(q.sentinel(), b) }

// remove unlinks b. REQUIRES: b is queued.
func (q *freeQueue) remove(b int32) {
	pv, nx := q.prev[b], q.next[b]
	q.next[pv], q.prev[nx] = nx, pv
	q.prev[b], q.next[b] = -1, -1
	q.in[b] = false
	q.n--
}

// popFront unlinks and returns the first block. REQUIRES: q.n > 0.
func (q *freeQueue) popFront() int32 {
	b := q.next[q.sentinel()]
	q.remove(b)
	return b
}
