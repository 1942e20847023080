// Package structured constrains generation to JSON that validates against a schema
// (OpenAI's response_format json_schema) or to any JSON object (json_object), by
// masking the tokens that could not continue a valid value before each sampling step.
//
// CompileSchema turns a JSON Schema into a Grammar: a byte-level pushdown automaton
// (grammar.go) whose rules are called and returned from, so $ref cycles and arbitrary
// JSON nesting need no depth limit. Objects list their properties in schema order
// (required ones always, optional ones or not, commas placed right); strings are
// sequences of JSON characters (well-formed UTF-8 or escapes) with minLength/maxLength
// unrolled; integers follow their bounds digit by digit; enum and const are literals;
// anyOf and type lists are alternatives. Whitespace between tokens is limited to two
// bytes (CompileWrapped's tool calls take pretty-printed JSON instead: a newline and
// bounded indentation where a pretty-printer breaks lines, no more), and once the value
// is complete only end of sequence (or that much whitespace) is allowed, so a
// constrained reply ends by itself. A keyword the compiler does not
// implement is an ErrUnsupported naming it under strict, ignored otherwise.
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
package structured
