// Package tokenizer loads a Hugging Face tokenizer (tokenizer.json plus the optional
// tokenizer_config.json), turns text into token ids and back, detokenizes incrementally for
// streaming, and renders chat templates.
//
// # Design
//
// A Tokenizer is built once by Load and is then immutable and safe for concurrent use.
// Encoding runs the Hugging Face pipeline for one sequence:
//
//  1. added tokens (added_tokens in tokenizer.json, for example "<|im_start|>" or "<s>")
//     are found in the raw text and kept whole, leftmost and longest first, honouring their
//     lstrip, rstrip and single_word flags;
//  2. each stretch of text between them goes through the normalizer, the pre-tokenizer
//     (which cuts it into words and, for byte-level models, rewrites every byte as one
//     character of GPT-2's byte alphabet) and the BPE model, word by word;
//  3. with addSpecial, the ids the post-processor puts around a single sequence are added
//     (usually a leading BOS), as overridden by add_bos_token / add_eos_token in
//     tokenizer_config.json.
//
// The BPE model is implemented here with Hugging Face's semantics (tokenizers/src/models/bpe,
// Word::merge_all): a word's characters are the initial symbols (with
// continuing_subword_prefix before every character but the first and end_of_word_suffix
// after the last, when the model sets them), and the pair of adjacent symbols with the
// lowest merge rank is merged, the leftmost one among equal ranks (the same pair at several
// places), until no pair has a merge; merge i of (a, b) has rank i and gives the token
// a + b (less b's prefix), a pair listed twice keeping its last rank. Around the merge loop:
//
//   - merges written as pairs ([["a", "b"], ...]) as well as strings, including merges of
//     tokens that contain spaces, which only the pair form can express;
//   - byte_fallback (characters outside the vocabulary become <0xNN> tokens, as in Llama-2),
//     unk_token with fuse_unk (an unk_token missing from the vocabulary is refused when
//     loading, where Hugging Face fails only on a text that needs it), ignore_merges
//     (Llama-3: a word that is a token is not merged), and characters missing from the
//     vocabulary (which end a run of symbols: merges never involve byte-fallback or
//     unknown tokens, as in every real vocabulary);
//     the tokens of words up to 64 bytes are cached;
//   - the pre-tokenizers of current models, implemented here: ByteLevel (GPT-2's split
//     expression, add_prefix_space, use_regex=false as in Llama-3 and Qwen2), Split with the
//     Oniguruma-style expressions those models ship, look-ahead included (the GPT-2, Llama-3
//     and Qwen2 expressions by hand-written scanners checked against the expressions, any
//     other with github.com/dlclark/regexp2, since Go's regexp has no look-ahead), Metaspace
//     (replacement, prepend_scheme always/first/never, split), Digits, Punctuation,
//     Whitespace, WhitespaceSplit and Sequence;
//   - normalizers NFC/NFD/NFKC/NFKD, Lowercase, Prepend, Replace (string or regex), Strip
//     and Sequence, implemented here; BertNormalizer, StripAccents and Precompiled are
//     delegated to github.com/sugarme/tokenizer (whose trainer also trains the test
//     tokenizer, see train.go);
//   - post-processors TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel and
//     Sequence, read for the ids they add;
//   - decoders ByteLevel, Metaspace, ByteFallback, Fuse, Replace("▁" -> " "), Strip(" ")
//     and Sequence, read into one per-token rule (see Decoding).
//
// Only BPE models are supported (not Unigram, WordPiece or WordLevel); BPE dropout is
// ignored. Added tokens are matched on the raw text even when marked "normalized". Anything
// unsupported or malformed is an error wrapping ErrInvalid that names the file and the component, never a panic.
//
// # Loading
//
// tokenizer.json of a large model is tens of megabytes (Gemma 3: 33 MB, 262,144 tokens,
// 514,906 merges). Its vocab and merges are read by a small JSON reader of this package
// (fastload.go, with the scanner of jsonscan.go) straight into the vocabulary map (with its
// size known) and the merge table, the merges' vocabulary lookups spread over the available
// cores; the rest of the file, small, is read with encoding/json. Whatever that reader does
// not read exactly as encoding/json would (escapes aside, which it decodes, or hands to
// encoding/json), and every error, goes through the plain encoding/json reader, which gives
// the error messages.
// Gemma 3's tokenizer loads in about 0.4 s on two cores.
//
// # Decoding
//
// Every token id maps to a fixed byte string: byte-level tokens through the inverse byte
// alphabet, SentencePiece tokens with "▁" read as a space and <0xNN> as one byte, added
// tokens as their content. Decode concatenates the bytes of the ids (leaving out special
// tokens with skipSpecial), strips the leading space a SentencePiece decoder strips (from
// the first token that produces text, unless it is an added token), and turns the bytes into
// text with one U+FFFD per byte that does not start a valid UTF-8 sequence. TokenText is the
// same for one token without the stripping, for log probabilities. transformers'
// clean_up_tokenization_spaces is not applied (streamed text could not honour it).
//
// # Incremental detokenization
//
// Because decoding is a concatenation of per-token bytes, a Stream does not need to
// re-decode a window of tokens (the prefix/read offsets of TGI and vLLM): it appends the new
// token's bytes and returns the longest prefix that ends on a complete character, holding
// back a trailing incomplete but still valid UTF-8 sequence (the first bytes of an emoji
// split across byte-level tokens or <0xNN> tokens). Bytes that can never complete a
// character come out as U+FFFD at once; Flush returns the held bytes as U+FFFD. Since the
// replacement rule is per byte, the concatenation of everything Add and Flush return is
// exactly Decode of all the ids, and no piece is ever broken UTF-8 (property- and
// fuzz-tested).
//
// # Chat templates
//
// ApplyChatTemplate and ApplyChatTemplateWith render chat_template from
// tokenizer_config.json (a string, or a list of {name, template} where "default" wins)
// with github.com/nikolalohinski/gonja/v2, with trim_blocks and lstrip_blocks on as
// transformers renders. Templates see messages (each {"role", "content"}, content a
// string or a list of {"type", "text"} parts, plus "tool_calls" (arguments parsed into a
// dict when they are a JSON object, as vLLM does), "tool_call_id" and "name" when set),
// tools (ChatOptions.Tools as a list of dicts, or none), documents (none),
// add_generation_prompt, bos_token, eos_token, unk_token, pad_token, raise_exception(msg)
// and strftime_now(format). Dicts keep their insertion order, as Python's do, where it is
// known: dict literals, the message dicts and the dicts parsed from JSON (tools,
// arguments), in tojson, str(), iteration and keys()/values()/items(); other Go maps come
// out sorted. tojson is transformers' (json.dumps with ensure_ascii=False, indent,
// separators, sort_keys), and trim and the string methods strip, lstrip,
// rstrip, split, rsplit, splitlines, isspace, startswith, endswith and replace behave as
// Python's (Python's whitespace includes U+001C..U+001F). testdata/chat_refs.json holds
// Python jinja2's renderings of the real templates of Llama 3.1, Qwen3, Gemma 3,
// Llama-2-chat and Phi-3, and of small templates on these semantics, that the tests
// compare with (testdata/gen_chat_refs.py writes it). Parse and render errors and
// raise_exception wrap ErrTemplate with the template's message. A template cannot
// include, import or extend other templates (nor itself). It is
// otherwise trusted like the rest of the model directory: a template that recurses or loops
// without end is not stopped.
//
// A model without a template gets this fallback, one header per message and a final
// assistant header when a generation prompt is wanted:
//
//	<|system|>
//	You are helpful.
//	<|user|>
//	Hello!
//	<|assistant|>
//
// Templates usually write the BOS token themselves, so a rendered prompt is encoded without
// adding another one; EncodeChat renders and encodes, adding the special tokens only when
// the rendered text does not already start with the BOS token.
//
// # Test tokenizer
//
// testdata/tokenizer.json is a byte-level BPE trained in this package with sugarme's BPE
// trainer on testdata/corpus.txt: 512 tokens, ids 0 "<unk>", 1 "<s>" (BOS, added by Encode
// with addSpecial), 2 "</s>" (EOS), then the 256 byte tokens and 253 merges.
// testdata/tokenizer_config.json has a Zephyr-style chat template. Regenerate with
//
//	go test -tags conveyorgen ./tokenizer/ -run TestGenerateTestTokenizer
//
// Tests and benchmarks on real tokenizers (Llama 3.1, Qwen3, Gemma 3, Llama 2) read
// $CONVEYOR_TOKENIZER_FILES/<family>/tokenizer.json (families llama3_1, qwen3, gemma3,
// llama2) and skip without it: the merge-order cases checked against Hugging Face, the
// corpus of testdata/hf_refs.json (ids from an independent implementation, written by
// testdata/gen_hf_refs.mjs, which says how to get the files), and BenchmarkLoadGemma3 and
// the like.
//
// # Example
//
//	tk, err := tokenizer.Load("models/tiny")
//	if err != nil {
//		return err
//	}
//	ids, err := tk.Encode("Hello, world", true) // BOS first when the model wants it
//	if err != nil {
//		return err
//	}
//	chat, err := tk.EncodeChat([]tokenizer.Message{{Role: "user", Content: "Hi"}}, true)
//	if err != nil {
//		return err // errors.Is(err, tokenizer.ErrTemplate)
//	}
//	fmt.Println(len(ids), len(chat))
//	stream := tk.NewStream(true)
//	for _, id := range generated {
//		fmt.Print(stream.Add(id)) // never a broken UTF-8 sequence
//	}
//	fmt.Print(stream.Flush())
package tokenizer
