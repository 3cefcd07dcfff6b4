"""Streaming detokenizers, detection, TokenizerWrapper and encode_prompt on real tokenizers.

Building the Gemma tokenizer from its GGUF takes ~30 s (262k-token vocab), so each
GGUF-built tokenizer is saved once with save_pretrained under the temp dir, keyed by
GGUF file, size, mtime and transformers version; later runs load it in a few seconds.
"""

import json
import os
import random
import shutil
import tempfile
import uuid

import pytest

import mlx_lm_batched  # noqa: F401  (must precede any mlx import)
import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mlx_lm_batched.tokenization import detokenizers
from mlx_lm_batched import tokenizer_utils as tu
from mlx_lm_batched.demo_models import gemma3_gguf_path, smollm2_gguf_path

TEXTS = [
    "Hello, world!",
    " leading space",
    "   three leading spaces and  double  spaces   ",
    "line one\nline two\n\n\nafter blank lines\n",
    "\ttabs\tand\t\ttabs\n\t indented",
    "digits 0123456789 3.14159 -42 1e-9 100,000",
    "def f(x):\n    return {'a': [x, x ** 2]}  # code\n",
    "Accents: café, naïve, Ångström, ÉLAN, señor, Zürich",
    "CJK: 日本語のテキスト、中文字符，한국어 텍스트",
    "Emoji: 😀🦙🦜 👩‍💻 🏳️‍🌈 family 👨‍👩‍👧‍👦 done",
    "Rare chars: ꙮ 𓀀 𝔘𝔫𝔦 ⅷ ∮ ≠ ☃",
    "<b>markup</b> & entities &amp; \\escapes\\ \"quotes\" 'single'",
    "mixed 混合 text with 😀 emoji and\nnewlines 🦙\n",
]


def _cached_dir(gguf):
    st = os.stat(gguf)
    key = f"{os.path.basename(gguf)}-{st.st_size}-{int(st.st_mtime)}-tf{transformers.__version__}"
    path = os.path.join(tempfile.gettempdir(), "mlx_lm_batched_test_tokenizers", key)
    if not os.path.exists(os.path.join(path, "tokenizer.json")):
        tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
        tmp = f"{path}.{uuid.uuid4().hex}"
        tok.save_pretrained(tmp)
        try:
            os.rename(tmp, path)  # atomic; a concurrent run may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return path


@pytest.fixture(scope="module")
def smol_dir():
    return _cached_dir(smollm2_gguf_path())


@pytest.fixture(scope="module")
def gemma_dir():
    return _cached_dir(gemma3_gguf_path())


@pytest.fixture(scope="module")
def smol(smol_dir):
    return tu.load_tokenizer(smol_dir)


@pytest.fixture(scope="module")
def gemma(gemma_dir):
    return tu.load_tokenizer(gemma_dir)


@pytest.fixture(scope="module")
def tiny_llama():
    """A tiny Llama-style SPM tokenizer (byte fallback, decoder Strip) built in memory:
    covers trim_space=True, which neither real tokenizer uses."""
    from tokenizers import Tokenizer, decoders, models, normalizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ["▁", "a", "b", "c", "▁a", "▁b", "ab", "▁ab", ",", "."]:
        vocab[piece] = len(vocab)
    merges = [("▁", "a"), ("▁", "b"), ("a", "b"), ("▁a", "b")]
    tk = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tk.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tk.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tk, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )
    return tu.TokenizerWrapper(hf)


def _kinds(wrapper):
    """Detokenizer makers to exercise: the detected kind, plus always naive.
    Prototypes are built once; a maker copies one (token maps are slow to build)."""
    naive = tu.TokenizerWrapper(wrapper._tokenizer, tu.NaiveStreamingDetokenizer)
    return [wrapper.make_detokenizer, naive.make_detokenizer]


def _stream(wrapper, make, ids):
    """Feed ids one at a time, checking the invariants at every step; return segments."""
    expected = wrapper.decode(ids)
    detok = make()
    segments, prev = [], ""
    for i, t in enumerate(ids):
        detok.add_token(t)
        text = detok.text
        assert text.startswith(prev), (i, prev, text)  # text only grows
        assert expected.startswith(text), (i, text, expected)  # and only with final text
        seg = detok.last_segment
        assert prev + seg == text
        if "\ufffd" not in expected:
            assert "\ufffd" not in seg, (i, seg)
        assert detok.last_segment == ""  # reading consumed it
        segments.append(seg)
        prev = text
    detok.finalize()
    segments.append(detok.last_segment)
    assert detok.tokens == list(ids)
    assert detok.text == expected
    assert "".join(segments) == expected
    return segments


@pytest.mark.parametrize("name", ["smol", "gemma", "tiny_llama"])
def test_streaming_matches_decode(request, name):
    wrapper = request.getfixturevalue(name)
    for make in _kinds(wrapper):
        for text in TEXTS:
            for specials in (False, True):
                ids = wrapper.encode(text, add_special_tokens=specials)
                _stream(wrapper, make, ids)


