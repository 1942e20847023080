#!/usr/bin/env python3
"""Write chat_refs.json: real chat templates rendered as Hugging Face transformers renders them.

What: the chat_template of the llama3_1, qwen3 and gemma3 tokenizer_config.json files (fetched
by `make tokenizer-files` into .tokenizers/), Llama-2-chat's template (the llama2 files ship no
chat_template, so the one of meta-llama/Llama-2-7b-chat-hf's tokenizer_config.json is embedded
below and rendered with the llama2 files' special tokens) and Phi-3-mini-4k-instruct's template
(embedded below, bos "<s>", eos "<|endoftext|>"), each rendered over the conversations of CORPUS
with add_generation_prompt true and false. A rendering that raises (raise_exception, or an
undefined value used) is recorded as the exception's message instead of a text. Also the
small templates of EXPRESSIONS (string methods, filters, literals and arithmetic the templates
rely on) and KNOWN_DIFFERENCES (where Conveyor's engine is known to differ), rendered the same way.

How transformers renders (transformers/utils/chat_template_utils.py, _compile_jinja_template
and render_jinja_template): a jinja2 ImmutableSandboxedEnvironment with trim_blocks=True,
lstrip_blocks=True and the loopcontrols extension (its AssistantTracker extension only adds
{% generation %}, which none of these templates use); the globals raise_exception (raises
TemplateError(message)) and strftime_now; a tojson filter that is json.dumps(x,
ensure_ascii=False, indent=indent, separators=separators, sort_keys=sort_keys); and the
variables messages, tools=None, documents=None, add_generation_prompt and the tokenizer's
special_tokens_map, whose bos_token, eos_token, unk_token and pad_token are strings (a token
that is null in tokenizer_config.json is not passed at all).

Run from the repository root, after `make tokenizer-files`, with Python 3 and jinja2 >= 3.1
(Debian: apt-get install -y python3-jinja2); transformers itself is not needed:

    python3 tokenizer/testdata/gen_chat_refs.py [--files .tokenizers] [--out tokenizer/testdata/chat_refs.json]

tokenizer/realchat_test.go (TestRealChatTemplates, TestChatTemplatePythonSemantics) compares
ApplyChatTemplate with the result.
"""

import argparse
import hashlib
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

# meta-llama/Llama-2-7b-chat-hf, tokenizer_config.json "chat_template", verbatim.
LLAMA2_CHAT_TEMPLATE = r"""{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\n' + system_message + '\n<</SYS>>\n\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}"""

# microsoft/Phi-3-mini-4k-instruct, tokenizer_config.json "chat_template", verbatim.
PHI3_CHAT_TEMPLATE = r"""{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"""

# family -> (directory under --files, embedded template or None for the file's own,
# where the template comes from, special tokens overriding the file's or None).
FAMILIES = {
    "llama3_1": ("llama3_1", None, "llama3_1/tokenizer_config.json", None),
    "qwen3": ("qwen3", None, "qwen3/tokenizer_config.json", None),
    "gemma3": ("gemma3", None, "gemma3/tokenizer_config.json", None),
    "llama2": ("llama2", LLAMA2_CHAT_TEMPLATE,
               "meta-llama/Llama-2-7b-chat-hf tokenizer_config.json (the llama2 files have no chat_template)", None),
    "phi3": ("llama2", PHI3_CHAT_TEMPLATE, "microsoft/Phi-3-mini-4k-instruct tokenizer_config.json",
             {"bos_token": "<s>", "eos_token": "<|endoftext|>", "unk_token": "<unk>", "pad_token": "<|endoftext|>"}),
}

SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token")


def m(role, content):
    return {"role": role, "content": content}


