"""The tokenizer built from a GGUF's own metadata (mlx_lm_batched.loading.gguf_tokenizer).

References: transformers' GGUF tokenizer conversion (its GGUF reader needs torch, so it is
an oracle here only), a sentencepiece model rebuilt from Gemma's GGUF vocabulary (an
independent implementation of SentencePiece BPE), and tiny GGUFs written by the tests for
the kinds the demo models do not cover.
"""

import json
import os
from pathlib import Path

import pytest

from mlx_lm_batched.tokenization.detokenizers import (
    BPEStreamingDetokenizer,
    SPMStreamingDetokenizer,
)
from mlx_lm_batched.loading.gguf import _parse
from mlx_lm_batched.loading.gguf_tokenizer import (
    TOKENIZER_VERSION,
    build_gguf_tokenizer,
    save_gguf_tokenizer,
)
from mlx_lm_batched.tokenizer_utils import load_tokenizer

import transformers

TEXTS = [
    "Hello world",
    "  leading,   inner\t\ttabs\n\nnewlines and trailing  ",
    " " * 40 + "x" + " " * 70,
    "12345 and 3.14159, year 2024",
    "def f(x):\n    return {'a': [1, 2]}  # comment\n",
    "naïve café résumé Ångström",
    "日本語のテキスト 中文 한국어",
    "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧",
    "a . b , c ! d ?",
    "\u2581 a literal ▁▁ meta space, \x00\x01 controls, \u200b zero width",
]
CORPUS = (Path(__file__).parent / "data" / "corpus.txt").read_text(encoding="utf-8")
SAMPLES = TEXTS + [line for line in CORPUS.splitlines() if line] + [CORPUS]




def _ours(path, out):
    save_gguf_tokenizer(path, out)
    return transformers.AutoTokenizer.from_pretrained(out)


@pytest.fixture(scope="module")
def smol_dir(smol_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("smol_tok")
    save_gguf_tokenizer(smol_path, out)
    return out


@pytest.fixture(scope="module")
def gemma_dir(gemma_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma_tok")
    save_gguf_tokenizer(gemma_path, out)
    return out


@pytest.fixture(scope="module")
def smol_tok(smol_dir):
    return transformers.AutoTokenizer.from_pretrained(smol_dir)


@pytest.fixture(scope="module")
def gemma_tok(gemma_dir):
    return transformers.AutoTokenizer.from_pretrained(gemma_dir)


def _transformers_gguf(cls, path):
    """transformers' own tokenizer for a GGUF (its GGUF reader imports torch)."""
    path = os.path.abspath(path)
    return cls.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path), local_files_only=True)


def _backend(tok):
    return json.loads(tok.backend_tokenizer.to_str())


