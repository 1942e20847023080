// Package structured constrains generation to JSON that validates against a schema
// (OpenAI's response_format json_schema), to any JSON object (json_object), or to tool
// calls in a model's own format, by masking the tokens that could not continue a valid
// value before each sampling step.
//
// # Compiling
//
// CompileSchema turns a JSON Schema into a Grammar: a byte-level pushdown automaton
// whose rules are called and returned from, so $ref cycles and arbitrary JSON nesting
// need no depth limit. Objects list their properties in schema order (required ones
// always, optional ones or not, commas placed right); strings are sequences of JSON
// characters (well-formed UTF-8 or escapes) with minLength/maxLength unrolled; integers
// follow their bounds digit by digit; enum and const are literals; anyOf and type lists
// are alternatives. A keyword the compiler does not implement is an ErrUnsupported
// naming it under strict, ignored otherwise; a count above 4096 to unroll or a grammar
// above 2^20 nodes is an ErrUnsupported either way, and a schema that is not one an
// ErrBadSchema.
// CompileJSONObject is the grammar of any object.
//
// CompileWrapped compiles the tool calls of a format: between min and max values of a
// schema, each written as prefix + value + suffix, separated by sep, the literals matched
// byte for byte with no whitespace around them.
//
// # Layout
//
// A response format's value may have up to two bytes of whitespace (space, tab, CR, LF)
// at each place between its tokens and around it. Tool calls are laid out as models
// write them, compact or pretty-printed, and no looser: where a pretty-printer breaks
// lines (after '{', '[' and ',', before '}' and ']') nothing, one space, or a newline
// and up to 20 spaces or 1 to 20 tabs (one kind); after a colon nothing or one space;
// before a colon or a comma nothing. Every place is bounded, so a model cannot spend
// its max_tokens on layout, and once the value is complete only end of sequence (or
// the whitespace still allowed) may follow, so a constrained reply ends by itself.
//
// # Matching
//
// A Constraint binds a Grammar to a Vocabulary (every token's bytes, in a trie). It
// determinizes lazily: a state is the set of (node, return stack) configurations the
// automaton can be in, interned, with its 256 byte transitions filled in on first use;
// a state's mask is computed once, by walking the trie from the state (a prefix that
// dies prunes every token below it), and cached. Inside string bodies, where most
// tokens are plain text, the tokens made of whole string characters are known per
// vocabulary (with their character counts), so only the others are walked — the
// idea behind xgrammar's context-independent token cache. A Matcher follows one
// sequence; many sequences and requests share a Constraint.
//
// A Cache compiles response formats and tool-call formats into Constraints over one
// Vocabulary and keeps the most recently used, so requests with the same schema share
// its grammar and the masks computed so far. A Trigger is the text that opens a lazily
// constrained value in a reply that may also be prose (a tool call under tool_choice
// auto): the engine starts the constraint where Locate finds it, and a streaming front
// end holds back what Scan says may be its beginning.
//
// # Files
//
//   - schema.go: CompileSchema and the compiler: a schema's dispatch to keywords, $ref,
//     and the whitespace of each layout.
//   - keywords.go: the keywords per type (type and nullable, properties, required,
//     additionalProperties, items, the count and integer bounds).
//   - jsontext.go: fragments of JSON text whatever the schema: strings, numbers,
//     integer ranges, any value.
//   - jv.go: the schema document, read keeping the order of its keys.
//   - wrapped.go: CompileWrapped.
//   - grammar.go: the Grammar and the builder the compiler writes it with.
//   - vocab.go: the Vocabulary and its tries.
//   - matcher.go: Constraint and Matcher.
//   - cache.go: the Cache.
//   - trigger.go: the Trigger.
//
// # Usage
//
//	vocab := structured.NewVocabulary(size, tokenBytes, isSpecial, eos)
//	con, err := structured.NewCache(vocab, 64).Schema(schema, true)
//	if err != nil {
//		return err // errors.Is ErrBadSchema or ErrUnsupported
//	}
//	m := con.NewMatcher()
//	for {
//		id := sample(logits, m.Mask()) // a token outside the mask is never sampled
//		m.Accept(id)
//		if vocab.IsEOS(id) {
//			break // allowed only once the value is complete
//		}
//	}
package structured
