"""mlx-lm 0.32's smaller module-level names (``models.base``, ``models.cache``, ``utils``,
``tokenizer_utils``, ``gguf``, ``convert`` and the command modules' re-exports), and the
modules this package does not provide, checked against mlx-lm itself (the oracle; the
package never imports it). The numeric modules are in ``test_mlx_lm_contract_modules.py``."""

import mlx.core as mx
import numpy as np
import pytest


# --- models.base and models.cache helpers ----------------------------------------------

def test_cache_helpers_match_mlx_lm():
    """dynamic_roll, TokenBuffer, ConcatenateKVCache and create_causal_mask from
    ``models.cache`` give mlx-lm's arrays, step by step."""
    import mlx_lm.models.cache as lm_cache

    from mlx_lm_batched.models import cache as our_cache
    x = mx.random.normal((3, 2, 7, 4), key=mx.random.key(9))
    for axis, shifts in ((1, mx.array([0, 1, -3])), (2, mx.array([[2, 5], [0, -1], [7, 13]]))):
        assert np.array_equal(np.array(our_cache.dynamic_roll(x, shifts, axis)),
                              np.array(lm_cache.dynamic_roll(x, shifts, axis)))
    theirs, ours = lm_cache.TokenBuffer([5, 6]), our_cache.TokenBuffer([5, 6])
    for chunk in (mx.array([1, 2, 3]), mx.arange(300), mx.array([7])):
        assert np.array_equal(np.array(ours.update_and_fetch(chunk)),
                              np.array(theirs.update_and_fetch(chunk)))
        assert ours.state.shape == theirs.state.shape
        assert np.array_equal(np.array(ours.tokens), np.array(theirs.tokens))
    theirs, ours = lm_cache.ConcatenateKVCache(), our_cache.ConcatenateKVCache()
    assert ours.empty() and theirs.empty()
    for n, key in ((5, 10), (1, 11), (3, 12)):
        keys = mx.random.normal((2, 2, n, 4), key=mx.random.key(key))
        values = keys * 2 + 1
        for a, b in zip(theirs.update_and_fetch(keys, values), ours.update_and_fetch(keys, values)):
            assert np.array_equal(np.array(a), np.array(b))
        assert ours.offset == theirs.offset
        for a, b in zip(theirs.state, ours.state):
            assert np.array_equal(np.array(a), np.array(b))
    for args in ((4,), (3, 5), (3, 5, 2)):
        assert np.array_equal(np.array(our_cache.create_causal_mask(*args)),
                              np.array(lm_cache.create_causal_mask(*args)))
    # Left padding: the real queries' rows are mlx-lm's (a padding query here sees its
    # own slot instead of nothing, so it never gets NaN).
    pads = mx.array([0, 2, 1])
    ours_m = np.array(our_cache.create_causal_mask(4, 2, None, None, pads))
    theirs_m = np.array(lm_cache.create_causal_mask(4, 2, None, None, pads))
    assert ours_m.shape == theirs_m.shape == (3, 1, 4, 6)
    for row, pad in enumerate([0, 2, 1]):
        real = slice(max(0, pad - 2), None)
        assert np.array_equal(ours_m[row, 0, real], theirs_m[row, 0, real])
    # mlx-lm's store under its name (tests/test_dropin_prompt_lru.py compares it).
    assert len(our_cache.LRUPromptCache(max_size=4)) == 0


def test_prompt_trie_matches_mlx_lm_on_random_sequences():
    """Random stored sequences over a small vocabulary (so prefixes and branches
    collide): every search, get, pop and pop_prefixes answers as mlx-lm's trie."""
    import mlx_lm.models.cache as lm_cache

    from mlx_lm_batched.models import cache as our_cache
    rng = np.random.default_rng(0)
    theirs, ours = lm_cache.PromptTrie(), our_cache.PromptTrie()

    def seq():
        return [int(t) for t in rng.integers(0, 3, rng.integers(0, 6))]

    def fields(result):
        return (result.model, result.exact, result.shorter, result.longer, result.common_prefix)

    stored = []
    for i in range(40):
        tokens, model = seq(), ["a", "b"][i % 2]
        assert ours.add(model, tokens, i) == theirs.add(model, tokens, i)
        stored.append((model, tokens))
    for _ in range(200):
        model, tokens = ["a", "b", "c"][rng.integers(0, 3)], seq()
        assert fields(ours.search(model, tokens)) == fields(theirs.search(model, tokens))
    for model, tokens in stored[::3]:
        try:
            expected = theirs.get(model, tokens)
        except KeyError:
            continue
        assert ours.get(model, tokens) == expected
        assert ours.pop(model, tokens) == theirs.pop(model, tokens)
    def outcome(fn, *args):
        try:
            return fn(*args)
        except KeyError:  # a path pruned by an earlier pop: both raise
            return KeyError

    for model, tokens in stored[1::4]:
        assert outcome(ours.pop_prefixes, model, tokens) == outcome(theirs.pop_prefixes, model,
                                                                    tokens)
    for _ in range(200):
        model, tokens = ["a", "b"][rng.integers(0, 2)], seq()
        assert fields(ours.search(model, tokens)) == fields(theirs.search(model, tokens))


