#!/usr/bin/env python3
"""Golden ids and labels of LLaMA-Factory's own named chat templates.

LLaMA-Factory does not render a model's Jinja template: its `template:`
key names one of its Python templates (src/llamafactory/data/template.py,
llama3, qwen, qwen3, qwen3_nothink, ...), which format each message from
slots and tokenize every element on its own. ztrain honours such a name
only where its own rendering of it gives the same ids, and this is the
check: for every example below and several cutoff_len, train_on_prompt and
mask_history settings (and qwen3 with enable_thinking false, qwen and
llama3 with a default_system of their own), LLaMA-Factory's real Template (its registry, its
get_template_and_fix_tokenizer, its ReasoningTemplate) and its supervised
preprocessing (SupervisedDatasetProcessor._encode_data_example) encode the
example with a byte-level tokenizer that carries the templates' special
tokens (written beside as tests/data/tokenizers/byte_level_chat.json).
Also each template's Jinja as its fix_jinja_template writes it into a
tokenizer that has none (Template._get_jinja_template), which ztrain ships
with an export of such a run. Tool rows too: the tools column through its ToolFormatter, function turns
through its FunctionFormatter (bare JSON, a list, <tool_call> with text
around, after a thought), observations through its slot; llama3's tool
descriptions (dated) left out, as ztrain refuses them.
Writes tests/data/llamafactory/template_golden.json; test_sft_encoding
holds ztrain's encode_example under the same template name to it.

The examples: every row of tests/data/llamafactory's datasets that
LLaMA-Factory keeps, the first rows of its identity.json, and written
ones that reach the templates' corners (a thought already in an answer,
text around it, leading spaces and newlines, a system message of its own,
several turns, non-ASCII text, `{{idx}}` in a user message, which
LLaMA-Factory's user slot replaces with the turn's number).

Development only (transformers, tokenizers, a LLaMA-Factory checkout).

usage: tools/make_llamafactory_template_golden.py LLAMAFACTORY_CHECKOUT
"""
import json
import pathlib
import sys
import types

from tokenizers import AddedToken, Tokenizer
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))
from make_llamafactory_golden import load_module  # noqa: E402
from make_sft_encoding_golden import supervised_encoder  # noqa: E402

# name -> the special tokens its model's tokenizer has (LLaMA-Factory reads
# bos_token for llama3's prefix; eos is replaced by its stop word).
TEMPLATES = {
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"},
    "qwen": {"eos_token": "<|endoftext|>"},
    "qwen3": {"eos_token": "<|endoftext|>"},
    "qwen3_nothink": {"eos_token": "<|endoftext|>"},
}
SPECIAL = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
           "<|eot_id|>", "<|eom_id|>", "<|im_start|>", "<|im_end|>"]
PLAIN_ADDED = ["<think>", "</think>"]  # Qwen3's: added, not special
SETTINGS = [
    {"cutoff_len": 2048, "train_on_prompt": False, "mask_history": False},
    {"cutoff_len": 2048, "train_on_prompt": True, "mask_history": False},
    {"cutoff_len": 2048, "train_on_prompt": False, "mask_history": True},
    {"cutoff_len": 30, "train_on_prompt": False, "mask_history": False},
    {"cutoff_len": 30, "train_on_prompt": False, "mask_history": True},
]


def turns(*pairs):
    out = []
    for user, assistant in pairs:
        out += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return out


WRITTEN = [
    {"system": "", "tools": "", "turns": turns(("Hi", "<think>\nGreeting.\n</think>\n\nHello!"))},
    {"system": "", "tools": "", "turns": turns(("2+2?", "<think>add</think>4"),
                                               ("And 3+3?", "<think>\nadd again\n</think>\n\n6"))},
    {"system": "Be terse.", "tools": "", "turns": turns(("Why?", "Because.\n\n<think>late</think> ok"))},
    {"system": "", "tools": "", "turns": turns(("  leading spaces", "\n\nnewlines first"),
                                               ("tabs\tand\u00e9t\u00e9", " \u4f60\u597d \U0001F600"))},
    {"system": "You are a pirate.\nSpeak so.", "tools": "", "turns": turns(("a", "b"), ("c", "d"), ("e", "f"))},
    {"system": "", "tools": "", "turns": turns(("Say </think> once", "</think> said"))},
    {"system": "", "tools": "", "turns": turns(("turn {{idx}} of {{idx}}", "one"), ("now {{idx}}", "two"))},
]
TOOLS = json.dumps([{"name": "get_weather", "description": "Météo d'une ville",
                     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
                    {"type": "function", "function": {"name": "now", "parameters": {}}}], ensure_ascii=False)


def tool_turns(*turns):
    return [{"role": role, "content": content} for role, content in turns]


# Function turns as LLaMA-Factory's datasets hold them: bare JSON, a list
# (parallel calls), inside <tool_call> with text around, after a thought.
WRITTEN += [
    {"system": "Be useful.", "tools": TOOLS, "turns": tool_turns(
        ("user", "Weather in Paris?"),
        ("function", '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "°C", "n": 1.50}}'),
        ("observation", '{"temp": 21}'),
        ("assistant", "21°C."))},
    {"system": "", "tools": TOOLS, "turns": tool_turns(
        ("user", "Paris and Rome, and the time?"),
        ("function", '[{"name": "get_weather", "arguments": {"city": "Paris"}}, '
                     '{"name": "get_weather", "arguments": {"city": "Rome"}}]'),
        ("observation", "21\n</tool_response>\n<tool_response>\n25"),
        ("function", 'Checking the time. <tool_call>{"name": "now", "arguments": {}}</tool_call>'),
        ("observation", "12:00"),
        ("assistant", "Paris 21, Rome 25, at noon."))},
    {"system": "", "tools": "[]", "turns": tool_turns(
        ("user", "Think, then call."),
        ("function", '<think>\nI should call.\n</think>\n\n{"name": "now", "arguments": {"tz": "UTC"}}'),
        ("observation", "noon"),
        ("assistant", "<think>\nok\n</think>\n\nIt is noon."))},
]


def chat_tokenizer():
    """byte_level.json with the templates' special tokens, saved beside it."""
    tok = Tokenizer.from_file(str(DATA / "tokenizers" / "byte_level.json"))
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in PLAIN_ADDED])
    tok.save(str(DATA / "tokenizers" / "byte_level_chat.json"))
    return tok