# name -> messages: plain conversations (string contents). TOOL_CORPUS below has tool calls,
# tool results, tools, content parts and names.
CORPUS = [
    ("system_user", [m("system", "You are a helpful assistant."), m("user", "What is the capital of France?")]),
    ("user_only", [m("user", "Hello!")]),
    ("multi_turn_system", [
        m("system", "Be brief."), m("user", " Hi there "), m("assistant", "Hello! How can I help?"),
        m("user", "Tell me a joke."),
    ]),
    ("multi_turn_no_system", [
        m("user", "What's 2+2?"), m("assistant", "4"), m("user", "And 3+3?"), m("assistant", "6"),
        m("user", "Thanks."),
    ]),
    ("assistant_last", [m("system", "You answer in French."), m("user", "Say hello."), m("assistant", "Bonjour !")]),
    ("empty_content", [m("system", ""), m("user", ""), m("assistant", ""), m("user", "")]),
    ("unicode", [
        m("user", "héllo wörld — 你好，世界 👋🏽👨‍👩‍👧 ∑∫√ café (NFD: cafe\u0301)\nsecond line\n\n\tindented"),
        m("assistant", "Ça va ? 🙂 Привет! مرحبا עברית\n"),
        m("user", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ ① ﬁ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢"),
    ]),
    ("whitespace", [
        m("system", "\n\n  system with spaces and newlines  \n\n"),
        m("user", "\u3000ideographic space, nbsp\u00a0, em space\u2003\r\n\t"),
        m("assistant", "\x1c\x1d\x1e\x1f separators (Python whitespace, not Go's) \x1f\v\f"),
        m("user", " \t\r\n "),
    ]),
    ("quotes_braces", [
        m("system", 'Reply with JSON like {"a": 1, "b": [true, null]}.'),
        m("user", "He said \"hi\" and 'bye'. {{ bos_token }} {% if true %}x{% endif %} {# c #} {%- raw %} "
                  "a\\nb \\\\ \\u00e9 <s> [INST] <<SYS>> ${x} %s {0}"),
        m("assistant", "{'ok': True} }} %} #} {{- -}} {% endfor %}"),
        m("user", "{{ raise_exception('not evaluated') }}"),
    ]),
    ("qwen3_think_last", [m("user", "What is 17*3?"), m("assistant", "<think>\n17*3 = 51.\n</think>\n\n17 × 3 = 51.")]),
    ("qwen3_think_history", [
        m("system", "Think step by step."), m("user", "Q1: 2*3?"),
        m("assistant", "<think>\nreasoning one\n</think>\n\nA1: 6"), m("user", "Q2: 4*5?"),
        m("assistant", "<think>reasoning two\n\n</think>\n\n\nA2: 20"),
    ]),
    ("system_only", [m("system", "You are a pirate.")]),
    ("system_not_first", [m("user", "hi"), m("system", "New rules apply."), m("user", "ok")]),
    ("consecutive_users", [m("user", "first"), m("user", "second")]),
    ("assistant_first", [m("assistant", "I speak first."), m("user", "ok")]),
    ("no_messages", []),
]


# Two tools with nested parameters (OpenAI tool objects, as a request's tools).
TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Get the current weather in a city.",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "object", "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "country": {"type": "string", "enum": ["FR", "DE", "JP"]}}, "required": ["city"]},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search_docs", "description": "Search the documentation — «quoted» \"text\".",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {
                "tags": {"type": "array", "items": {"type": "string"}},
                "max_results": {"type": "integer", "minimum": 1, "maximum": 50},
                "score": {"type": "number", "default": 0.5}}}},
            "required": ["query"]}}},
]


