// gen_fixtures.c writes the reference fixtures of package gguf with ggml itself, so that the Go
// reader and decoders are checked against the C implementation that llama.cpp runs:
//
//   testdata/dequant/<type>.raw  blocks of one tensor type, as stored in a GGUF file
//   testdata/dequant/<type>.f32  the float32 values ggml's to_float (dequantize_row_*) gives for them
//   testdata/ggml.gguf           a GGUF v3 file written by ggml's gguf writer: metadata of every
//                                value type ggml writes and one tensor per supported type, holding
//                                the blocks of the .raw files
//
// Each .raw file holds blocks quantized by ggml_quantize_chunk from a deterministic signal,
// followed by blocks of pseudo-random bytes (with finite fp16 scales) that reach every bit
// pattern of the quants; F16 has ±0, subnormals and ±Inf among its values (no NaN: ggml's
// conversion quiets a signaling NaN on x86, which is not a property of the format).
//
// Built and run against ggml (github.com/ggml-org/ggml at d99724f2, built with
// cmake -DGGML_NATIVE=OFF, so that no fused multiply-add changes the reference's rounding):
//
//   gcc -O2 -I$GGML/include gen_fixtures.c -L$GGML/build/src -lggml-base -lggml -lm -o gen_fixtures
//   LD_LIBRARY_PATH=$GGML/build/src ./gen_fixtures models/gguf/testdata
#include "ggml.h"
#include "gguf.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static uint64_t next_rand(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

// random_half returns a finite fp16 bit pattern with an exponent field in [0, 20], so that
// scales range from subnormals to about 32.
static uint16_t random_half(void) {
    uint64_t r = next_rand();
    uint16_t sign = (uint16_t)((r >> 40) & 1);
    uint16_t exp = (uint16_t)((r >> 20) % 21);
    uint16_t mant = (uint16_t)(r & 0x3FF);
    return (uint16_t)((sign << 15) | (exp << 10) | mant);
}

static void put_half(uint8_t *p, uint16_t h) {
    p[0] = (uint8_t)(h & 0xFF);
    p[1] = (uint8_t)(h >> 8);
}

static void write_file(const char *dir, const char *name, const char *ext, const void *data, size_t n) {
    char path[1024];
    snprintf(path, sizeof(path), "%s/dequant/%s.%s", dir, name, ext);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(1);
    }
}

struct fixture {
    const char *name;      // file and tensor name
    enum ggml_type type;
    int quantized_blocks;  // blocks made by ggml_quantize_chunk
    int random_blocks;     // blocks of random bytes
    int scale_offsets[2];  // byte offsets of fp16 scales to make finite in random blocks (-1: none)
    int64_t ne[4];         // tensor shape in the GGUF file
    int n_dims;
};

// signal returns the deterministic input of quantized block b: a sine of a block-dependent
// amplitude over an offset, so that blocks differ in scale and the minimum-carrying types
// (Q4_1, Q5_1, K-quants) have a nonzero minimum.
static float signal(int b, int i) {
    const float amp[4] = {0.02f, 1.5f, 7.0f, 0.3f};
    const float off[4] = {0.0f, 0.4f, -2.0f, 0.05f};
    return amp[b % 4] * sinf(0.61f * (float)i + (float)b) + off[b % 4] + 0.001f * (float)(i % 7);
}

