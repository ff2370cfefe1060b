#!/usr/bin/env python3
"""Golden alignments of tests/data/llamafactory by LLaMA-Factory's own code.

Runs LLaMA-Factory's dataset converters (src/llamafactory/data/converter.py,
the code that turns alpaca, sharegpt and openai rows into prompt/response
turns) on every row of every dataset in tests/data/llamafactory/
dataset_info.json that LLaMA-Factory reads locally, and writes golden.json:
per dataset, each row's system, tools and turns (prompt + response), or
null where LLaMA-Factory's supervised preprocessing would drop the row
(broken turns, an odd count, no response). test_sft_dataset compares
ztrain's reader with it row by row.

Only the converters and DatasetAttr are loaded from a LLaMA-Factory
checkout, with its logging and the hub helpers stubbed, so neither torch
nor datasets is needed. Development only.

usage: tools/make_llamafactory_golden.py LLAMAFACTORY_CHECKOUT [OUT_JSON]
"""
import enum
import importlib.util
import json
import pathlib
import sys
import types

HERE = pathlib.Path(__file__).resolve().parent.parent / "tests" / "data" / "llamafactory"


def load_module(name, file):
    """One file of the checkout as module `name`, without its package's __init__."""
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_llamafactory(root):
    src = pathlib.Path(root) / "src" / "llamafactory"

    def package(name, path):
        m = types.ModuleType(name)
        m.__path__ = [str(path)]
        sys.modules[name] = m
        return m

    package("llamafactory", src)
    package("llamafactory.data", src / "data")
    extras = package("llamafactory.extras", src / "extras")
    logging = types.ModuleType("llamafactory.extras.logging")

    class Quiet:
        def __getattr__(self, name):
            return lambda *a, **k: None

    logging.get_logger = lambda *a, **k: Quiet()
    sys.modules["llamafactory.extras.logging"] = logging
    extras.logging = logging
    data_utils = types.ModuleType("llamafactory.data.data_utils")

    class Role(str, enum.Enum):
        USER = "user"
        ASSISTANT = "assistant"
        SYSTEM = "system"
        FUNCTION = "function"
        OBSERVATION = "observation"

    data_utils.Role = Role
    sys.modules["llamafactory.data.data_utils"] = data_utils
    constants = types.ModuleType("llamafactory.extras.constants")
    constants.DATA_CONFIG = "dataset_info.json"
    sys.modules["llamafactory.extras.constants"] = constants
    misc = types.ModuleType("llamafactory.extras.misc")
    misc.use_modelscope = misc.use_openmind = lambda: False
    sys.modules["llamafactory.extras.misc"] = misc
    hub = types.ModuleType("huggingface_hub")
    hub.hf_hub_download = None
    sys.modules.setdefault("huggingface_hub", hub)

    parser = load_module("llamafactory.data.parser", src / "data" / "parser.py")
    converter = load_module("llamafactory.data.converter", src / "data" / "converter.py")
    return parser, converter


def rows(path):
    text = path.read_text()
    if path.suffix == ".json" and text.lstrip().startswith("["):
        return json.loads(text)
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def main():
    parser, converter = load_llamafactory(sys.argv[1])
    out = pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else HERE / "golden.json"
    info = json.loads((HERE / "dataset_info.json").read_text())
    data_args = types.SimpleNamespace(dataset_dir=str(HERE), media_dir=str(HERE))
    golden = {}
    for name, entry in info.items():
        if "file_name" not in entry:
            continue
        attr = parser.DatasetAttr("file", dataset_name=name)
        attr.join(entry)
        convert = converter.get_dataset_converter(attr.formatting, attr, data_args)
        aligned = []
        for row in rows(HERE / entry["file_name"]):
            try:
                example = convert(row) if isinstance(row, dict) else None
            except (KeyError, TypeError, IndexError):
                example = None
            # LLaMA-Factory's supervised preprocessing keeps an example with
            # an odd number of prompt turns and one response.
            if example is None or len(example["_prompt"]) % 2 != 1 or len(example["_response"]) != 1:
                aligned.append(None)
                continue
            turns = [{"role": m["role"], "content": m["content"]} for m in example["_prompt"] + example["_response"]]
            aligned.append({"system": example["_system"], "tools": example["_tools"], "turns": turns})
        golden[name] = aligned
    out.write_text(json.dumps(golden, ensure_ascii=False, indent=1) + "\n")
    print(f"{sum(len(v) for v in golden.values())} rows of {len(golden)} datasets into {out}")


if __name__ == "__main__":
    main()