def call(id, name, args):
    """A tool call as the OpenAI API sends it: arguments as JSON text (keys in the given order)."""
    return {"id": id, "type": "function",
            "function": {"name": name, "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def assistant_calls(content, *calls):
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def tool(call_id, content):
    return {"role": "tool", "content": content, "tool_call_id": call_id}


def parts(*texts):
    return [{"type": "text", "text": t} for t in texts]


WEATHER_CALL = call("call_1", "get_weather", {"unit": "celsius", "location": {"country": "FR", "city": "Paris"}})
SEARCH_CALL = call("call_2", "search_docs", {"query": "tokenizer", "filters": {"tags": ["go", "é"], "max_results": 5, "score": 1.0}})

# name -> (messages as the OpenAI API sends them, tools or None). Rendered as vLLM passes them
# to the template (render_messages): tool call arguments that are the JSON text of an object
# parsed into a dict, everything else as it is.
TOOL_CORPUS = [
    ("tools_call_result", [
        m("system", "You are a weather bot."), m("user", "Weather in Paris?"),
        assistant_calls("", WEATHER_CALL), tool("call_1", '{"temperature": 21, "sky": "clear"}'),
        m("assistant", "It is 21 °C and clear."), m("user", "Thanks!"),
    ], TOOLS),
    ("tools_parallel_calls", [
        m("user", "Weather in Paris, and docs about the tokenizer?"),
        assistant_calls("Let me check both.", WEATHER_CALL, SEARCH_CALL),
        tool("call_1", "21 °C"), tool("call_2", "[\"doc1\", \"doc2\"]"),
    ], TOOLS),
    ("tools_user_only", [m("user", "Hi, what can you do?")], TOOLS),
    ("tools_think_calls", [
        m("user", "Weather?"),
        assistant_calls("<think>\nI should call the tool.\n</think>\n\n", WEATHER_CALL),
        tool("call_1", "sunny"),
    ], TOOLS),
    ("tool_history_no_tools", [
        m("system", "Be brief."), m("user", "Weather in Paris?"),
        assistant_calls("", WEATHER_CALL), tool("call_1", "21 °C"), m("assistant", "21 °C."), m("user", "ok"),
    ], None),
    ("tool_call_string_arguments", [
        m("user", "x"), assistant_calls("", call("call_9", "search_docs", "not json {")), tool("call_9", "r"),
    ], TOOLS),
    ("content_parts", [
        m("system", parts("You are terse.")), m("user", parts("Describe ", "this.")),
        m("assistant", "Done."), m("user", parts("And again?")),
    ], None),
    ("user_name", [
        m("system", "Group chat."), {"role": "user", "content": "Hi, I'm Ann.", "name": "ann"},
        m("assistant", "Hello Ann."), {"role": "user", "content": "And I'm Bob.", "name": "bob"},
    ], None),
]


def render_messages(msgs):
    """msgs as vLLM hands them to the template: tool call arguments that are a JSON object parsed."""
    out = []
    for msg in msgs:
        msg = dict(msg)
        if "tool_calls" in msg:
            calls = []
            for c in msg["tool_calls"]:
                c = dict(c, function=dict(c["function"]))
                try:
                    args = json.loads(c["function"]["arguments"])
                except ValueError:
                    args = None
                if isinstance(args, dict):
                    c["function"]["arguments"] = args
                calls.append(c)
            msg["tool_calls"] = calls
        out.append(msg)
    return out


# Small templates on the Python semantics chat templates rely on (string methods and filters,
# string literals, arithmetic, loops), rendered with EXPRESSION_VARS. Conveyor's test renders
# them with a tokenizer whose bos_token is "<s>" and eos_token "</s>".
EXPRESSION_VARS = {"messages": [m("user", " Hi "), m("assistant", "Yo")], "bos_token": "<s>", "eos_token": "</s>"}
EXPRESSIONS = [
    # strip, lstrip, rstrip, trim: no argument or None is Python's whitespace (Unicode's and
    # U+001C..U+001F); an argument is a set of characters.
    "{{ '  a b  '.strip() }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|{{ ' a '.strip(none) }}|{{ ' a '.rstrip(none) }}",
    "{{ '\\u3000a\\u2003\\x1f'.strip() }}|{{ '\\x1c\\x1d a \\x1e\\x1f\\x85'.lstrip() }}|{{ '\\x1c\\x1d a \\x1e\\x1f\\xa0'.rstrip() }}|{{ '\\x1c a \\x1f' | trim }}",
    "{{ 'xyxaxyx'.strip('xy') }}|{{ 'xyxaxyx'.lstrip('xy') }}|{{ 'xyxaxyx'.rstrip('xy') }}|{{ '\\n\\nab\\n'.strip('\\n') }}|{{ 'xxa' | trim('x') }}|{{ 'xxa' | trim(chars='x') }}|{{ 5 | trim }}",
    # split and rsplit: no sep or None splits at runs of whitespace; maxsplit.
    "{{ 'a  b\\tc\\n'.split() }}|{{ 'a  b\\tc\\n '.split(maxsplit=1) }}|{{ ' a  b  c '.split(None, 1) }}|{{ ' a b '.split(' ') }}|{{ ''.split(',') }}|{{ ''.split() }}|{{ ' '.split() }}",
    "{{ 'a,b,c'.split(',', 0) }}|{{ 'a,b,c,d'.split(',', 2) }}|{{ 'a,b,c'.split(',', -1) }}|{{ 'a\\x1fb\\u3000c'.split() }}|{{ 'a<>b<>c'.split('<>') }}",
    "{{ 'a,b,c,d'.rsplit(',', 2) }}|{{ ' a  b '.rsplit() }}|{{ ' a  b  c '.rsplit(None, 1) }}|{{ 'a,b'.rsplit(',', 0) }}|{{ 'x</think>y'.rsplit('</think>', 1)[0] }}",
    "{{ 'x</think>y</think>\\nz'.split('</think>')[-1].lstrip('\\n') }}|{{ 'x<think>r</think>'.split('</think>')[0].rstrip('\\n').split('<think>')[-1] }}",
    "{{ 'abc'.split('') }}",
    # isspace, startswith/endswith with a tuple and bounds, replace, splitlines.
    "{{ ' '.isspace() }}|{{ '\\x1c\\u3000'.isspace() }}|{{ ''.isspace() }}|{{ 'a '.isspace() }}",
    "{{ 'abc'.startswith(('x', 'a')) }}|{{ 'abc'.endswith(('x', 'c')) }}|{{ 'abc'.startswith('b', 1) }}|{{ 'abc'.endswith('b', 0, -1) }}|{{ 'abc'.startswith('', 5) }}|{{ 'abc'.startswith('', 2, 1) }}|{{ 'héllo'.startswith('l', 2) }}",
    "{{ 'aaa'.replace('a', 'b') }}|{{ 'aaa'.replace('a', 'b', 2) }}|{{ 'a\\nb\\r\\nc\\x1cd\\x85e'.splitlines() }}|{{ 'a\\nb\\n'.splitlines(true) }}",
    "{{ 'abc'.splitlines() }}|{{ ''.splitlines() }}|{{ '\\n\\n'.splitlines() }}|{{ 'a\\r\\n\\rb\\u2028'.splitlines(keepends=true) }}",
    # String literals: Python's escapes; a backslash before the closing quote.
    "{{ '\\x41\\u00e9\\U0001F600\\101\\0|\\t|\\\\|\\'|\\\"|\\d|\\é' }}|{{ \"it's\" }}|{{ 'say \"hi\"' }}|{{ '\\\\' }}|{{ \"\\\\\" }}|{{ 'a\\\nb' }}",
    "{{ '\\x4' }}",
    # Arithmetic: / is a float, // and % round down, ** of integers is an integer.
    "{{ 10 / 4 }}|{{ 4 / 2 }}|{{ 2 ** 10 }}|{{ 2 ** -1 }}|{{ 2.0 ** 2 }}|{{ -7 // 2 }}|{{ 7 // 2 }}|{{ -7 % 3 }}|{{ 7 % -3 }}|{{ 7.5 // 2 }}|{{ -7.5 % 2 }}|{{ true + 1 }}|{{ true % 2 }}",
    "{% for m in messages %}{{ (loop.index0 - 1) % 2 }}{{ (loop.index0 - 1) // 2 }},{% endfor %}",
    "{{ 1 // 0 }}",
    "{{ 1 % 0 }}",
    "{{ 1 / 0 }}",
    # tojson as transformers defines it (its positional argument is ensure_ascii).
    "{{ 'a\\u2028b\\x7f\\x01\\b\\f\\n\\t\"\\\\/</é😀' | tojson }}|{{ 'é😀\\x7f' | tojson(ensure_ascii=true) }}|{{ 'é' | tojson(2) }}",
    "{{ [1, 'a', none, true, 1.0, 0.5, 1e6, 1e16, 1e-5, -0.0] | tojson }}|{{ {'k': [1, {'x': 'y'}]} | tojson(indent=2) }}|{{ {'a': [1, 2]} | tojson(separators=(',', ':')) }}",
    "{{ messages[0]['content'] | tojson }}|{{ {'a': {}} | tojson(indent=0) }}|{{ [] | tojson(indent=2) }}|{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}",
    # Loops, namespace, filters and tests the real templates use.
    "{% set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% set ns.n = ns.n + loop.index %}{% endfor %}{{ ns.n }}|{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ messages | map(attribute='role') | join(',') }}",
    "{{ messages[0].get('x', 'd') }}|{{ (messages | last).role }}|{{ 'u' in messages[0].role }}|{{ x | default('d') }}|{{ messages[0].content is string }}|{{ messages is iterable }}|{{ messages[0]['content'] is defined }}|{{ messages[0].reasoning is defined }}",
    "{% for i in range(6) %}{% if i == 1 %}{% continue %}{% elif i == 4 %}{% break %}{% endif %}{{ i }}{{ ',' if not loop.last }}{% endfor %}|{{ messages[-1]['content'] | upper }}|{{ 'x' * 3 }}|{{ [1, 2] + [3] }}|{{ 'a' ~ 1 }}",
    # Dicts keep their insertion order (messages, dict literals) in tojson and items().
    "{{ messages[0] | tojson }}|{% for k, v in {'b': 1, 'a': 2}.items() %}{{ k }}{% endfor %}|{{ {'b': 1, 'a': 2} | tojson }}|{{ {'b': 1, 'a': {'d': 1, 'c': 2}} | tojson(sort_keys=true) }}|{{ {'b': 1, 'a': 2}.keys() | list }}",
    "{{ {'b': 1, 'a': 2} }}|{% for k in {'b': 1, 'a': 2} %}{{ k }}{% endfor %}|{% for k in messages[0] %}{{ k }},{% endfor %}|{{ messages[0] }}|{{ messages[0].values() | list }}",
    "{%- for m in messages %}\n  {{- m.role }}\n  {% if m.content %}[{{ m.content }}]{% endif %}\n{% endfor -%}\n{{ bos_token }}{{ eos_token }}",
]

# Known differences of Conveyor's engine (tokenizer/realchat_test.go logs them instead of
# failing): None renders as "", tuples as lists, and str % args is not supported.
KNOWN_DIFFERENCES = [
    "{{ none }}|{{ [1, none, true] }}|{{ (1, 2) }}",
    "{{ '%s-%d' % ('a', 3) }}",
]


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


def compile_template(src):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(src)


def token_text(v):
    """A special token of tokenizer_config.json as a string (it may be an AddedToken object)."""
    if isinstance(v, dict):
        return v.get("content")
    return v


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", default=os.path.join(ROOT, ".tokenizers"), help="directory of the tokenizer files")
    ap.add_argument("--out", default=os.path.join(HERE, "chat_refs.json"))
    args = ap.parse_args()

    families = {}
    cases = []
    for family, (files, embedded, source, tokens) in FAMILIES.items():
        with open(os.path.join(args.files, files, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        src = embedded if embedded is not None else cfg["chat_template"]
        if not isinstance(src, str):
            sys.exit(f"{family}: chat_template is not a string")
        if tokens is None:
            tokens = {k: token_text(cfg.get(k)) for k in SPECIAL_TOKENS}
        variables = {k: v for k, v in tokens.items() if v is not None}
        info = {"files": files, "template_source": source,
                "template_sha256": hashlib.sha256(src.encode("utf-8")).hexdigest(), "special_tokens": variables}
        if embedded is not None:
            info["template"] = embedded
        families[family] = info
        tpl = compile_template(src)
        corpus = [(name, msgs, None) for name, msgs in CORPUS] + TOOL_CORPUS
        for name, msgs, tools in corpus:
            for gen in (True, False):
                case = {"family": family, "name": name, "add_generation_prompt": gen, "messages": msgs}
                if tools is not None:
                    case["tools"] = tools
                try:
                    case["text"] = tpl.render(messages=render_messages(msgs), tools=tools, documents=None,
                                              add_generation_prompt=gen, **variables)
                except Exception as e:  # noqa: BLE001 - the message is the reference
                    case["error"] = str(e)
                    case["error_type"] = type(e).__name__
                cases.append(case)

    expressions = []
    for known, group in ((False, EXPRESSIONS), (True, KNOWN_DIFFERENCES)):
        for src in group:
            e = {"template": src}
            if known:
                e["known_difference"] = True
            try:
                e["text"] = compile_template(src).render(**EXPRESSION_VARS)
            except Exception as ex:  # noqa: BLE001
                e["error"] = str(ex)
                e["error_type"] = type(ex).__name__
            expressions.append(e)

    dump = lambda v: json.dumps(v, ensure_ascii=False)  # noqa: E731
    lines = ["{", f'"generator": "tokenizer/testdata/gen_chat_refs.py (jinja2 {jinja2.__version__})",',
             '"families": {']
    lines += [f"  {dump(k)}: {dump(v)}," for k, v in families.items()]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["},", f'"expression_vars": {dump(EXPRESSION_VARS)},', '"cases": [']
    lines += [f"  {dump(c)}," for c in cases]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["],", '"expressions": [']
    lines += [f"  {dump(e)}," for e in expressions]
    lines[-1] = lines[-1].rstrip(",")
    lines += ["]", "}"]
    with open(args.out, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    errs = sum("error" in c for c in cases)
    print(f"{args.out}: {len(cases)} cases ({errs} raise), {len(families)} families, {len(expressions)} expressions",
          file=sys.stderr)


if __name__ == "__main__":
    main()