static void make_fixture(const char *dir, struct gguf_context *gctx, struct ggml_context *tctx, const struct fixture *fx) {
    const struct ggml_type_traits *tt = ggml_get_type_traits(fx->type);
    const int64_t blck = tt->blck_size;
    const size_t tsize = tt->type_size;
    const int nblocks = fx->quantized_blocks + fx->random_blocks;
    const int64_t n = (int64_t)nblocks * blck;

    uint8_t *raw = calloc((size_t)nblocks, tsize);
    float *src = malloc(sizeof(float) * (size_t)(fx->quantized_blocks * blck));
    for (int b = 0; b < fx->quantized_blocks; b++) {
        for (int64_t i = 0; i < blck; i++) {
            src[b * blck + i] = signal(b, (int)i);
        }
    }
    if (fx->type == GGML_TYPE_F32 || fx->type == GGML_TYPE_F16 || fx->type == GGML_TYPE_BF16) {
        // Plain float types: the "quantized" part is the signal converted, the rest special values
        // and random bit patterns.
        for (int64_t i = 0; i < fx->quantized_blocks * blck; i++) {
            if (fx->type == GGML_TYPE_F32) {
                memcpy(raw + i * 4, &src[i], 4);
            } else if (fx->type == GGML_TYPE_F16) {
                ggml_fp16_t h = ggml_fp32_to_fp16(src[i]);
                memcpy(raw + i * 2, &h, 2);
            } else {
                ggml_bf16_t h = ggml_fp32_to_bf16(src[i]);
                memcpy(raw + i * 2, &h, 2);
            }
        }
        for (int64_t i = fx->quantized_blocks * blck; i < n; i++) {
            uint64_t r = next_rand();
            if (fx->type == GGML_TYPE_F32) {
                uint32_t bits = (uint32_t)r;
                memcpy(raw + i * 4, &bits, 4);
            } else {
                uint16_t bits = (uint16_t)r;
                if (fx->type == GGML_TYPE_F16 && (bits & 0x7C00) == 0x7C00 && (bits & 0x3FF) != 0) {
                    bits &= 0xFC00; // a NaN becomes an infinity
                }
                memcpy(raw + i * 2, &bits, 2);
            }
        }
        if (fx->type == GGML_TYPE_F16) {
            // ±0, the smallest and largest subnormals, the smallest normal, the largest finite, ±Inf.
            const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x83FF, 0x0400, 0x7BFF, 0x7C00, 0xFC00};
            int64_t at = fx->quantized_blocks * blck;
            for (size_t k = 0; k < sizeof(special) / sizeof(special[0]); k++) {
                memcpy(raw + (at + (int64_t)k) * 2, &special[k], 2);
            }
        }
    } else {
        ggml_quantize_chunk(fx->type, src, raw, 0, fx->quantized_blocks, blck, NULL);
        for (int b = fx->quantized_blocks; b < nblocks; b++) {
            uint8_t *blk = raw + (size_t)b * tsize;
            for (size_t i = 0; i < tsize; i++) {
                blk[i] = (uint8_t)next_rand();
            }
            for (int k = 0; k < 2; k++) {
                if (fx->scale_offsets[k] >= 0) {
                    put_half(blk + fx->scale_offsets[k], random_half());
                }
            }
        }
    }

    float *want = malloc(sizeof(float) * (size_t)n);
    if (fx->type == GGML_TYPE_F32) {
        memcpy(want, raw, sizeof(float) * (size_t)n); // ggml has no to_float for F32: it is the identity
    } else {
        tt->to_float(raw, want, n);
    }
    write_file(dir, fx->name, "raw", raw, (size_t)nblocks * tsize);
    write_file(dir, fx->name, "f32", want, sizeof(float) * (size_t)n);

    struct ggml_tensor *t = ggml_new_tensor(tctx, fx->type, fx->n_dims, fx->ne);
    if (ggml_nbytes(t) != (size_t)nblocks * tsize) {
        fprintf(stderr, "%s: shape does not match %d blocks\n", fx->name, nblocks);
        exit(1);
    }
    memcpy(t->data, raw, ggml_nbytes(t));
    ggml_set_name(t, fx->name);
    gguf_add_tensor(gctx, t);

    free(raw);
    free(src);
    free(want);
}