def test_gemma_splits_emoji_into_byte_tokens(gemma):
    """The texts really exercise byte-fallback runs, and they are held until complete."""
    ids = gemma.encode("🦙", add_special_tokens=False)
    pieces = gemma.convert_ids_to_tokens(ids)
    assert sum(p.startswith("<0x") for p in pieces) >= 2, pieces
    detok = gemma.make_detokenizer()
    for t in ids:
        detok.add_token(t)
        assert "\ufffd" not in detok.text
    detok.finalize()
    assert detok.text.endswith("🦙")


def test_chat_and_special_tokens_stream(smol, gemma):
    msgs = [{"role": "user", "content": "Hi 😀, 日本語?"}]
    ids = smol.apply_chat_template(msgs, add_generation_prompt=True)
    ids = ids + smol.encode("Sure! 🦙 ok", add_special_tokens=False) + [smol.eos_token_id]
    for make in _kinds(smol):
        segs = _stream(smol, make, ids)
        assert "<|im_start|>" in "".join(segs)  # specials are kept (skip_special_tokens=False)
    ids = gemma.encode("<start_of_turn>user\nhi<end_of_turn>\n") + [gemma.eos_token_id]
    for make in _kinds(gemma):
        assert "".join(_stream(gemma, make, ids)).startswith("<bos><start_of_turn>")


@pytest.mark.parametrize("name", ["smol", "gemma", "tiny_llama"])
def test_random_token_fuzz(request, name):
    """Arbitrary id sequences (invalid UTF-8, stray specials, unknown ids) still
    reproduce decode exactly with the fast detokenizers."""
    wrapper = request.getfixturevalue(name)
    rng = random.Random(0)
    n = len(wrapper)
    byte_ids = [i for i, p in enumerate(wrapper.convert_ids_to_tokens(list(range(n)))) if p.startswith("<0x")]
    low = list(range(min(n, 400)))  # single bytes in byte-level BPE, specials
    for _ in range(60):
        pool = rng.choice([byte_ids or low, low, range(n)])
        ids = [rng.choice(pool) for _ in range(rng.randint(1, 30))]
        if rng.random() < 0.2:
            ids.insert(rng.randrange(len(ids) + 1), n + 5)  # beyond the vocab
        detok = wrapper.make_detokenizer()
        out = []
        for t in ids:
            detok.add_token(t)
            out.append(detok.last_segment)
        detok.finalize()
        out.append(detok.last_segment)
        assert "".join(out) == wrapper.decode([i for i in ids if i < n]), ids


def test_detection(smol, gemma, tiny_llama, smol_dir):
    assert detokenizers.detect_detokenizer(smol._tokenizer) is tu.BPEStreamingDetokenizer
    assert detokenizers.detect_detokenizer(gemma._tokenizer) is tu.SPMStreamingDetokenizer
    assert isinstance(smol.make_detokenizer(), tu.BPEStreamingDetokenizer)
    assert isinstance(gemma.make_detokenizer(), tu.SPMStreamingDetokenizer)
    assert gemma.make_detokenizer().trim_space is False  # Gemma's decoder has no Strip
    assert tiny_llama.make_detokenizer().trim_space is True
    assert detokenizers.detect_detokenizer(smol._tokenizer, decoder={"type": "WordPiece"}) is tu.NaiveStreamingDetokenizer
    with open(os.path.join(smol_dir, "tokenizer.json"), encoding="utf-8") as f:
        assert detokenizers._match_decoder(json.load(f)["decoder"]) is tu.BPEStreamingDetokenizer


def test_cleanup_spaces_falls_back_to_naive(tiny_llama):
    """When decode() post-processes (" ," -> ","), only the naive detokenizer is exact."""
    tok = tiny_llama._tokenizer
    tok.clean_up_tokenization_spaces = True
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    try:
        assert tok.decode(tok.encode("a , b .", add_special_tokens=False)) == "a, b."
        assert detokenizers.detect_detokenizer(tok) is tu.NaiveStreamingDetokenizer
        for text in ["a , b . ab , , c", "ab ,\n , a", "a b c ,"]:
            naive = tu.TokenizerWrapper(tok, tu.NaiveStreamingDetokenizer)
            _stream(tiny_llama, naive.make_detokenizer, tok.encode(text, add_special_tokens=False))
    finally:
        tok.clean_up_tokenization_spaces = False
        tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = False


def test_spm_trim_only_first_space(tiny_llama):
    ids = tiny_llama.encode("ab\n ab a", add_special_tokens=False)
    assert tiny_llama.convert_ids_to_tokens(ids)[0] == "▁ab"
    for make in _kinds(tiny_llama):
        assert "".join(_stream(tiny_llama, make, ids)) == "ab\n ab a"


