// Package kvcache is Conveyor's paged KV cache: a block allocator with reference counts and
// automatic prefix caching (Pool), and the block storage that holds the keys and values and
// moves them to and from the model's dense past/present tensors (Storage). It imports no
// package of the project; the engine owns one Pool and one Storage on its step goroutine.
//
// # Blocks and the pool
//
// The cache is a fixed number of blocks of BlockSizeTokens tokens (16 by default), sized at
// start-up from a memory budget with NumBlocksForBudget: one block costs
// 2 * layers * kvHeads * blockSizeTokens * headDim * elementSize bytes (BlockBytes). Each
// sequence has a block table: entry i holds its positions [i*B, (i+1)*B). A sequence reserves
// slots with Allocate(seq, n) before the forward pass that writes them; "does not fit" is the
// value ok=false, with nothing changed, so the scheduler can preempt or wait. CanAllocate
// answers the same question without acting. Free returns a sequence's blocks, tail first,
// and is idempotent. The Pool holds no data and is not safe for concurrent use.
//
// Every block has a reference count: the number of block tables naming it. A block whose
// count is 0 sits in the free-block queue, an intrusive doubly linked list over block ids
// (the links are two int32 arrays, as in vLLM v1's FreeKVCacheBlockQueue), so a block can
// leave the middle of the queue in O(1) when a prefix-cache hit revives it. Fresh blocks are
// taken from the front. A freed block that holds a registered prefix goes to the back, one
// that holds nothing worth keeping to the front; cached blocks are therefore reused in LRU
// order and only when a fresh block is needed, and since a sequence is freed tail first its
// last blocks are evicted before the shared head of its prompt. Eviction drops the block's
// cache entry. Allocation, free and lookup cost tens of nanoseconds per block and do not
// allocate memory in the steady state.
//
// # Layer groups and sliding windows
//
// A model whose layers attend over sliding windows of the past (Mistral, Phi-3, Gemma 2
// and 3, Qwen with use_sliding_window) need not keep those layers' whole past. PlanLayout
// puts the layers into groups of equal size, each of one kind (full attention, or one
// window); PoolConfig.Windows gives the pool the groups and StorageConfig.LayerGroups the
// storage. A sequence then has one block table per group, every group drawing its blocks
// from the one pool, and a block holds its group's layers (the layers in the same place of
// every group share an arena). Commit gives back a window group's blocks that no later
// query reads (a query at position p reads p-W+1..p): their entries become NoBlock and the
// blocks, still registered, join the free queue. FindPrefix finds, for a hit of k blocks,
// every full group's first k blocks and of each window group only those the first new
// position reads, found by their chained key (their parents may be gone). SeqBlocks and
// MaxSeqTokens say how much one sequence holds at most. (vLLM's hybrid KV cache manager
// does the same with equal-size groups.)
//
// # Fork and copy-on-write
//
// Fork(parent, child) gives child the parent's whole table, counts up, for n > 1 sampling
// and shared prompts. Full blocks are never written again, so sharing them is free. A
// shared partial last block is copied on the next Allocate of either sequence that writes
// into it: Allocate takes a fresh block, swaps it into that sequence's table and returns a
// CopyOp{Src, Dst}; the caller applies it with Storage.CopyBlock (or ApplyCopies) before
// scattering the new tokens. After copy-on-write no block that another sequence can read is
// ever written.
//
// # Automatic prefix caching
//
// When EnablePrefixCaching is set, Commit(seq, from, tokens, extraKey) records the token ids
// of computed positions; each block that becomes full is registered under a chained key,
// hash(parent key, block token ids, extraKey), where extraKey separates caches that must not
// mix (an adapter, say). The sequence keeps its running parent key and the tokens of its
// current partial block, so decode steps commit one token at a time. If an identical block
// is already registered, that registration is kept and the chain continues through it;
// partial blocks are never registered, so never shared through the cache.
//
// Admission is split in two, as vLLM v1 splits get_computed_blocks from allocate_slots.
// FindPrefix(hit, prompt, extraKey) walks the prompt block by block and records the longest
// run of registered blocks in a PrefixHit; it only looks (no reference count, free-queue
// position or counter changes), so a sequence that is not admitted leaves nothing to undo. It
// never covers the whole prompt: at most len(prompt)-1 tokens rounded down to a block multiple
// are cached, so the model computes at least the last token and has logits to sample from.
// AllocateSlots(seq, hit, n) then admits the sequence all or nothing: it attaches the hit's
// blocks (count up, off the free queue if they were free, which costs a free block each like
// a fresh one) and grows the sequence by n tokens, or changes nothing when that does not fit.
// Queries and hits are counted in tokens (Stats) there, once per hit, so a prompt that waits
// for blocks is counted when it is admitted, not at every attempt. AllocateSlots returns the
// sequence's block table, so its caller can hand it on without asking again (with a nil hit
// it is Allocate that also returns the table).
//
// Keys only find candidates; a 64-bit collision must never hand one prompt another's keys
// and values. So every registered block stores its token ids, its extra key, and the
// registration id of its parent block (registration ids are unique and never reused), and a
// candidate is attached only if all three match what the walk expects. By induction a hit of
// n blocks means the whole n-block prefix is identical, whatever the hash does. When a key is
// taken by a block that does not verify (a collision, or a stale child whose parent was
// evicted and registered anew), the newer block replaces it.
//
// CheckInvariants recomputes reference counts from the tables and checks the free queue, the
// counters and the cache index; a broken invariant is an error wrapping ErrCorrupt. Tests
// run it after every step of randomized operation sequences (and under go test -fuzz).
//
// # Storage and gather/scatter
//
// Storage keeps, per layer, a K arena and a V arena of float32 or float16 elements laid out
// [block][kvHead][blockSizeTokens][headDim]: one (block, kv head) pair is one contiguous run
// of blockSizeTokens*headDim values, and one block of one layer is one contiguous run, so
// CopyBlock is two copies per layer (StorageConfig.TokenMajor lays a block out
// [blockSizeTokens][kvHead][headDim] instead, the step graph's PagedAttention layout). LayerK
// and LayerV hand the arenas themselves to an attention kernel that reads and writes blocks
// in place (the step graph's); the arenas are one anonymous mapping with transparent huge pages requested, since such a
// kernel reads one short run per block from anywhere in the arena. Gather fills the model's dense past tensors
// [batch, kvHeads, maxPast, headDim] (one buffer per layer for K and V, reused across steps):
// for each row, head and block it is a single copy of up to blockSizeTokens*headDim values,
// and only the positions from the row's past length to maxPast are zeroed. Scatter writes the
// new tokens from the dense present tensors back into the rows' blocks. Both validate their
// arguments (a bad call returns an error wrapping ErrInvalid and touches nothing), allocate no
// buffers, and split work over layer x row units across goroutines when a call moves more
// than 256 KiB, waiting for all of them before returning (one small closure allocation per
// extra goroutine). On the reference machine the gather of batch 32 x past 512 runs at the
// bandwidth of a plain copy of the same bytes. Encode, Decode, Float32ToFloat16 and
// Float16ToFloat32 convert between float32 values and arena bytes.
//
// # Example
//
// One engine step for a new request, in outline:
//
//	var hit PrefixHit
//	pool.FindPrefix(&hit, prompt, 0) // no side effects
//	cached := hit.NumTokens()
//	table, cow, ok := pool.AllocateSlots(seq, &hit, len(prompt)-cached)
//	if !ok {
//		return // does not fit, nothing changed: wait or preempt
//	}
//	_ = store.ApplyCopies(cow)
//	tables := [][]BlockID{table}
//	_ = store.Gather(tables, []int{cached}, cached, pastK, pastV)
//	// ... run the model on prompt[cached:], get presentK, presentV with the new tokens at
//	// columns [cached, len(prompt)) ...
//	_ = store.Scatter(tables, []int{cached}, []int{len(prompt) - cached}, len(prompt), cached, presentK, presentV)
//	_ = pool.Commit(seq, cached, prompt[cached:], 0)
package kvcache
