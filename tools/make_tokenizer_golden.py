#!/usr/bin/env python3
"""Small tokenizers trained with Hugging Face `tokenizers`, and the ids it gives.

What it does
    Trains three BPE tokenizers on a deterministic mixed corpus (English, Chinese,
    Japanese, Korean, code, numbers, whitespace runs, emoji, accents), in the three
    tokenizer.json shapes ztrain reads:
      byte_level.json   GPT-2's: ByteLevel pre-tokenizer (its regex), ByteLevel decoder,
                        <|endoftext|> as a special token.
      split_regex.json  Llama 3's and Qwen2's: a Split pre-tokenizer with Llama 3's regex,
                        then ByteLevel without its own regex; BPE with ignore_merges.
      sentencepiece.json Llama 2's and TinyLlama's: Prepend and Replace normalizers to
                        U+2581, no pre-tokenizer, byte_fallback with <0x00>..<0xFF> in the
                        vocabulary, Replace/ByteFallback/Fuse/Strip decoder; and an added
                        token matched in the normalized text (<mask>).
      metaspace.json    the same model under the later conversion of those files (Mistral's):
                        a Metaspace pre-tokenizer (prepend_scheme "first", no split) and a
                        ByteFallback/Fuse/Metaspace decoder instead of the normalizers.
      metaspace_split.json the same with Metaspace's split: true (tokenizers' default, what
                        its SentencePieceBPETokenizer writes): the text is split at each U+2581
                        before the model sees it, so the three merges across words it adds
                        ("\u2581of" "\u2581the", ...) never apply.
    And one SentencePiece model, trained with the `sentencepiece` package as Llama 2's
    tokenizer.model was (BPE, byte_fallback, digits split, 1000 pieces): sp_bpe.model, whose
    golden ids and decoded texts are SentencePiece's own (ztrain runs it through
    libsentencepiece; the case checks the wiring and that Debian's library reads the model
    the same way).
    And golden_added.json: the committed split_regex.json with added tokens that overlap
    (<|end|>, <|end_of_turn|> and <|end_of, beside its <|end_of_text|>): the added_tokens
    entries tokenizers saves for them (the test puts them into split_regex.json) and its ids
    on overlap_inputs(). At each position the longest added token wins, as tokenizers'
    leftmost-longest matcher chooses (`--added-only` writes just this file, without
    retraining the others). `--metaspace-split-only` writes metaspace_split.json from the
    committed metaspace.json and adds its cases to golden.json, retraining nothing
    (SentencePiece-style training here does not give the same vocabulary order twice).
    And sp_unigram.model (`--sp-unigram-only`): a Unigram SentencePiece model on the same
    text, its cases added to golden.json; ztrain reads the BPE and Unigram kinds, each held
    to its golden cases, and refuses the others (char, word: sp_char.model, a small char
    model written beside it, is the refusal test's input).
    And golden_parts.json (`--parts-only`, from the committed files, retraining nothing):
    each part of tokenizer.json the five leave out (part_variants(): every Split behavior,
    Metaspace scheme, legacy add_prefix_space, Strip at either end, BPE flags, merges as
    strings, post-processor templates), set on one of them, with the ids of golden_inputs()
    and of INVALID_UTF8 as --replace-invalid-utf8 reads it, and the ids with the
    post-processor's special tokens; test_tokenizer.cpp checks that together they use every
    part ztrain reads.
    Then encodes every case of golden_inputs() with each (add_special_tokens=False) and
    writes golden.json: for each tokenizer and case, the text, the ids and the decoded
    text. ztrain's test (tests/unit/test_tokenizer.cpp) must give the same ids for every
    case and decode them to the same text.

How to rerun
    python3 -m venv /tmp/tokvenv && /tmp/tokvenv/bin/pip install tokenizers sentencepiece
    /tmp/tokvenv/bin/python tools/make_tokenizer_golden.py   # from the repo root

Versions used for the committed files: tokenizers 0.23.3, sentencepiece 0.2.3 (stored in
golden.json).
"""

import json
import os
import random

import tokenizers
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