def _sentencepiece(md, add_dummy_prefix=False, respell_spaces=False):
    """A sentencepiece BPE model with the GGUF's pieces, scores and piece types (the GGUF
    keeps sentencepiece's type numbers)."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    model = pb.ModelProto()
    model.trainer_spec.model_type = pb.TrainerSpec.BPE
    model.trainer_spec.byte_fallback = True
    for name in ("unk", "bos", "eos", "pad"):
        key = {"unk": "unknown", "pad": "padding"}.get(name, name)
        setattr(model.trainer_spec, f"{name}_id", md.get(f"tokenizer.ggml.{key}_token_id", -1))
    spec = model.normalizer_spec
    spec.name, spec.add_dummy_prefix, spec.remove_extra_whitespaces, spec.escape_whitespaces = (
        "identity", add_dummy_prefix, False, True)
    for token, score, kind in zip(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.scores"],
                                  md["tokenizer.ggml.token_type"]):
        piece = model.pieces.add()
        # Gemma's GGUF spells its whitespace runs with real spaces; sentencepiece uses "▁".
        piece.piece = "\u2581" * len(token) if respell_spaces and token and not token.strip(" ") else token
        piece.score, piece.type = score, kind
    return spm.SentencePieceProcessor(model_proto=model.SerializeToString())


# --- SmolLM2: byte-level BPE ("gpt2", pre "smollm") ---------------------------------------

def test_smollm2_matches_transformers_conversion(smol_path, smol_tok):
    ref = _transformers_gguf(transformers.PreTrainedTokenizerFast, smol_path)
    ours, theirs = _backend(smol_tok), _backend(ref)
    assert ours["model"] == theirs["model"]  # vocab, merges and BPE options
    assert ours["added_tokens"] == theirs["added_tokens"]
    assert ours["decoder"] == theirs["decoder"] and ours["normalizer"] == theirs["normalizer"] is None
    # llama.cpp's "smollm" pre-tokenizer splits digits one by one before the GPT-2 regex,
    # as the original SmolLM2 tokenizer.json does; transformers' conversion leaves that out.
    assert [p["type"] for p in ours["pre_tokenizer"]["pretokenizers"]] == ["Digits", "ByteLevel"]
    compared = 0
    for text in SAMPLES + ["<|im_start|>user\nHi<|im_end|>\n<|endoftext|>"]:
        ids = smol_tok.encode(text, add_special_tokens=True)
        if not any(c.isdigit() for c in text):
            assert ids == ref.encode(text, add_special_tokens=True), text
            compared += 1
        pieces = smol_tok.convert_ids_to_tokens(ids)
        assert all(len(p.lstrip("Ġ")) == 1 for p in pieces if any(c.isdigit() for c in p)), pieces
    assert compared > 10
    for name in ("bos_token", "eos_token", "unk_token", "pad_token", "chat_template"):
        assert getattr(smol_tok, name) == getattr(ref, name), name


def test_smollm2_tokenizer(smol_path, smol_tok):
    assert smol_tok.encode("12345") == [smol_tok.convert_tokens_to_ids(c) for c in "12345"]  # Digits step
    assert smol_tok.convert_ids_to_tokens(smol_tok.encode(" 42")) == ["Ġ", "4", "2"]
    assert smol_tok.encode("hi")[0] != smol_tok.bos_token_id  # no BOS for SmolLM2
    assert (smol_tok.bos_token, smol_tok.eos_token, smol_tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert smol_tok.encode("<|im_start|>x<|im_end|>")[::2] == [1, 2]  # control tokens stay whole
    md = _parse(smol_path, with_tensors=False)[0]
    assert smol_tok.chat_template == md["tokenizer.chat_template"]
    text = smol_tok.apply_chat_template([{"role": "user", "content": "Hi 123"}], tokenize=False,
                                        add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nHi 123<|im_end|>\n<|im_start|>assistant\n")
    ids = smol_tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True)
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    assert ids[0] == smol_tok.convert_tokens_to_ids("<|im_start|>")


# --- Gemma 3: SentencePiece BPE with byte fallback ("llama") ------------------------------

def test_gemma3_matches_transformers_conversion(gemma_path, gemma_tok):
    ref = _transformers_gguf(transformers.GemmaTokenizer, gemma_path)
    ours, theirs = _backend(gemma_tok), _backend(ref)
    assert ours["model"] == theirs["model"]  # vocab, 514k merges derived in the same order
    assert ours["normalizer"] == theirs["normalizer"] and ours["decoder"] == theirs["decoder"]
    # Ours adds the 2..31-space runs as normalized tokens, matched longest first.
    runs = [t for t in ours["added_tokens"] if t["normalized"]]
    assert [t["content"] for t in runs] == ["\u2581" * n for n in range(2, 32)]
    assert [t["id"] for t in runs] == list(range(138, 168))
    assert [t for t in ours["added_tokens"] if not t["normalized"]] == theirs["added_tokens"]
    # Same ids wherever no whitespace run is longer than 31 (where transformers' BPE splits differ).
    texts = [t for t in SAMPLES if " " * 32 not in t] + ["<start_of_turn>user\nhi<end_of_turn>\n"]
    assert len(texts) > 10
    for text in texts:
        assert gemma_tok.encode(text) == ref.encode(text), text
    for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
        assert getattr(gemma_tok, name) == getattr(ref, name), name


def test_gemma3_matches_sentencepiece(gemma_path, gemma_tok):
    md = _parse(gemma_path, with_tensors=False)[0]
    sp = _sentencepiece(md, respell_spaces=True)
    runs = [c * n + "x" for c in " \t\n" for n in (1, 2, 31, 32, 40, 63, 100)]
    for text in SAMPLES + runs:
        assert gemma_tok.encode(text, add_special_tokens=False) == sp.encode(text), repr(text)


def test_gemma3_tokenizer(gemma_tok):
    ids = gemma_tok.encode("Hello")
    assert ids[0] == gemma_tok.bos_token_id == 2 and gemma_tok.bos_token == "<bos>"
    assert gemma_tok.eos_token == "<eos>" and gemma_tok.pad_token == "<pad>"
    assert gemma_tok.convert_ids_to_tokens(gemma_tok.encode(" " * 40 + "x", add_special_tokens=False)) == [
        "\u2581" * 31, "\u2581" * 9, "x"]
    assert gemma_tok.encode("  two", add_special_tokens=False) == [138, gemma_tok.convert_tokens_to_ids("two")]
    assert gemma_tok.chat_template is None  # this GGUF has none


@pytest.mark.parametrize("which", ["smol", "gemma"])
def test_round_trips_and_streaming(which, request):
    """decode(encode(text)) == text, and the streaming detokenizer the loader picks
    reproduces decode token by token."""
    out = request.getfixturevalue(f"{which}_dir")
    wrapper = load_tokenizer(out)
    expect = BPEStreamingDetokenizer if which == "smol" else SPMStreamingDetokenizer
    assert type(wrapper.make_detokenizer()) is expect
    for text in TEXTS:
        if which == "gemma" and "\u2581" in text:
            continue  # sentencepiece spells spaces "▁", so a literal one decodes as a space
        ids = wrapper.encode(text, add_special_tokens=False)
        assert wrapper.decode(ids) == text
        detok = wrapper.make_detokenizer()
        for i in ids:
            detok.add_token(i)
        detok.finalize()
        assert detok.text == text


# --- Tiny GGUFs for the other supported shapes --------------------------------------------

def _write_gguf(path, tokenizer_model, tokens, types, scores=None, merges=None, **keys):
    """A one-tensor llama GGUF with the given tokenizer metadata."""
    import gguf
    import numpy as np

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_block_count(1)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    if scores is not None:
        writer.add_token_scores(scores)
    if merges is not None:
        writer.add_token_merges(merges)
    for key, value in keys.items():
        getattr(writer, f"add_{key}")(value)
    writer.add_tensor("token_embd.weight", np.zeros((len(tokens), 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


def _llama_spm_gguf(path, **keys):
    """Llama-2-style sentencepiece vocabulary: specials, 256 byte pieces, scored pieces."""
    words = ["▁", "e", "h", "l", "o", "w", "r", "d", "t", "▁h", "he", "ll", "lo", "llo", "▁he", "hello",
             "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "▁the", "th", "▁t", "▁▁"]
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + words
    types = [2, 3, 3] + [6] * 256 + [1] * len(words)
    scores = [0.0] * 259 + [-float(i) for i in range(len(words))]
    return _write_gguf(path, "llama", tokens, types, scores, bos_token_id=1, eos_token_id=2,
                       unk_token_id=0, **keys)


LLAMA_TEXTS = ["hello world", " hello  world", "the hello", "héllo wörld 😀", "hello\nworld", "  ", "low"]


@pytest.mark.parametrize("prefix", [True, False])
def test_llama_sentencepiece_gguf(tmp_path, prefix):
    path = _llama_spm_gguf(tmp_path / "spm.gguf", add_space_prefix=prefix)
    md = _parse(path, with_tensors=False)[0]
    tok = _ours(path, tmp_path / "out")
    sp = _sentencepiece(md, add_dummy_prefix=prefix)
    for text in LLAMA_TEXTS:
        assert tok.encode(text) == [1] + sp.encode(text), text  # BOS by default for "llama"
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    detok = load_tokenizer(tmp_path / "out").make_detokenizer()
    assert type(detok) is SPMStreamingDetokenizer and detok.trim_space == prefix
    if prefix:  # transformers' conversion always prepends the space
        ref = _transformers_gguf(transformers.LlamaTokenizer, path)
        ours, theirs = _backend(tok)["model"], _backend(ref)["model"]
        assert (ours["vocab"], ours["merges"]) == (theirs["vocab"], theirs["merges"])
        # It leaves out the prefix before a leading space, unlike sentencepiece and llama.cpp.
        texts = [t for t in LLAMA_TEXTS if not t.startswith(" ")]
        assert [tok.encode(t) for t in texts] == [ref.encode(t) for t in texts]
        assert tok.encode(" hello") == [1, tok.convert_tokens_to_ids("▁"), tok.convert_tokens_to_ids("▁hello")]
        assert ref.encode(" hello") == [1, tok.convert_tokens_to_ids("▁hello")]


def _byte_level_gguf(path, pre):
    from mlx_lm_batched.loading.gguf_tokenizer import _byte_alphabet

    alphabet = _byte_alphabet()
    merges = ["3 4", "Ġ t", "h e", "Ġt he", "1 2", "12 3", "' s", "i t", "Ġ 1", "Ġ1 2", "Ġ12 3", "Ċ Ċ"]
    words = [m.replace(" ", "") for m in merges]
    tokens = ["<|endoftext|>"] + [alphabet[b] for b in range(256)] + words
    return _write_gguf(path, "gpt2", tokens, [3] + [1] * (len(tokens) - 1), merges=merges,
                       tokenizer_pre=pre, bos_token_id=0, eos_token_id=0, add_bos_token=False)


BYTE_TEXTS = ["the 12345 it's", "12345678", "\n\n\nthe", "the  12 3 ", "it's<|endoftext|>"]


def test_byte_level_llama3_split(tmp_path):
    """llama.cpp's "llama-bpe" (Llama 3) split: digits in groups of three."""
    path = _byte_level_gguf(tmp_path / "bpe.gguf", "llama-bpe")
    tok = _ours(path, tmp_path / "out")
    pieces = tok.convert_ids_to_tokens(tok.encode("12345678"))
    assert pieces == ["123", "4", "5", "6", "7", "8"]  # "123" "456" "78", then BPE within each
    assert tok.convert_ids_to_tokens(tok.encode(" 1")) == ["Ġ", "1"]  # digits never take the space
    ref = _transformers_gguf(transformers.PreTrainedTokenizerFast, path)
    for text in BYTE_TEXTS:
        assert tok.encode(text) == ref.encode(text), text
        assert tok.decode(tok.encode(text)) == text