static void set_metadata(struct gguf_context *g) {
    gguf_set_val_str(g, "general.architecture", "llama");
    // ggml's writer lays tensors out with its context's alignment, which is 32 and is not
    // changed by setting general.alignment (only reading a file sets it), so the key may
    // only state 32 here: with any other value ggml itself refuses the file it wrote.
    gguf_set_val_u32(g, "general.alignment", 32);
    gguf_set_val_u32(g, "llama.context_length", 4096);
    gguf_set_val_f32(g, "llama.rope.freq_base", 10000.0f);

    gguf_set_val_u8(g, "test.u8", 200);
    gguf_set_val_i8(g, "test.i8", -100);
    gguf_set_val_u16(g, "test.u16", 60000);
    gguf_set_val_i16(g, "test.i16", -30000);
    gguf_set_val_u32(g, "test.u32", 4000000000u);
    gguf_set_val_i32(g, "test.i32", -2000000000);
    gguf_set_val_f32(g, "test.f32", 0.1f);
    gguf_set_val_bool(g, "test.bool", true);
    gguf_set_val_str(g, "test.str", "h\xc3\xa9llo w\xc3\xb6rld");
    gguf_set_val_u64(g, "test.u64", 9223372036854775813ull);
    gguf_set_val_i64(g, "test.i64", -4611686018427387904ll);
    gguf_set_val_f64(g, "test.f64", 3.141592653589793);

    const uint8_t u8s[] = {1, 2, 255};
    const int8_t i8s[] = {-128, 0, 127};
    const uint16_t u16s[] = {0, 65535};
    const int16_t i16s[] = {-32768, 32767};
    const uint32_t u32s[] = {7, 4294967295u};
    const int32_t i32s[] = {-1, 0, 7};
    const float f32s[] = {0.5f, -1.25f};
    const bool bools[] = {true, false, true};
    const uint64_t u64s[] = {18446744073709551615ull};
    const int64_t i64s[] = {-9223372036854775807ll - 1, 5};
    const double f64s[] = {1e-300, -2.5};
    gguf_set_arr_data(g, "test.arr.u8", GGUF_TYPE_UINT8, u8s, 3);
    gguf_set_arr_data(g, "test.arr.i8", GGUF_TYPE_INT8, i8s, 3);
    gguf_set_arr_data(g, "test.arr.u16", GGUF_TYPE_UINT16, u16s, 2);
    gguf_set_arr_data(g, "test.arr.i16", GGUF_TYPE_INT16, i16s, 2);
    gguf_set_arr_data(g, "test.arr.u32", GGUF_TYPE_UINT32, u32s, 2);
    gguf_set_arr_data(g, "test.arr.i32", GGUF_TYPE_INT32, i32s, 3);
    gguf_set_arr_data(g, "test.arr.f32", GGUF_TYPE_FLOAT32, f32s, 2);
    gguf_set_arr_data(g, "test.arr.bool", GGUF_TYPE_BOOL, bools, 3);
    gguf_set_arr_data(g, "test.arr.u64", GGUF_TYPE_UINT64, u64s, 1);
    gguf_set_arr_data(g, "test.arr.i64", GGUF_TYPE_INT64, i64s, 2);
    gguf_set_arr_data(g, "test.arr.f64", GGUF_TYPE_FLOAT64, f64s, 2);
    gguf_set_arr_data(g, "test.arr.empty", GGUF_TYPE_INT32, i32s, 0);

    const char *tokens[] = {"<s>", "</s>", "\xe2\x96\x81the", ""};
    const float scores[] = {0.0f, 0.0f, -1.5f, -3.25f};
    const int32_t types[] = {3, 3, 1, 5};
    const char *merges[] = {"\xe2\x96\x81 t", "h e"};
    gguf_set_val_str(g, "tokenizer.ggml.model", "llama");
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", tokens, 4);
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores, 4);
    gguf_set_arr_data(g, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, 4);
    gguf_set_arr_str(g, "tokenizer.ggml.merges", merges, 2);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: gen_fixtures TESTDATA_DIR\n");
        return 2;
    }
    const char *dir = argv[1];

    const struct fixture fixtures[] = {
        {"f32", GGML_TYPE_F32, 64, 32, {-1, -1}, {8, 4, 3, 1}, 3},
        {"f16", GGML_TYPE_F16, 64, 32, {-1, -1}, {16, 6, 1, 1}, 2},
        {"bf16", GGML_TYPE_BF16, 64, 32, {-1, -1}, {96, 1, 1, 1}, 1},
        {"q4_0", GGML_TYPE_Q4_0, 4, 4, {0, -1}, {64, 4, 1, 1}, 2},
        {"q4_1", GGML_TYPE_Q4_1, 4, 4, {0, 2}, {64, 4, 1, 1}, 2},
        {"q5_0", GGML_TYPE_Q5_0, 4, 4, {0, -1}, {64, 4, 1, 1}, 2},
        {"q5_1", GGML_TYPE_Q5_1, 4, 4, {0, 2}, {64, 4, 1, 1}, 2},
        {"q8_0", GGML_TYPE_Q8_0, 4, 4, {0, -1}, {64, 4, 1, 1}, 2},
        {"q4_k", GGML_TYPE_Q4_K, 2, 2, {0, 2}, {512, 2, 1, 1}, 2},
        {"q5_k", GGML_TYPE_Q5_K, 2, 2, {0, 2}, {512, 2, 1, 1}, 2},
        {"q6_k", GGML_TYPE_Q6_K, 2, 2, {208, -1}, {256, 4, 1, 1}, 2},
    };
    const int nfix = (int)(sizeof(fixtures) / sizeof(fixtures[0]));

    struct ggml_init_params params = {
        /*.mem_size   =*/ 16 * 1024 * 1024,
        /*.mem_buffer =*/ NULL,
        /*.no_alloc   =*/ false,
    };
    struct ggml_context *tctx = ggml_init(params);
    struct gguf_context *gctx = gguf_init_empty();
    set_metadata(gctx);
    for (int i = 0; i < nfix; i++) {
        make_fixture(dir, gctx, tctx, &fixtures[i]);
    }

    char path[1024];
    snprintf(path, sizeof(path), "%s/ggml.gguf", dir);
    if (!gguf_write_to_file(gctx, path, false)) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    gguf_free(gctx);
    ggml_free(tctx);
    return 0;
}
