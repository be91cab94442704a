#!/usr/bin/env python3
"""Writes chat_template_fixtures.json: every template here rendered by Python's jinja2 the way
Hugging Face transformers renders chat templates (ImmutableSandboxedEnvironment, trim_blocks,
lstrip_blocks, raise_exception as a global), for several conversations. jinja_test.cc renders
the same cases with lazyrag's renderer and compares byte for byte.

smollm2.jinja is the `tokenizer.chat_template` of the SmolLM2-135M-Instruct GGUF; with --gguf
it is re-extracted first. The others are written after the templates of Qwen2-Instruct,
Qwen3 (without its tool branches), Llama-3-Instruct, Mistral-Instruct-v0.3 (without tools) and
Gemma-it, plus multiline.jinja (the multi-line style that relies on trim_blocks and
lstrip_blocks) and unsupported_macro.jinja (outside the subset). Needs jinja2 (PyPI; deploy/local/bootstrap.sh installs it).

  python3 worker/model/tokenizer/testdata/gen_chat_template_fixtures.py \
      [--gguf ~/.cache/lazyrag/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import json
import os
import struct

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))

SPECIALS = {
    "smollm2.jinja": ("<|im_start|>", "<|im_end|>"),
    "qwen2.jinja": ("", "<|im_end|>"),
    "qwen3.jinja": ("", "<|im_end|>"),
    "llama3.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral.jinja": ("<s>", "</s>"),
    "gemma.jinja": ("<bos>", "<eos>"),
    "multiline.jinja": ("<s>", "</s>"),
    "unsupported_macro.jinja": ("<s>", "</s>"),
}

# The placeholders RagTemplate renders with (chat_template.cc) appear as ordinary content.
CONVERSATIONS = [
    ([{"role": "system", "content": "You are terse."},
      {"role": "user", "content": "  What is 2+2?\n"}], True),
    ([{"role": "user", "content": "Hello <|im_end|> there"}], True),
    ([{"role": "system", "content": "Be kind."},
      {"role": "user", "content": "Hi"},
      {"role": "assistant", "content": " Hello! x "},
      {"role": "user", "content": "# Bye"}], True),
    ([{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"}], False),
    ([{"role": "user", "content": "Think?"},
      {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nYes."},
      {"role": "user", "content": "Why?"},
      {"role": "assistant", "content": "<think>because</think>Done."}], False),
    ([{"role": "system", "content": "@@LAZYRAG_SYSTEM@@"},
      {"role": "user", "content": "@@LAZYRAG_USER@@"}], True),
    ([{"role": "user", "content": "@@LAZYRAG_USER@@"}], True),
    ([], True),
]


def raise_exception(message):
    raise TemplateError(message)


def read_gguf_template(path):
    with open(path, "rb") as f:
        def u(fmt):
            return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]

        def s():
            return f.read(u("<Q")).decode("utf-8")

        scalar = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                  10: "<Q", 11: "<q", 12: "<d"}

        def value(t):
            if t in scalar:
                return u(scalar[t])
            if t == 8:
                return s()
            et, n = u("<I"), u("<Q")
            return [value(et) for _ in range(n)]

        assert f.read(4) == b"GGUF"
        u("<I")
        u("<Q")
        for _ in range(u("<Q")):
            key, t = s(), u("<I")
            v = value(t)
            if key == "tokenizer.chat_template":
                return v
    raise SystemExit(f"{path}: no tokenizer.chat_template")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", help="re-extract smollm2.jinja from this GGUF")
    args = ap.parse_args()
    if args.gguf:
        with open(os.path.join(HERE, "smollm2.jinja"), "w") as f:
            f.write(read_gguf_template(os.path.expanduser(args.gguf)))
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    cases = []
    for name in sorted(SPECIALS):
        with open(os.path.join(HERE, name)) as f:
            source = f.read()
        bos, eos = SPECIALS[name]
        for messages, add_generation_prompt in CONVERSATIONS:
            context = {"messages": messages, "add_generation_prompt": add_generation_prompt,
                       "bos_token": bos, "eos_token": eos}
            case = {"template": name, "context": context}
            try:
                case["output"] = env.from_string(source).render(**context)
            except TemplateError as e:
                case["error"] = f"{type(e).__name__}: {e}"
            cases.append(case)
    out = os.path.join(HERE, "chat_template_fixtures.json")
    with open(out, "w") as f:
        json.dump({"generator": "gen_chat_template_fixtures.py", "cases": cases}, f, indent=1,
                  ensure_ascii=False)
        f.write("\n")
    print(f"{out}: {len(cases)} cases, "
          f"{sum('error' in c for c in cases)} of them template errors")


if __name__ == "__main__":
    main()