def test_unknown_pre_tokenizer_warns(tmp_path):
    path = _byte_level_gguf(tmp_path / "bpe.gguf", "some-new-model")
    with pytest.warns(UserWarning, match="'some-new-model' is not known"):
        tok = _ours(path, tmp_path / "out")
    # GPT-2's split: a digit run is one piece, with the space before it ("3 4" merges first).
    assert tok.convert_ids_to_tokens(tok.encode("12345678")) == ["12", "34", "5", "6", "7", "8"]
    assert tok.convert_ids_to_tokens(tok.encode(" 1")) == ["Ġ1"]


def test_unsupported_tokenizer_model(tmp_path):
    path = _write_gguf(tmp_path / "t5.gguf", "t5", ["<pad>", "a"], [3, 1], [0.0, -1.0])
    with pytest.raises(ValueError, match=r"tokenizer.ggml.model 't5'; supported: gpt2, llama"):
        save_gguf_tokenizer(path, tmp_path / "out")
    with pytest.raises(ValueError, match="'t5'"):
        build_gguf_tokenizer(_parse(path, with_tensors=False)[0], "llama")


def test_cache_dir_changes_with_tokenizer_version(smol_path, monkeypatch, tmp_path):
    """A tokenizer directory written by an older builder is not reused."""
    from mlx_lm_batched.loading import gguf_tokenizer, load as utils

    monkeypatch.setenv("MLX_LM_BATCHED_CACHE", str(tmp_path))
    current = utils._gguf_tokenizer_dir(smol_path)
    assert current.parent == tmp_path / "gguf_tokenizers"
    monkeypatch.setattr(gguf_tokenizer, "TOKENIZER_VERSION", TOKENIZER_VERSION + 1)
    assert utils._gguf_tokenizer_dir(smol_path) != current


def test_saved_tokenizer_config(smol_dir, gemma_dir):
    for out, bos in ((smol_dir, False), (gemma_dir, True)):
        config = json.loads((out / "tokenizer_config.json").read_text())
        # A class name transformers 4 knows too (5 writes "TokenizersBackend").
        assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
        assert config["add_bos_token"] is bos and config["add_eos_token"] is False
        assert config["clean_up_tokenization_spaces"] is False