def examples():
    out = []
    golden = json.loads((DATA / "llamafactory" / "golden.json").read_text())
    for dataset, rows in golden.items():
        for index, row in enumerate(rows):
            if row is not None and row["turns"][-1]["content"].strip():
                out.append((f"{dataset}[{index}]", row))
    identity = json.loads((DATA / "llamafactory" / "lf_repo" / "data" / "identity.json").read_text())
    for index, row in enumerate(identity[:8]):
        out.append((f"identity[{index}]", {"system": "", "tools": "", "turns": turns((row["instruction"], row["output"]))}))
    out += [(f"written[{i}]", row) for i, row in enumerate(WRITTEN)]
    return out


def load_templates(root):
    supervised = supervised_encoder(root)  # the checkout's stubs, and its supervised processor
    src = pathlib.Path(root) / "src" / "llamafactory"
    sys.modules["llamafactory.data.data_utils"].SLOTS = list
    mm = types.ModuleType("llamafactory.data.mm_plugin")

    class NoMedia:
        def process_messages(self, messages, *a):
            return messages

        def process_token_ids(self, ids, labels, *a):
            return ids, labels

    mm.get_mm_plugin = lambda *a, **k: NoMedia()
    sys.modules["llamafactory.data.mm_plugin"] = mm
    load_module("llamafactory.data.tool_utils", src / "data" / "tool_utils.py")
    load_module("llamafactory.data.formatter", src / "data" / "formatter.py")
    template = load_module("llamafactory.data.template", src / "data" / "template.py")
    return template, supervised


def main():
    template_module, supervised = load_templates(sys.argv[1])
    base = chat_tokenizer()
    cases = []
    jinja = {}
    # (name, enable_thinking, default_system); the default_system ones last,
    # as get_template_and_fix_tokenizer sets it on the registry's template.
    configurations = [(n, True, None) for n in TEMPLATES] + [("qwen3", False, None)]
    configurations += [("qwen", True, "Answer in French."), ("llama3", True, "Tu es 'utile'.")]
    for name, thinking, default_system in configurations:
        tokens = TEMPLATES[name]
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=base, **tokens)
        size = len(tokenizer)
        data_args = types.SimpleNamespace(template=name, train_on_prompt=False, tool_format=None,
                                          default_system=default_system, enable_thinking=thinking,
                                          preserve_thinking=False)
        template = template_module.get_template_and_fix_tokenizer(tokenizer, data_args)
        assert len(tokenizer) == size, f"{name} added tokens to the tokenizer"
        # What fix_jinja_template writes into a tokenizer that has no template.
        jinja[name if default_system is None else name + "+default_system"] = (
            template._get_jinja_template(tokenizer))
        for where, example in examples():
            if name == "llama3" and example["tools"] and json.loads(example["tools"]):
                continue  # its tool prompt carries the day's date: refused by ztrain
            for s in SETTINGS:
                processor = types.SimpleNamespace(
                    template=template, tokenizer=tokenizer, processor=None,
                    data_args=types.SimpleNamespace(**s))
                ids, labels = supervised.SupervisedDatasetProcessor._encode_data_example(
                    processor, example["turns"][:-1], example["turns"][-1:], example["system"],
                    example["tools"], [], [], [])
                cases.append({"template": name, "special_tokens": tokens, "enable_thinking": thinking,
                              "default_system": default_system,
                              "example": where,
                              "system": example["system"], "tools": example["tools"],
                              "turns": example["turns"], **s,
                              "input_ids": ids, "labels": labels})
    out = DATA / "llamafactory" / "template_golden.json"
    out.write_text(json.dumps({"jinja": jinja, "cases": cases}, ensure_ascii=False) + "\n")
    print(f"{len(cases)} cases into {out}")


if __name__ == "__main__":
    main()
