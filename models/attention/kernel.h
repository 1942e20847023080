// Paged attention over Conveyor's KV blocks. Go checks every length and block id
// before calling in (kernel.go); this code trusts its arguments.
#ifndef CONVEYOR_ATTENTION_KERNEL_H
#define CONVEYOR_ATTENTION_KERNEL_H

#include <stdint.h>

// Instruction sets, best last. cv_isa returns the best one this CPU runs.
enum { CV_ISA_GENERIC = 0, CV_ISA_AVX2 = 1, CV_ISA_AVX512 = 2 };

// One work item: some consecutive new tokens of one sequence and one KV head, with
// every query head of that KV head's group.
enum {
	CV_ITEM_TABLE = 0, // offset of the sequence's block table in tables
	CV_ITEM_KVHEAD,    // the KV head
	CV_ITEM_POS,       // position of the item's first token
	CV_ITEM_TOKENS,    // tokens in the item
	CV_ITEM_ROW,       // packed row (in qkv and att) of the item's first token
	CV_ITEM_FIELDS
};

// Items with at least CV_TRANSPOSE_ROWS query rows compute scores against key tiles of
// up to CV_KTILE keys transposed in scratch, CV_TILE_ROWS rows at a time at most.
enum { CV_TRANSPOSE_ROWS = 16, CV_KTILE = 64, CV_TILE_ROWS = 4 };

// Arena element types.
enum { CV_F32 = 0, CV_F16 = 1 };

typedef struct {
	int dtype;      // CV_F32 or CV_F16 arenas
	int num_kv_heads, block_size, head_dim, group;
	int window;     // keys at positions <= pos - window are not attended; 0 = none
	float scale;    // multiplies q.k
	float softcap;  // scores = softcap * tanh(scores / softcap); 0 = none
	int qkv_stride; // floats per packed row of qkv (q heads, then k, then v)
	int att_stride; // floats per packed row of att
} cv_params;

int cv_isa(void);

// cv_attend computes items [lo, hi): for each token and query head, softmax(q.K) V
// over the keys it may see, read from the blocks in place, written to att. scratch
// holds rows*(span+head_dim) + head_dim*CV_KTILE + CV_TILE_ROWS*CV_KTILE + block_size*head_dim floats for
// the largest item
// (rows: its query rows; span: the keys it reads).
void cv_attend(int isa, const cv_params *p, const void *karena, const void *varena,
	const int32_t *tables, const int32_t *items, int lo, int hi,
	const float *qkv, float *att, float *scratch);

#endif
