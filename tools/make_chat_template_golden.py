#!/usr/bin/env python3
"""Golden renders of real chat templates, by transformers' apply_chat_template.

For every tests/data/chat_templates/*.jinja (copied from the trl package's
chat_templates, which keeps the templates model repositories ship), renders
a set of conversations the way `tokenizer.apply_chat_template(...,
tokenize=False)` does (transformers.utils.chat_template_utils.
render_jinja_template, with the special tokens a tokenizer passes), with and
without the generation prompt, and writes tests/data/chat_templates/
golden.json: each case's template, messages, options and text, and for the
templates with {% generation %} blocks (trl's *_training.jinja) the
assistant's answers as `return_assistant_tokens_mask` finds them; the
templates that take tools also render a conversation with tools, a tool
call and its result (apply_chat_template's tools=, tool_calls). test_chat_
template renders the same cases with ztrain's engine and compares the text
and the answers byte for byte.

Development only (pip install transformers jinja2); CI reads the JSON.

usage: tools/make_chat_template_golden.py [OUT_JSON]
"""
import json
import pathlib
import sys

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_templates"

# The special tokens each family's tokenizer passes to its template.
TOKENS = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "llama3_2": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "phi3": {"bos_token": "<s>", "eos_token": "<|endoftext|>"},
    "qwen2_5": {"bos_token": None, "eos_token": "<|im_end|>"},
    "qwen3": {"bos_token": None, "eos_token": "<|im_end|>"},
    "gemma3": {"bos_token": "<bos>", "eos_token": "<eos>"},
    "deepseek_r1_distill": {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
}
# trl's training versions: the same templates with {% generation %} blocks.
for _name in ("llama3", "qwen2_5", "qwen3", "gemma3", "deepseek_r1_distill", "phi3"):
    TOKENS[_name + "_training"] = TOKENS[_name]

# Date-dependent templates get a fixed date, as a run would pass it.
VARIABLES = {"llama3_1": {"date_string": "26 Jul 2024"}, "llama3_2": {"date_string": "26 Jul 2024"}}

CONVERSATIONS = [
    [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy, with \"quotes\" and a newline\nhere?"},
        {"role": "assistant", "content": "Rome"},
    ],
    [
        {"role": "user", "content": "Unicode: naïve café, 日本語, emoji 🙂"},
        {"role": "assistant", "content": "  leading and trailing spaces  "},
    ],
]

# A conversation with tools, for the templates that take them: one tool as
# LLaMA-Factory's datasets give it (a bare schema), one as OpenAI's
# (wrapped in {"type": "function"}); a call, its result, an answer.
TOOLS = [
    {"name": "get_weather", "description": "Weather of a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "function": {"name": "get_time", "description": "Local time",
                                      "parameters": {"type": "object", "properties": {}}}},
]
TOOL_CONVERSATION = [
    {"role": "system", "content": "You may call tools."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "units": "°C"}}}]},
    {"role": "tool", "content": "{\"temp\": 21}"},
    {"role": "assistant", "content": "It is 21°C in Paris."},
]
TAKES_TOOLS = ("llama3_1", "llama3_2", "qwen2_5", "qwen3", "qwen2_5_training", "qwen3_training")


def main():
    out = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "golden.json"
    cases = []
    for name, tokens in TOKENS.items():
        template = (HERE / f"{name}.jinja").read_text()
        variables = VARIABLES.get(name, {})
        conversations = [(m, None) for m in CONVERSATIONS]
        if name in TAKES_TOOLS:
            conversations.append((TOOL_CONVERSATION, TOOLS))
        for messages, tools in conversations:
            for prompt_only in (False, True):
                shown = messages[:-1] if prompt_only else messages
                marked = "{% generation %}" in template or "{%- generation" in template
                rendered = render_jinja_template(
                    conversations=[shown],
                    chat_template=template,
                    add_generation_prompt=prompt_only,
                    return_assistant_tokens_mask=marked,
                    tools=tools,
                    **{k: v for k, v in tokens.items() if v is not None},
                    **variables,
                )
                text = rendered[0][0]
                case = {
                    "template": f"{name}.jinja",
                    "messages": shown,
                    "add_generation_prompt": prompt_only,
                    "special_tokens": {k: v for k, v in tokens.items() if v is not None},
                    "variables": variables,
                    "text": text,
                }
                if tools:
                    case["tools"] = tools
                if marked:
                    case["answers"] = [text[a:b] for a, b in rendered[1][0]]
                cases.append(case)
    doc = {"transformers": transformers.__version__, "cases": cases}
    out.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(cases)} cases into {out}")


if __name__ == "__main__":
    main()
