package kvcache

import "fmt"

// A prompt shares its cached prefix with an earlier one, forks for n = 2 sampling, and the
// children diverge through copy-on-write.
func ExamplePool() {
	pool, _ := NewPool(PoolConfig{NumBlocks: 16, BlockSizeTokens: 4, EnablePrefixCaching: true})
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}

	// First request: nothing cached. Look up (no side effects), allocate the prompt (this
	// counts the lookup), run the model, commit the computed tokens.
	var hit PrefixHit
	pool.FindPrefix(&hit, prompt, 0)
	cached := hit.NumTokens()
	pool.AllocateSlots(1, &hit, len(prompt)-cached)
	_ = pool.Commit(1, cached, prompt[cached:], 0)
	fmt.Println("first:", cached, "cached tokens, table", pool.BlockTable(1))

	// Second request with the same prompt: two full blocks come from the cache.
	pool.FindPrefix(&hit, prompt, 0)
	cached = hit.NumTokens()
	pool.AllocateSlots(2, &hit, len(prompt)-cached)
	_ = pool.Commit(2, cached, prompt[cached:], 0)
	fmt.Println("second:", cached, "cached tokens, table", pool.BlockTable(2))

	// Fork request 2 and decode one token in the child: its shared partial block is copied.
	_ = pool.Fork(2, 3)
	cow, ok := pool.Allocate(3, 1)
	fmt.Println("child append:", ok, "copy", cow, "table", pool.BlockTable(3))

	pool.Free(1)
	pool.Free(2)
	pool.Free(3)
	st := pool.Stats()
	fmt.Printf("free %d of %d, %d cached, hits %d of %d tokens\n",
		st.FreeBlocks, st.TotalBlocks, st.CachedBlocks, st.PrefixHitsTokens, st.PrefixQueriesTokens)
	// Output:
	// first: 0 cached tokens, table [0 1 2]
	// second: 8 cached tokens, table [0 1 3]
	// child append: true copy [{3 4}] table [0 1 4]
	// free 16 of 16, 2 cached, hits 8 of 20 tokens
}

func ExampleStorage_Gather() {
	pool, _ := NewPool(PoolConfig{NumBlocks: 8, BlockSizeTokens: 2})
	store, _ := NewStorage(StorageConfig{NumBlocks: 8, BlockSizeTokens: 2, Layers: 1, KVHeads: 1, HeadDim: 1, DType: Float32})

	// Prefill 3 tokens of sequence 7: the model's present tensors hold them at columns 0..2.
	pool.Allocate(7, 3)
	present := make([]byte, 3*4)
	Encode(Float32, present, []float32{1, 2, 3})
	tables := [][]BlockID{pool.BlockTable(7)}
	_ = store.Scatter(tables, []int{0}, []int{3}, 3, 0, [][]byte{present}, [][]byte{present})

	// Next step: gather the past into a dense buffer padded to 4 positions.
	past := make([]byte, 4*4)
	_ = store.Gather(tables, []int{3}, 4, [][]byte{past}, [][]byte{make([]byte, 4*4)})
	out := make([]float32, 4)
	Decode(Float32, out, past)
	fmt.Println(out)
	// Output: [1 2 3 0]
}
