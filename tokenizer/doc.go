// Package tokenizer loads Hugging Face tokenizer.json files, encodes and decodes text,
// detokenizes incrementally and renders chat templates.
package tokenizer