def test_create_ssm_mask_and_gather_last_axis_match_mlx_lm():
    import mlx_lm.models.base as lm_base
    import mlx_lm.models.cache as lm_cache

    from mlx_lm_batched.models import base
    from mlx_lm_batched.models import cache as our_cache
    h = mx.zeros((2, 5, 8))
    padded = lm_cache.ArraysCache(2, left_padding=[0, 3])
    assert np.array_equal(np.array(base.create_ssm_mask(h, padded)),
                          np.array(lm_base.create_ssm_mask(h, padded)))
    assert base.create_ssm_mask(h) is None and lm_base.create_ssm_mask(h) is None
    assert base.create_ssm_mask(h, our_cache.ArraysCache(2)) is None
    group = mx.distributed.init()  # one rank here: the gather is the identity
    x = mx.random.normal((2, 3, 4), key=mx.random.key(3))
    assert np.array_equal(np.array(base.gather_last_axis(x, group)),
                          np.array(lm_base.gather_last_axis(x, group)))


# --- utils ---------------------------------------------------------------------------

def test_utils_model_helpers_match_mlx_lm():
    """bits per weight (float and 4-bit), input-embedding support, the quantization a
    packed weight was saved with, and Metal's availability, as mlx-lm's utils answer
    for the same model (a tiny llama built by each library)."""
    import mlx.nn as nn
    import mlx_lm.models.llama as lm_llama
    import mlx_lm.utils as lm_utils

    from mlx_lm_batched import utils
    from mlx_lm_batched.models import llama
    config = dict(model_type="llama", hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=96,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    ours = llama.Model(llama.ModelArgs.from_dict(config))
    theirs = lm_llama.Model(lm_llama.ModelArgs.from_dict(config))
    assert utils.compute_bits_per_weight(ours) == pytest.approx(32.0)
    assert utils.compute_bits_per_weight(theirs) == lm_utils.compute_bits_per_weight(theirs)
    nn.quantize(ours, group_size=32, bits=4)
    nn.quantize(theirs, group_size=32, bits=4)
    assert utils.compute_bits_per_weight(ours) == pytest.approx(
        lm_utils.compute_bits_per_weight(theirs), rel=1e-3)
    assert utils.does_model_support_input_embeddings(theirs) == \
        lm_utils.does_model_support_input_embeddings(theirs)
    assert utils.does_model_support_input_embeddings(ours) == \
        lm_utils.does_model_support_input_embeddings(ours)
    assert utils.can_run_metal() == lm_utils.can_run_metal()
    linear = nn.Linear(64, 48)
    for kwargs in ({"group_size": 32, "bits": 4}, {"group_size": 64, "bits": 8},
                   {"group_size": 32, "bits": 4, "mode": "mxfp4"}):
        w, scales, *biases = mx.quantize(linear.weight, **kwargs)
        weights = {"l.weight": w, "l.scales": scales}
        assert utils.infer_quant_config("l", linear, weights) == \
            lm_utils.infer_quant_config("l", linear, weights)
    with pytest.raises(NotImplementedError, match="hf upload"):
        utils.upload_to_hub("some/dir", "me/repo")


# --- modules this package does not provide ----------------------------------------------

ABSENT = {"lora": "mlx_lm.lora", "tuner": "mlx_lm.tuner", "tuner.lora": "mlx_lm.tuner",
          "quant": "mlx_lm.quant", "quant.gptq": "mlx_lm.quant", "manage": "mlx_lm.manage",
          "upload": "mlx_lm.upload", "share": "mlx_lm.share"}


@pytest.mark.parametrize("name", sorted(ABSENT))
def test_absent_modules_fail_with_one_line_naming_the_alternative(name):
    import importlib
    import sys

    with pytest.raises(ImportError, match=ABSENT[name].replace(".", r"\.")) as info:
        importlib.import_module(f"mlx_lm_batched.{name}")
    assert "\n" not in str(info.value)
    for module in [m for m in sys.modules if m.startswith("mlx_lm_batched.") and
                   m.split(".")[1] in ("tuner", "quant")]:
        del sys.modules[module]


@pytest.mark.parametrize("name", ["lora", "tuner.lora", "quant.awq", "upload"])
def test_absent_modules_under_python_m_print_one_line(name):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    run = subprocess.run([sys.executable, "-m", f"mlx_lm_batched.{name}", "--help"], cwd=root,
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "mlx_lm." in lines[0] and "Traceback" not in lines[0], run.stderr


# --- tokenizer_utils ---------------------------------------------------------------------

def test_newline_tokenizer_and_no_bos_or_eos_match_mlx_lm(float_dirs, tmp_path):
    """SmolLM2's tokenizer named "NewlineTokenizer" in its config: this package's loader
    finds the class, which encodes a text as the plain fast tokenizer encodes it with
    each line break written ``<n>``, and decodes back. (mlx-lm 0.32.2's own class is
    no oracle here: under transformers 5 it loses the BPE merges and encodes character
    by character.)"""
    import json
    import shutil

    import mlx_lm.tokenizer_utils as lm_tok
    from transformers import PreTrainedTokenizerFast

    from mlx_lm_batched import tokenizer_utils
    for f in float_dirs["smollm2"].iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, tmp_path / f.name)
    plain = PreTrainedTokenizerFast.from_pretrained(str(tmp_path))
    config_path = tmp_path / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["tokenizer_class"] = "NewlineTokenizer"
    config_path.write_text(json.dumps(config))
    text = "def f(x):\n    return x\n\nprint(f(2))"
    ours = tokenizer_utils.NewlineTokenizer.from_pretrained(str(tmp_path))
    ids = ours.encode(text)
    assert ids == plain.encode(text.replace("\n", "<n>")) != plain.encode(text)
    assert ours.decode(ids) == text and plain.decode(ids) == text.replace("\n", "<n>")
    assert ours.batch_decode([ids, ids[:3]]) == [text, plain.decode(ids[:3])]
    # mlx-lm's class of the same name registered last (as importing mlx-lm can do) does
    # not take over: the loader picks this package's class by name.
    from transformers import AutoTokenizer

    AutoTokenizer.register(lm_tok.NewlineTokenizer, fast_tokenizer_class=lm_tok.NewlineTokenizer,
                           exist_ok=True)
    try:
        loaded = tokenizer_utils.load(tmp_path)
    finally:  # this package's class back in the registry for the rest of the process
        AutoTokenizer.register(tokenizer_utils.NewlineTokenizer,
                               fast_tokenizer_class=tokenizer_utils.NewlineTokenizer,
                               exist_ok=True)
    assert type(loaded._tokenizer) is tokenizer_utils.NewlineTokenizer
    assert loaded.encode(text) == ids and loaded.decode(ids) == text
    for seq in ([1, 5, 6, 2], [5, 6, 2], [1, 5, 6], [5], [1, 2], [2, 1, 2]):
        assert tokenizer_utils.no_bos_or_eos(seq, 1, 2) == lm_tok.no_bos_or_eos(seq, 1, 2)


# --- gguf, convert and the command modules' re-exports --------------------------------------

def test_gguf_helpers_match_mlx_lm():
    import mlx_lm.gguf as lm_gguf

    from mlx_lm_batched import gguf
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight",
             "model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.o_proj.bias",
             "model.layers.10.mlp.down_proj.weight", "model.layers.0.input_layernorm.weight",
             "model.layers.0.post_attention_layernorm.weight",
             "model.layers.2.block_sparse_moe.gate.weight",
             "model.layers.2.block_sparse_moe.experts.7.w1.weight",
             "model.layers.2.block_sparse_moe.experts.7.w2.weight",
             "model.layers.2.block_sparse_moe.experts.11.w3.weight", "something.else"]
    for name in names:
        assert gguf.translate_weight_names(name) == lm_gguf.translate_weight_names(name), name
    w = mx.random.normal((48, 10), key=mx.random.key(4))
    for args in ((4,), (4, 2), (4, 4), (6, None)):
        assert np.array_equal(np.array(gguf.permute_weights(w, *args)),
                              np.array(lm_gguf.permute_weights(w, *args)))
    assert {t.name: t.value for t in gguf.TokenType} == {t.name: t.value for t in lm_gguf.TokenType}
    assert gguf.GGMLFileType.GGML_TYPE_F16 == lm_gguf.GGMLFileType.GGML_TYPE_F16 == 1


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_gguf_vocab_and_metadata_match_mlx_lm(float_dirs, name):
    """HfVocab's token list (texts, scores, llama.cpp types: byte tokens in Gemma's
    vocabulary, control tokens, added tokens) and prepare_metadata's keys and values for
    the model's config and variants of it (linear RoPE scaling, experts, missing keys)."""
    import json

    import mlx_lm.gguf as lm_gguf

    from mlx_lm_batched import gguf
    path = float_dirs[name]
    ours, theirs = gguf.HfVocab.load(path), lm_gguf.HfVocab.load(path)
    assert list(ours.all_tokens()) == list(theirs.all_tokens())
    for attr in ("vocab_size", "vocab_size_base", "added_tokens_list", "added_tokens_dict",
                 "added_tokens_ids", "specials", "special_ids"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert repr(ours) == repr(theirs) and ours.has_newline_token() == theirs.has_newline_token()
    config = json.loads((path / "config.json").read_text())
    config = config.get("text_config", config) | {"_name_or_path": "org/some-model"}
    variants = [config, config | {"rope_scaling": {"type": "linear", "factor": 2.0}},
                config | {"num_local_experts": 8, "num_experts_per_tok": 2},
                {k: v for k, v in config.items() if k not in ("rope_theta", "hidden_size")}]
    for cfg in variants:
        ours_md, theirs_md = gguf.prepare_metadata(cfg, ours), lm_gguf.prepare_metadata(cfg, theirs)
        assert sorted(ours_md) == sorted(theirs_md)
        for key, value in theirs_md.items():
            if isinstance(value, mx.array):
                assert ours_md[key].dtype == value.dtype, key
                assert np.array_equal(np.array(ours_md[key]), np.array(value)), key
            else:
                assert ours_md[key] == value, key


def test_convert_parser_recipes_and_reexports_match_mlx_lm():
    """configure_parser parses mlx-lm's flags into what ``convert`` takes; the mixed
    recipes give every layer of a 16-layer llama the bits mlx-lm's give; the command
    modules re-export the functions mlx-lm's do."""
    import importlib
    import inspect

    import mlx_lm.models.llama as lm_llama

    from mlx_lm_batched.models import cache, llama
    lm_convert = importlib.import_module("mlx_lm.convert")  # mlx_lm.convert is also a function
    benchmark, cache_prompt, chat, convert, fuse, generate, gguf, utils = (
        importlib.import_module(f"mlx_lm_batched.{name}") for name in (
            "benchmark", "cache_prompt", "chat", "convert", "fuse", "generate", "gguf", "utils"))
    argv = ["--hf-path", "some/model", "--mlx-path", "out", "-q", "--q-bits", "3",
            "--q-group-size", "32", "--q-mode", "affine", "--dtype", "bfloat16", "-d",
            "--trust-remote-code", "--quant-predicate", "mixed_3_6"]
    ours, theirs = vars(convert.configure_parser().parse_args(argv)), \
        vars(lm_convert.configure_parser().parse_args(argv))
    assert ours == theirs
    assert set(ours) <= set(inspect.signature(convert.convert).parameters)
    config = dict(model_type="llama", hidden_size=32, num_hidden_layers=16, intermediate_size=64,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    ours_m = llama.Model(llama.ModelArgs.from_dict(config))
    theirs_m = lm_llama.Model(lm_llama.ModelArgs.from_dict(config))
    paths = [name for name, module in theirs_m.named_modules() if hasattr(module, "to_quantized")]
    assert len(paths) > 16 * 7
    for recipe in lm_convert.QUANT_RECIPES:
        ours_p = convert.mixed_quant_predicate_builder(recipe, ours_m, 32)
        theirs_p = lm_convert.mixed_quant_predicate_builder(recipe, theirs_m, 32)
        assert [ours_p(p, None) for p in paths] == [theirs_p(p, None) for p in paths], recipe
    with pytest.raises(ValueError, match="Invalid quant recipe"):
        convert.mixed_quant_predicate_builder("mixed_1_8", ours_m)
    # The predicate through quantize_model: the same per-layer config as mlx-lm writes.
    lm_utils = importlib.import_module("mlx_lm.utils")
    _, ours_c = convert.quantize_model(ours_m, config, 32, 4, quant_predicate=(
        convert.mixed_quant_predicate_builder("mixed_3_6", ours_m, 32)))
    _, theirs_c = lm_utils.quantize_model(theirs_m, config, 32, 4, quant_predicate=(
        lm_convert.mixed_quant_predicate_builder("mixed_3_6", theirs_m, 32)))
    assert ours_c["quantization"] == theirs_c["quantization"]
    assert len(ours_c["quantization"]) > 100
    same = {convert: ["load", "save", "quantize_model", "dequantize_model", "upload_to_hub"],
            fuse: ["load", "save", "dequantize_model", "upload_to_hub"],
            chat: ["load", "sharded_load"], benchmark: ["load", "sharded_load"],
            cache_prompt: ["load"]}
    for module, names in same.items():
        for name in names:
            assert getattr(module, name) is getattr(utils, name), (module.__name__, name)
    for module, name in ((chat, "stream_generate"), (benchmark, "stream_generate"),
                         (benchmark, "batch_generate"), (cache_prompt, "generate_step"),
                         (chat, "make_sampler")):
        assert getattr(module, name) is getattr(generate, name)
    for module in (chat, cache_prompt):
        assert module.make_prompt_cache is cache.make_prompt_cache
    assert cache_prompt.save_prompt_cache is cache.save_prompt_cache
    assert fuse.convert_to_gguf is gguf.convert_to_gguf


def test_pipeline_load_on_one_rank_is_the_whole_model(float_dirs):
    """mlx-lm's ``pipeline_load`` signature; on a single rank every layer stays here, so
    the logits are ``load``'s."""
    from mlx_lm_batched import utils
    model, tokenizer, config = utils.pipeline_load(str(float_dirs["smollm2"]), return_config=True)
    reference, _ = utils.load(str(float_dirs["smollm2"]))
    assert config["model_type"] == "llama" and len(model.layers) == len(reference.layers)
    prompt = mx.array([tokenizer.encode("The capital of France is")])
    np.testing.assert_allclose(np.array(model(prompt)), np.array(reference(prompt)), atol=1e-5,
                               rtol=1e-5)
    assert len(utils.pipeline_load(str(float_dirs["smollm2"]))) == 2


def _run_module(args, timeout=300):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([sys.executable, "-m", *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_python_m_package_dispatches_mlx_lm_commands(float_dirs):
    """``python -m mlx_lm_batched <command>`` as ``python -m mlx_lm <command>``: the same
    output as the command's own module; mlx-lm's commands absent here, and unknown ones,
    end with one line."""
    gen = ["--model", str(float_dirs["smollm2"]), "--prompt", "The capital of France is",
           "--max-tokens", "5", "--temp", "0"]
    direct = _run_module(["mlx_lm_batched.generate", *gen])
    dispatched = _run_module(["mlx_lm_batched", "generate", *gen])
    assert direct.returncode == dispatched.returncode == 0, dispatched.stderr
    text = [line for line in direct.stdout.splitlines() if "tokens-per-sec" not in line
            and "Peak memory" not in line]
    assert text and text == [line for line in dispatched.stdout.splitlines()
                             if "tokens-per-sec" not in line and "Peak memory" not in line]
    for args, needle in ((["evaluate"], "mlx_lm.evaluate"), (["lora", "--train"], "mlx_lm.lora"),
                         (["gptq"], "mlx_lm.quant"), (["nope"], "unknown command")):
        run = _run_module(["mlx_lm_batched", *args])
        lines = run.stderr.strip().splitlines()
        assert run.returncode == 1 and len(lines) == 1 and needle in lines[0], run.stderr
    version = _run_module(["mlx_lm_batched", "--version"])
    assert version.returncode == 0 and version.stdout.strip()