def test_independent_detokenizers(smol, gemma):
    for wrapper in (smol, gemma):
        a, b = wrapper.make_detokenizer(), wrapper.detokenizer
        assert a is not b and wrapper.detokenizer is not wrapper.detokenizer
        ia = wrapper.encode("first stream 😀 café", add_special_tokens=False)
        ib = wrapper.encode("second 日本語 stream\n🦙", add_special_tokens=False)
        for x, y in zip(ia + [None] * len(ib), ib + [None] * len(ia)):
            if x is not None:
                a.add_token(x)
            if y is not None:
                b.add_token(y)
            a.last_segment, b.text
        a.finalize(), b.finalize()
        assert a.text == wrapper.decode(ia) and b.text == wrapper.decode(ib)
        assert a.tokens == ia and b.tokens == ib
        a.reset()
        assert a.text == "" and a.tokens == [] and b.text == wrapper.decode(ib)


def test_wrapper_passthrough_and_eos(smol, gemma):
    assert smol.encode("hi", add_special_tokens=False) == smol._tokenizer.encode("hi", add_special_tokens=False)
    assert smol.decode(smol.encode("hi there")) == "hi there"
    assert smol.eos_token_id == 2 and smol.eos_token_ids == {2}
    assert len(smol) == len(smol._tokenizer)
    assert gemma.bos_token == "<bos>" and gemma.eos_token_ids == {gemma.eos_token_id}
    with pytest.raises(AttributeError):
        smol._no_such_private
    old = smol.model_max_length
    smol.model_max_length = 1234  # __setattr__ forwards to the tokenizer
    try:
        assert smol._tokenizer.model_max_length == 1234
    finally:
        smol.model_max_length = old
    w = tu.TokenizerWrapper(smol._tokenizer, eos_token_ids=[7, 8])
    assert w.eos_token_ids == {2, 7, 8}
    w.add_eos_token("<|endoftext|>")
    w.add_eos_token("5")
    w.add_eos_token(6)
    assert w.eos_token_ids == {0, 2, 5, 6, 7, 8}
    with pytest.raises(ValueError):
        w.add_eos_token("definitely not a token")
    w.eos_token_ids = [3]
    assert w.eos_token_ids == {3} and isinstance(w.eos_token_ids, set)
    assert isinstance(tu.TokenizerWrapper(smol._tokenizer, tu.NaiveStreamingDetokenizer).detokenizer,
                      tu.NaiveStreamingDetokenizer)


def test_chat_template(smol, gemma):
    msgs = [{"role": "user", "content": "Hello"}]
    assert smol.has_chat_template and not gemma.has_chat_template
    ids = smol.apply_chat_template(msgs, add_generation_prompt=True)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    text = smol.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>") and text.endswith("<|im_start|>assistant\n")
    assert tu.encode_prompt(smol, text) == ids
    # A callable template (mlx-lm style) and a Jinja string template.
    w = tu.TokenizerWrapper(gemma._tokenizer, chat_template=lambda m, **kw: "<bos>Q: " + m[0]["content"])
    assert w.has_chat_template
    assert w.apply_chat_template(msgs) == gemma.encode("Q: Hello")  # exactly one <bos>
    w = tu.TokenizerWrapper(gemma._tokenizer, chat_template="{{ bos_token }}{{ messages[0]['content'] }}")
    assert w.apply_chat_template(msgs, tokenize=False) == "<bos>Hello"


def test_encode_prompt_no_double_bos(gemma, smol):
    bos = gemma.bos_token_id
    plain = tu.encode_prompt(gemma, "Hello")
    assert plain[0] == bos and plain[1] != bos
    assert gemma.encode("<bos>Hello")[:2] == [bos, bos]  # the bug encode_prompt avoids
    for flag in (None, True):
        ids = tu.encode_prompt(gemma, "<bos>Hello", add_special_tokens=flag)
        assert ids == plain, flag
    assert gemma.encode_prompt("<bos>Hello") == plain
    assert tu.encode_prompt(gemma, "Hello", add_special_tokens=False)[0] != bos
    assert tu.encode_prompt(gemma, [5, 6]) == [5, 6]
    assert tu.encode_prompt(smol, "Hello") == smol.encode("Hello")


def test_load_tokenizer_generation_config(smol_dir, tmp_path):
    for f in os.listdir(smol_dir):
        shutil.copy(os.path.join(smol_dir, f), tmp_path / f)
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    w = tu.load_tokenizer(tmp_path)
    assert w.eos_token_ids == {0, 2}
    assert isinstance(w.detokenizer, tu.BPEStreamingDetokenizer)
    assert tu.load_tokenizer(str(tmp_path), eos_token_ids=9).eos_token_ids == {2, 9}
    (tmp_path / "generation_config.json").unlink()
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 1}))
    assert tu.load_tokenizer(tmp_path).eos_token_ids == {1, 2}
