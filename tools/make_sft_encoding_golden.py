#!/usr/bin/env python3
"""Golden token ids and labels of fine-tuning examples, from three references.

For every example LLaMA-Factory keeps in tests/data/llamafactory/golden.json
and two of trl's training chat templates (their answers marked with
{% generation %}): transformers renders the conversation, its tools passed
as tools= and its function turns as tool_calls (the rows with tools only
under Qwen2.5's, which renders them), and finds the answers' spans
(return_assistant_tokens_mask), the `tokenizers` library
tokenizes each prompt and answer piece with tests/data/tokenizers/
byte_level.json, and LLaMA-Factory's own supervised preprocessing
(SupervisedDatasetProcessor._encode_data_example, with a template that
hands it those pairs) truncates and labels them, for several cutoff_len,
train_on_prompt and mask_history settings. Writes
tests/data/llamafactory/encoding_golden.json; test_sft_encoding holds
ztrain's encode_example to it id for id.

Development only (transformers, tokenizers, a LLaMA-Factory checkout).

usage: tools/make_sft_encoding_golden.py LLAMAFACTORY_CHECKOUT [OUT_JSON]
"""
import json
import pathlib
import sys
import types

from tokenizers import Tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))
from make_llamafactory_golden import load_llamafactory, load_module  # noqa: E402

TEMPLATES = {
    "qwen2_5_training.jinja": {"eos_token": "<|im_end|>"},
    "llama3_training.jinja": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
}
TAKES_TOOLS = ("qwen2_5_training.jinja",)
SETTINGS = [
    {"cutoff_len": 2048, "train_on_prompt": False, "mask_history": False},
    {"cutoff_len": 2048, "train_on_prompt": True, "mask_history": False},
    {"cutoff_len": 2048, "train_on_prompt": False, "mask_history": True},
    {"cutoff_len": 40, "train_on_prompt": False, "mask_history": False},
    {"cutoff_len": 40, "train_on_prompt": False, "mask_history": True},
    {"cutoff_len": 7, "train_on_prompt": True, "mask_history": False},
]


def supervised_encoder(root):
    load_llamafactory(root)
    src = pathlib.Path(root) / "src" / "llamafactory"
    constants = sys.modules["llamafactory.extras.constants"]
    constants.IGNORE_INDEX = -100
    pkg = types.ModuleType("llamafactory.data.processor")
    pkg.__path__ = [str(src / "data" / "processor")]
    sys.modules["llamafactory.data.processor"] = pkg

    load_module("llamafactory.data.processor.processor_utils", src / "data" / "processor" / "processor_utils.py")
    return load_module("llamafactory.data.processor.supervised", src / "data" / "processor" / "supervised.py")


def tool_calls(content):
    calls = json.loads(content)
    calls = calls if isinstance(calls, list) else [calls]
    return [{"type": "function", "function": {"name": c["name"], "arguments": c.get("arguments", {})}}
            for c in calls]


def chat_messages(example):
    # ztrain's mapping of LLaMA-Factory's turns onto a chat template's:
    # function turns as the assistant's tool_calls, observations as tool turns.
    out = [{"role": "system", "content": example["system"]}] if example["system"] else []
    for t in example["turns"]:
        if t["role"] == "function":
            out.append({"role": "assistant", "content": "", "tool_calls": tool_calls(t["content"])})
        else:
            out.append({"role": "tool" if t["role"] == "observation" else t["role"], "content": t["content"]})
    return out


def chat_tools(example):
    tools = json.loads(example["tools"]) if example["tools"] else []
    return tools or None


def pairs_of(text, spans, tokenizer):
    pairs, at = [], 0
    for k, (begin, end) in enumerate(spans):
        stop = len(text) if k + 1 == len(spans) else end
        encode = lambda piece: tokenizer.encode(piece, add_special_tokens=False).ids
        pairs.append((encode(text[at:begin]), encode(text[begin:stop])))
        at = stop
    return pairs


def main():
    supervised = supervised_encoder(sys.argv[1])
    out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else DATA / "llamafactory" / "encoding_golden.json"
    tokenizer = Tokenizer.from_file(str(DATA / "tokenizers" / "byte_level.json"))
    examples = json.loads((DATA / "llamafactory" / "golden.json").read_text())
    cases = []
    for template_file, tokens in TEMPLATES.items():
        template = (DATA / "chat_templates" / template_file).read_text()
        for dataset, rows in examples.items():
            for index, example in enumerate(rows):
                if example is None or not example["turns"][-1]["content"].strip():
                    continue
                # ztrain refuses tools a template renders nowhere (Llama 3.0's).
                if template_file not in TAKES_TOOLS and (
                        chat_tools(example) or any(t["role"] == "function" for t in example["turns"])):
                    continue
                rendered = render_jinja_template(
                    conversations=[chat_messages(example)], chat_template=template,
                    return_assistant_tokens_mask=True, tools=chat_tools(example), **tokens)
                pairs = pairs_of(rendered[0][0], rendered[1][0], tokenizer)
                for s in SETTINGS:
                    fake = types.SimpleNamespace(
                        template=types.SimpleNamespace(
                            mm_plugin=types.SimpleNamespace(
                                process_messages=lambda m, *a: m,
                                process_token_ids=lambda ids, labels, *a: (ids, labels)),
                            efficient_eos=False, preserve_thinking=True,
                            encode_multiturn=lambda *a, p=pairs: [tuple(map(list, x)) for x in p]),
                        data_args=types.SimpleNamespace(**s), tokenizer=None, processor=None)
                    ids, labels = supervised.SupervisedDatasetProcessor._encode_data_example(
                        fake, [], [], None, None, [], [], [])
                    cases.append({"template": template_file, "special_tokens": tokens,
                                  "dataset": dataset, "index": index, **s,
                                  "input_ids": ids, "labels": labels})
    out.write_text(json.dumps({"cases": cases}) + "\n")
    print(f"{len(cases)} cases into {out}")


if __name__ == "__main__":
    main()