# The tokenizers and golden files live beside the tests that read them.
HERE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data",
                    "tokenizers")
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def training_text():
    rng = random.Random(20261203)
    base = open(os.path.join(HERE, "corpus.txt"), encoding="utf-8").read()
    words = base.split()
    han = "的一是在不了有和人这中大为上个国我以要他时来用们生到作地于出就分对成会可主发年动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四日那社义事平形相全表间样与关各重新线内数正心反你明看原又么利比或但质气第向道命此变条只没结解问意建月公无系军很情者最立代想已通并提直题党程展五果料象员革位入常文总次品式活设及管特件长求老头基资边流路级少图山统接知较将组见计别她手角期根论运农指几九区强放决西被干做必战先回则任取据处队南给色光门即保治北造百规热领七海口东导器压志世金增争济阶油思术极交受联什认六共权收证改清己美再采转更单风切打白教速花带安场身车例真务具万每目至达走积示议声报斗完类八离华名确才科张信马节话米整空元况今集温传土许步群广石记需段研界拉林律叫且究观越织装影算低持音众书布复容儿须际商非验连断深难近矿千周委素技备半办青省列习响约支般史感劳便团往酸历市克何除消构府称太准精值号率族维划选标写存候毛亲快效斯院查江型眼王按格养易置派层片始却专状育厂京识适属圆包火住调满县局照参红细引听该铁价严龙飞"
    latin = "abcdefghijklmnopqrstuvwxyz"
    lines = [base] * 20
    for _ in range(3000):
        kind = rng.random()
        if kind < 0.4:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(3, 15))))
        elif kind < 0.7:
            lines.append("".join(rng.choice(han) for _ in range(rng.randint(5, 40))) + "。")
        elif kind < 0.85:
            lines.append(" ".join("".join(rng.choice(latin) for _ in range(rng.randint(1, 9)))
                                  for _ in range(rng.randint(3, 12))))
        else:
            lines.append(" ".join(str(rng.randint(0, 10 ** rng.randint(1, 9))) for _ in range(6)))
    return lines


def golden_inputs():
    base = open(os.path.join(HERE, "corpus.txt"), encoding="utf-8").read()
    cases = base.splitlines(keepends=True) + [base]
    cases += [
        "",
        " ",
        "   leading and trailing   ",
        "non\u00a0breaking\u00a0space and\u2003em space",
        "CRLF line\r\nnext line\r\n\r\n",
        "tabs\t\tand\n\n\nnewlines",
        "combining e\u0301 and precomposed \u00e9",
        "zero\u200bwidth and family \U0001F468\u200d\U0001F469\u200d\U0001F467",
        "<|endoftext|>",
        "text<|endoftext|>more text <|endoftext|> end",
        "<s>a</s> <unk> literal",
        "a <mask> b<mask>c <mask>",
        "words unseen in training: xylophone quokka 饕餮 Ω≈ç√∫",
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        "1234567890 12345678901234567890",
        "I'M SHOUTING, YOU'LL HEAR IT'S LOUD; we'Re Mixed",
        "\U0010FFFF private use \ue000 and replacement \ufffd",
    ]
    return cases


def byte_level(lines):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def split_regex(lines):
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000,
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def sentencepiece(lines):
    normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                       normalizers.Replace(" ", "\u2581")])
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>", "<s>", "</s>"],
                                  show_progress=False, limit_alphabet=300)
    # Trained on short pieces (SentencePiece's pieces never span much), then
    # rebuilt as Llama 2's files are: <unk> <s> </s>, the 256 byte tokens, the rest.
    tok.train_from_iterator([w for line in lines for w in line.split(" ")], trainer)
    trained = json.loads(tok.to_str())["model"]
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for piece, _ in sorted(trained["vocab"].items(), key=lambda kv: kv[1]):
        if piece not in vocab:
            vocab[piece] = len(vocab)
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    out = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True,
                               fuse_unk=True))
    out.normalizer = normalizer
    out.add_special_tokens(["<unk>", "<s>", "</s>"])
    # An added token matched in the normalized text, as GPT-2's file marks its own.
    out.add_tokens([tokenizers.AddedToken("<mask>", normalized=True, special=False)])
    out.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return out


def metaspace(sp, split=False):
    out = Tokenizer.from_str(sp.to_str())
    out.normalizer = None
    out.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=split)
    out.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Metaspace(replacement="\u2581",
                                                        prepend_scheme="first", split=split)])
    return out


def sentencepiece_model(lines, model_type="bpe", name="sp_bpe"):
    import io
    import sentencepiece as spm
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   model_type=model_type, vocab_size=1000, byte_fallback=True,
                                   split_digits=True, character_coverage=0.9995,
                                   num_threads=1, minloglevel=2)
    path = os.path.join(HERE, name + ".model")
    open(path, "wb").write(model.getvalue())
    return spm.SentencePieceProcessor(model_file=path)


OVERLAP_TOKENS = ["<|end|>", "<|end_of_turn|>", "<|end_of"]


