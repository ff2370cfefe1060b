#!/usr/bin/env python3
"""Golden blocks of LLaMA-Factory's pt stage (continued pretraining).

The rows of tests/data/llamafactory/c4_demo.jsonl (the first rows of
LLaMA-Factory's own c4_demo) go through LLaMA-Factory's alpaca converter,
its get_template_and_fix_tokenizer (which replaces the EOS for a named
template and makes the EOS the pad where there is none) and its
PretrainDatasetProcessor, run by `datasets` as LLaMA-Factory runs it
(map(batched=True, batch_size=preprocessing_batch_size,
num_proc=preprocessing_num_workers)); the labels are transformers'
DataCollatorForLanguageModeling(mlm=False)'s. Cases: no template, llama3
and qwen3_nothink; packed and not; several cutoffs, worker counts and
batch sizes; a tokenizer with add_bos_token. The tokenizer is
tests/data/tokenizers/byte_level_chat.json, each case's special tokens its
tokenizer_config.json. Writes tests/data/llamafactory/pretrain_golden.json;
test_sft_source holds ztrain's reader to it block for block.

Development only (datasets, transformers, tokenizers, a LLaMA-Factory
checkout).

usage: tools/make_llamafactory_pretrain_golden.py LLAMAFACTORY_CHECKOUT
"""
import json
import pathlib
import sys
import types

import datasets
from tokenizers import Tokenizer
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
sys.path.insert(0, str(ROOT / "tools"))
from make_llamafactory_golden import rows  # noqa: E402
from make_llamafactory_template_golden import load_templates  # noqa: E402

QWEN = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"}
LLAMA = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
CASES = [
    # template, tokenizer_config's tokens, add_bos_token, packing, cutoff_len, workers, batch
    (None, QWEN, False, True, 128, None, 1000),
    (None, QWEN, False, True, 128, 4, 5),
    (None, QWEN, False, True, 700, 3, 1000),
    (None, QWEN, False, False, 64, None, 1000),
    ("qwen3_nothink", QWEN, False, True, 256, None, 1000),
    ("llama3", LLAMA, False, True, 128, 2, 7),
    (None, LLAMA, True, True, 128, None, 1000),
    (None, LLAMA, True, False, 96, None, 1000),
    ("llama3", LLAMA, False, False, 5000, None, 1000),
]


def converted(root):
    from make_llamafactory_golden import load_llamafactory
    parser, converter = load_llamafactory(root)
    info = json.loads((DATA / "llamafactory" / "dataset_info.json").read_text())
    attr = parser.DatasetAttr("file", dataset_name="c4_demo")
    attr.join(info["c4_demo"])
    convert = converter.get_dataset_converter(attr.formatting, attr, types.SimpleNamespace(
        dataset_dir=str(DATA / "llamafactory"), media_dir=str(DATA / "llamafactory")))
    return [convert(r) for r in rows(DATA / "llamafactory" / "c4_demo.jsonl")]


def main():
    template_module, _ = load_templates(sys.argv[1])
    src = pathlib.Path(sys.argv[1]) / "src" / "llamafactory" / "data" / "processor"
    from make_llamafactory_golden import load_module
    pretrain = load_module("llamafactory.data.processor.pretrain", src / "pretrain.py")
    examples = converted(sys.argv[1])
    dataset = datasets.Dataset.from_dict({"_prompt": [e["_prompt"] for e in examples]})
    base = Tokenizer.from_file(str(DATA / "tokenizers" / "byte_level_chat.json"))
    cases = []
    for name, tokens, add_bos, packing, cutoff, workers, batch in CASES:
        tokenizer = PreTrainedTokenizerFast(tokenizer_object=base, **tokens)
        tokenizer.add_bos_token = add_bos
        size = len(tokenizer)
        data_args = types.SimpleNamespace(
            template=name, train_on_prompt=False, tool_format=None, default_system=None,
            enable_thinking=True, preserve_thinking=False, packing=packing, cutoff_len=cutoff)
        if name is not None:
            template_module.get_template_and_fix_tokenizer(tokenizer, data_args)
        elif tokenizer.pad_token is None:  # fix_special_tokens of the "empty" template
            tokenizer.pad_token = tokenizer.eos_token
        assert len(tokenizer) == size
        processor = pretrain.PretrainDatasetProcessor(
            template=None, tokenizer=tokenizer, processor=None, data_args=data_args)
        # datasets' map with num_proc: contiguous shards, each mapped alone.
        shards = min(workers or 1, len(dataset))
        blocks = []
        for index in range(shards):
            shard = dataset.shard(num_shards=shards, index=index, contiguous=True)
            out = shard.map(processor.preprocess_dataset, batched=True, batch_size=batch,
                            remove_columns=["_prompt"])
            blocks += out["input_ids"]
        collate = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm=False)
        labels = [collate([{"input_ids": ids}])["labels"][0].tolist() for ids in blocks]
        config = dict(tokens, add_bos_token=add_bos)
        cases.append({"template": name or "auto", "tokenizer_config": config, "packing": packing,
                      "cutoff_len": cutoff, "workers": workers or 1, "batch": batch,
                      "input_ids": blocks, "labels": labels})
    out = DATA / "llamafactory" / "pretrain_golden.json"
    out.write_text(json.dumps({"cases": cases}) + "\n")
    print(f"{len(cases)} cases, {sum(len(c['input_ids']) for c in cases)} blocks into {out}")


if __name__ == "__main__":
    main()
