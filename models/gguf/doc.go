// Package gguf reads GGUF files, the model format of llama.cpp and ggml, so that Conveyor can
// serve the quantized models people have (Q4_K_M, Q5_K_M, Q6_K, Q8_0, F16 ...): their
// metadata (hyperparameters, tokenizer) and their tensors, as stored or decoded to float32.
//
// # Layout
//
// A GGUF file (versions 2 and 3, little-endian; docs/gguf.md in ggml) is, in order:
//
//  1. the header: the magic "GGUF", a uint32 version, a uint64 tensor count and a uint64
//     metadata count;
//  2. the metadata: key/value pairs, each a string key (uint64 length, then UTF-8 bytes), a
//     uint32 value type and the value: a scalar (uint8 ... int64, float32, float64, a one-byte
//     bool), a string, or an array (uint32 element type, uint64 length, the elements, which
//     may be arrays themselves);
//  3. the tensor infos: per tensor its name, a uint32 number of dimensions (at most 4), that
//     many uint64 dimensions (ne[0], the contiguous one, first), a uint32 ggml type id and a
//     uint64 offset into the data section;
//  4. padding up to the alignment (general.alignment, a uint32 power of two, 32 without
//     it), then the data section, where every tensor starts at an aligned offset.
//
// Open (or NewFile, over any io.ReaderAt) reads parts 1-3 and keeps the file open; tensor
// data is read on demand with ReadAt, so opening a 40 GB model costs its metadata only. A
// File is immutable after Open and safe for concurrent use.
//
// # Checks
//
// Open refuses a file it cannot read exactly, with one error line that starts with "gguf:"
// and wraps ErrInvalid (malformed) or ErrUnsupported (well formed, but not read here). A
// file is a parser's input from anywhere, so no count or length is trusted: a tensor count,
// metadata count, array length or string length is checked against the bytes left in the
// file before anything is allocated for it, which bounds every allocation by a small multiple
// of the file's size and every loop by its length. Refused are: a bad magic; versions other
// than 2 and 3 (version 1 used 32-bit counts; a byte-swapped version field marks a
// big-endian file); truncation anywhere in parts 1-3; an empty or repeated key; an unknown
// value type; arrays nested deeper than 8; a general.alignment that is not a uint32 power of
// two; a repeated tensor name; more than 4 dimensions; a dimension, element count or byte size
// beyond int64; an unknown type id or one whose layout ggml has removed; a row (ne[0]) that is
// not a whole number of blocks; and a tensor whose offset is not aligned, whose bytes extend
// past the end of the file, or which overlaps another tensor. Unlike ggml, which requires
// tensors to be packed in file order, any order and gaps are accepted. FuzzOpen feeds the
// reader arbitrary bytes.
//
// # Tensor types
//
// TensorInfo.Type is the ggml type; GGMLType names every id ggml has assigned, so an
// undecodable tensor is reported by name. ReadRaw returns any tensor's bytes as stored;
// ReadFloat32 decodes these types, and refuses the others (IQ*, Q2_K, Q3_K, TQ*, ...) with
// an ErrUnsupported error that names the tensor and its type:
//
//	type  bytes/values  block
//	F32      4/1        little-endian float32
//	F16      2/1        IEEE binary16
//	BF16     2/1        bfloat16, the high half of a float32
//	Q8_0    34/32       fp16 d, 32 int8 q: x = q*d
//	Q4_0    18/32       fp16 d, 16 bytes of nibbles: x = (q-8)*d
//	Q4_1    20/32       fp16 d, fp16 m, 16 bytes of nibbles: x = q*d + m
//	Q5_0    22/32       fp16 d, 32 high bits, 16 bytes of low nibbles: x = (q-16)*d
//	Q5_1    24/32       fp16 d, fp16 m, 32 high bits, low nibbles: x = q*d + m
//	Q4_K   144/256      fp16 d, fp16 dmin, 12 bytes of eight 6-bit (scale, min), 128 bytes
//	                    of nibbles: x = (d*scale)*q - dmin*min per 32-value sub-block
//	Q5_K   176/256      Q4_K plus 32 bytes of fifth bits: x = (d*scale)*q - dmin*min
//	Q6_K   210/256      128 bytes of low nibbles, 64 of high bit pairs, 16 int8 scales,
//	                    fp16 d: x = (d*scale)*(q-32) per 16-value group
//
// In the 32-value types value j is the low nibble of byte j and value j+16 its high nibble;
// the K-quants' finer interleaving is described at DequantizeQ4_K, DequantizeQ5_K and
// DequantizeQ6_K. The exported block decoders (DequantizeQ4_K and the others, and
// Dequantize for a type chosen at run time) let a caller decode rows of ReadRaw's bytes
// itself. They compute as ggml's dequantize_row_* does, in float32 with one rounding per
// operation in ggml's order and no fused multiply-add, so their results equal ggml's to the
// bit; the tests check them against fixtures written by ggml (testdata/gen_fixtures.c):
// blocks quantized by ggml and blocks of random bytes, with the values ggml decodes from
// them, and a GGUF file written by ggml's own writer.
//
// # Usage
//
//	f, err := gguf.Open("qwen2.5-0.5b-instruct-q4_k_m.gguf")
//	if err != nil {
//		return err
//	}
//	defer f.Close()
//	arch := f.Metadata.Architecture()                          // "qwen2"
//	ctxLen, _ := f.Metadata.Uint(arch + ".context_length")     // 32768
//	tokens, _ := f.Metadata.Strings("tokenizer.ggml.tokens")
//	for _, t := range f.Tensors() {
//		fmt.Println(t.Name, t.Type, t.Dims) // blk.0.attn_q.weight Q4_K [896 896]
//	}
//	w, err := f.ReadFloat32("blk.0.attn_q.weight") // 896*896 values, rows of Dims[0]
package gguf