def overlap_inputs():
    return [
        "<|end_of_text|>",
        "<|end_of_turn|><|end|>",
        "a<|end_of b<|end_of_tur c<|end_of_turn|>d",
        "<|end|>_of_text|> and <|end_of_text|><|end_of_turn|>",
        "<|end<|end|><|end_of<|end_of_text|>",
        "no added token here",
    ]


def added_overlap():
    tok = Tokenizer.from_file(os.path.join(HERE, "split_regex.json"))
    before = len(json.loads(tok.to_str())["added_tokens"])
    tok.add_special_tokens(OVERLAP_TOKENS)
    added = json.loads(tok.to_str())["added_tokens"][before:]
    cases = []
    for text in overlap_inputs():
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    golden = {"generator": "tools/make_tokenizer_golden.py --added-only",
              "tokenizers": tokenizers.__version__, "base": "split_regex.json",
              "added_tokens": added, "tokenizers_cases": {"added_overlap": cases}}
    with open(os.path.join(HERE, "golden_added.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("added_overlap", tok.get_vocab_size(), "tokens;", sum(len(c["ids"]) for c in cases), "ids")


def metaspace_split_only():
    """metaspace_split.json from the committed metaspace.json (the same model,
    without retraining, whose vocabulary order is not reproducible) and its
    cases added to the committed golden.json."""
    # Merges across a word boundary ("▁of" "▁the"), which split: true keeps
    # from applying and split: false would apply: the ids tell the two apart.
    model = json.load(open(os.path.join(HERE, "metaspace.json"), encoding="utf-8"))
    vocab, merges = model["model"]["vocab"], model["model"]["merges"]
    for a, b in (("\u2581of", "\u2581the"), ("\u2581in", "\u2581the"), ("\u2581and", "\u2581a")):
        vocab[a + b] = max(vocab.values()) + 1
        merges.append([a, b])
    tok = metaspace(Tokenizer.from_str(json.dumps(model)), split=True)
    tok.save(os.path.join(HERE, "metaspace_split.json"))
    path = os.path.join(HERE, "golden.json")
    golden = json.load(open(path, encoding="utf-8"))
    cases = []
    across = ["one of the words in the text, and a word of the end", "of the in the and a"]
    for text in golden_inputs() + across:
        ids = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
    golden["tokenizers_cases"]["metaspace_split"] = cases
    with open(path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("metaspace_split", tok.get_vocab_size(), "tokens;", sum(len(c["ids"]) for c in cases), "ids")


# The parts of tokenizer.json ztrain reads that the five tokenizers above do not
# all show, each set on one of them: (name, base file, edit). An edit replaces
# top-level parts ("normalizer", "pre_tokenizer", "decoder", "post_processor",
# "added_tokens") with what tokenizers itself serializes, sets model flags
# ("model": {...}), or writes the model's merges in the older "a b" form
# ("merges": "strings"); test_tokenizer.cpp applies the same edit to the same
# base. Every variant is loaded by tokenizers (Tokenizer.from_str) from the
# edited JSON, so a legacy field (Metaspace's add_prefix_space) is read as
# tokenizers reads it (and what it refuses, test_tokenizer.cpp refuses).
def serialized(part):
    holder = Tokenizer(models.BPE())
    kind = {pre_tokenizers.PreTokenizer: "pre_tokenizer", decoders.Decoder: "decoder",
            normalizers.Normalizer: "normalizer"}
    for cls, key in kind.items():
        if isinstance(part, cls):
            setattr(holder, key, part)
            return json.loads(holder.to_str())[key]
    holder.post_processor = part
    return json.loads(holder.to_str())["post_processor"]


def part_variants():
    from tokenizers import processors
    P, D, N = pre_tokenizers, decoders, normalizers
    bl = D.ByteLevel()
    sp_decoder = [D.Replace("\u2581", " "), D.ByteFallback(), D.Fuse()]
    legacy_metaspace = dict(serialized(P.Metaspace(prepend_scheme="always", split=False)))
    del legacy_metaspace["prepend_scheme"]
    legacy_metaspace["add_prefix_space"] = True
    # tokenizers refuses add_prefix_space false unless prepend_scheme says never.
    legacy_no_prefix = dict(legacy_metaspace, add_prefix_space=False, prepend_scheme="never")
    template = lambda start, ids: processors.TemplateProcessing(
        single=f"{start} $A", special_tokens=[(start, ids)])
    return [
        ("byte_level_prefix", "byte_level.json",
         {"pre_tokenizer": serialized(P.ByteLevel(add_prefix_space=True)),
          "decoder": serialized(bl), "post_processor": serialized(processors.ByteLevel())}),
        ("split_string_removed", "split_regex.json",
         {"pre_tokenizer": serialized(P.Sequence([P.Split(" ", behavior="removed"),
                                                  P.ByteLevel(False, use_regex=False)]))}),
        ("split_merged_previous", "split_regex.json",
         {"pre_tokenizer": serialized(P.Sequence([
             P.Split(Regex(r"\s+"), behavior="merged_with_previous"),
             P.ByteLevel(False, use_regex=False)]))}),
        ("split_merged_next", "split_regex.json",
         {"pre_tokenizer": serialized(P.Sequence([
             P.Split(Regex(r"[,.;:!?]"), behavior="merged_with_next"),
             P.ByteLevel(False, use_regex=False)]))}),
        ("split_string_isolated", "split_regex.json",
         {"pre_tokenizer": serialized(P.Sequence([P.Split("the", behavior="isolated"),
                                                  P.ByteLevel(False, use_regex=False)]))}),
        ("byte_level_merges_as_strings", "byte_level.json", {"merges": "strings"}),
        ("metaspace_always", "metaspace.json",
         {"pre_tokenizer": serialized(P.Metaspace(prepend_scheme="always", split=False)),
          "decoder": serialized(D.Sequence([D.ByteFallback(), D.Fuse(),
                                            D.Metaspace(prepend_scheme="always")]))}),
        ("metaspace_never", "metaspace.json",
         {"pre_tokenizer": serialized(P.Metaspace(prepend_scheme="never", split=True)),
          "decoder": serialized(D.Sequence([D.ByteFallback(), D.Fuse(),
                                            D.Metaspace(prepend_scheme="never")]))}),
        ("metaspace_legacy_prefix", "metaspace.json",
         {"pre_tokenizer": legacy_metaspace,
          "decoder": {"type": "Sequence", "decoders": [
              serialized(D.ByteFallback()), serialized(D.Fuse()),
              {"type": "Metaspace", "replacement": "\u2581", "add_prefix_space": True}]}}),
        ("metaspace_legacy_no_prefix", "metaspace.json", {"pre_tokenizer": legacy_no_prefix}),
        ("metaspace_other_replacement", "metaspace.json",
         {"pre_tokenizer": serialized(P.Metaspace(replacement="_", prepend_scheme="first")),
          "decoder": serialized(D.Sequence([D.ByteFallback(), D.Fuse(),
                                            D.Metaspace(replacement="_",
                                                        prepend_scheme="first")]))}),
        ("sentencepiece_strip_both", "sentencepiece.json",
         {"decoder": serialized(D.Sequence(sp_decoder + [D.Strip(" ", 1, 1)]))}),
        ("sentencepiece_strip_end", "sentencepiece.json",
         {"decoder": serialized(D.Sequence(sp_decoder + [D.Strip(" ", 0, 2)]))}),
        ("sentencepiece_no_byte_fallback", "sentencepiece.json",
         {"model": {"byte_fallback": False}}),
        ("sentencepiece_unk_unfused", "sentencepiece.json",
         {"model": {"byte_fallback": False, "fuse_unk": False}}),
        ("sentencepiece_one_normalizer", "sentencepiece.json",
         {"normalizer": serialized(N.Replace(" ", "\u2581")),
          "pre_tokenizer": None}),
        ("sentencepiece_prepend_only", "sentencepiece.json",
         {"normalizer": serialized(N.Prepend("\u2581"))}),
        ("llama2_template", "sentencepiece.json",
         {"post_processor": serialized(template("<s>", 1))}),
        ("llama3_template", "split_regex.json",
         {"post_processor": serialized(processors.Sequence([
             processors.ByteLevel(trim_offsets=False), template("<|begin_of_text|>", 0)]))}),
        ("template_without_start", "split_regex.json",
         {"post_processor": serialized(processors.TemplateProcessing(single="$A"))}),
        ("added_raw_and_normal", "split_regex.json",
         {"added_tokens": json.loads(Tokenizer.from_file(os.path.join(HERE, "split_regex.json"))
                                     .to_str())["added_tokens"] + [
             {"id": 3000, "content": " plain", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": False},
             {"id": 3001, "content": "<tool>", "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": True, "special": True}]}),
    ]


def edited(base, edit):
    j = json.load(open(os.path.join(HERE, base), encoding="utf-8"))
    for key, value in edit.items():
        if key == "model":
            j["model"].update(value)
        elif key == "merges":
            j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
        else:
            j[key] = value
    return j


# Bytes that are not UTF-8, as ztrain prepare --replace-invalid-utf8 takes them:
# each bad sequence becomes U+FFFD as Rust's from_utf8_lossy (and Python's
# "replace") decide, then the text is encoded.
INVALID_UTF8 = [b"a\xc3(b", b"cut \xe2\x82", b"surrogate \xed\xa0\x80 end", b"\xf0\x9f\x9a",
                b"over \xf4\x90\x80\x80", b"overlong \xc0\xaf", b"\xff\xfe words \x80",
                b"mixed \xe4\xb8\xad\xe6 text \xf0\x9f\x9a\x80"]


def parts_only():
    """golden_parts.json: each part variant's edit and the ids tokenizers gives
    on golden_inputs() and on INVALID_UTF8 (with and without the
    post-processor's special tokens), from the committed base files."""
    variants = []
    for name, base, edit in part_variants():
        tok = Tokenizer.from_str(json.dumps(edited(base, edit)))
        cases = []
        texts = [(t, None) for t in golden_inputs()]
        texts += [(b.decode("utf-8", "replace"), b.hex()) for b in INVALID_UTF8]
        for text, raw in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            case = {"text": text, "ids": ids,
                    "with_special": tok.encode(text, add_special_tokens=True).ids}
            try:
                case["decoded"] = tok.decode(ids, skip_special_tokens=False)
            except BaseException:  # Strip with stop > 0 panics on no tokens at all
                pass
            if raw is not None:
                case["bytes"] = raw
            cases.append(case)
        variants.append({"name": name, "base": base, "edit": edit, "cases": cases})
        print(name, sum(len(c["ids"]) for c in cases), "ids")
    golden = {"generator": "tools/make_tokenizer_golden.py --parts-only",
              "tokenizers": tokenizers.__version__, "variants": variants}
    with open(os.path.join(HERE, "golden_parts.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


def sp_unigram_only():
    """sp_unigram.model, a Unigram SentencePiece model (T5's and the first Llama
    conversions' kind), trained on the same text, and its cases added to the
    committed golden.json."""
    import sentencepiece as spm
    sp_model = sentencepiece_model(training_text(), "unigram", "sp_unigram")
    path = os.path.join(HERE, "golden.json")
    golden = json.load(open(path, encoding="utf-8"))
    cases = []
    for text in golden_inputs():
        ids = sp_model.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": sp_model.decode(ids)})
    golden["tokenizers_cases"]["sp_unigram"] = cases
    golden["sentencepiece"] = spm.__version__
    with open(path, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print("sp_unigram", sp_model.get_piece_size(), "pieces;", sum(len(c["ids"]) for c in cases), "ids")
    # A char model, which ztrain refuses (no golden case): the test's input.
    import io
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(training_text()[:200]),
                                   model_writer=model, model_type="char", vocab_size=120,
                                   normalization_rule_name="identity",
                                   num_threads=1, minloglevel=2)
    open(os.path.join(HERE, "sp_char.model"), "wb").write(model.getvalue())


def main():
    import sys
    if "--sp-unigram-only" in sys.argv:
        sp_unigram_only()
        return
    if "--parts-only" in sys.argv:
        parts_only()
        return
    if "--added-only" in sys.argv:
        added_overlap()
        return
    if "--metaspace-split-only" in sys.argv:
        metaspace_split_only()
        return
    lines = training_text()
    sp = sentencepiece(lines)
    made = {"byte_level": byte_level(lines), "split_regex": split_regex(lines),
            "sentencepiece": sp, "metaspace": metaspace(sp),
            "metaspace_split": metaspace(sp, split=True)}
    golden = {"generator": "tools/make_tokenizer_golden.py",
              "tokenizers": tokenizers.__version__, "tokenizers_cases": {}}
    for name, tok in made.items():
        tok.save(os.path.join(HERE, name + ".json"))
        cases = []
        for text in golden_inputs():
            ids = tok.encode(text, add_special_tokens=False).ids
            cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids, skip_special_tokens=False)})
        golden["tokenizers_cases"][name] = cases
        print(name, tok.get_vocab_size(), "tokens;", sum(len(c["ids"]) for c in cases), "ids")
    import sentencepiece as spm
    sp_model = sentencepiece_model(lines)
    golden["sentencepiece"] = spm.__version__
    cases = []
    for text in golden_inputs():
        ids = sp_model.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": sp_model.decode(ids)})
    golden["tokenizers_cases"]["sp_bpe"] = cases
    print("sp_bpe", sp_model.get_piece_size(), "pieces;", sum(len(c["ids"]) for c in cases), "ids")
    with open(os.path.join(HERE, "golden.json"), "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, indent=1)
        f.write("\n")
    added_overlap()


if __name__ == "__main__":
    main()
