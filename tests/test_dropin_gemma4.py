"""Gemma 4 as code written for mlx-lm meets it, against mlx-lm as the oracle: the same
logits from mlx-lm's weights (KV-sharing layers without key/value projections), its
``Gemma4TextModel`` and ``text_config`` names, and its mixed-bit checkpoints whose
per-module quantization is keyed by mlx-lm's ``language_model.`` paths."""

import json

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_flatten

TEXT = dict(model_type="gemma4_text", hidden_size=32, num_hidden_layers=6, intermediate_size=64,
            num_attention_heads=2, head_dim=16, global_head_dim=32, rms_norm_eps=1e-6,
            vocab_size=64, vocab_size_per_layer_input=64, num_key_value_heads=1,
            num_kv_shared_layers=2, hidden_size_per_layer_input=8, sliding_window=4,
            sliding_window_pattern=3, final_logit_softcapping=30.0, use_double_wide_mlp=True,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"] * 2,
            rope_parameters={"full_attention": {"rope_type": "proportional",
                                                "partial_rotary_factor": 0.25,
                                                "rope_theta": 1e6},
                             "sliding_attention": {"rope_theta": 1e4}})


def random_weights(model, seed):
    """``model``'s parameter names with small random values."""
    flat = tree_flatten(model.parameters())
    keys = mx.random.split(mx.random.key(seed), len(flat))
    return {k: mx.random.normal(v.shape, key=key) * 0.3 for (k, v), key in zip(flat, keys)}


def test_kv_sharing_layers_have_no_kv_and_logits_match_mlx_lm():
    """mlx-lm's ``has_kv`` per layer; a sharing layer holds no ``k_proj``/``v_proj``/
    ``k_norm`` (a checkpoint without them loads strictly), and mlx-lm's weights give
    mlx-lm's logits."""
    from mlx_lm.models import gemma4_text as theirs

    from mlx_lm_batched.models import gemma4_text as ours

    want = theirs.Model(theirs.ModelArgs(**TEXT))
    got = ours.Model(ours.ModelArgs.from_dict(TEXT))
    assert ([layer.self_attn.has_kv for layer in got.layers]
            == [layer.self_attn.has_kv for layer in want.layers]
            == [True] * 4 + [False] * 2)
    for mine, theirs_layer in zip(got.layers, want.layers):
        for name in ("k_proj", "v_proj", "k_norm"):
            assert hasattr(mine.self_attn, name) == hasattr(theirs_layer.self_attn, name)
    weights = random_weights(want, 0)
    want.load_weights(list(weights.items()))
    got.load_weights(list(got.sanitize(dict(weights)).items()), strict=True)
    tokens = mx.array([[1, 5, 7, 9, 11, 3, 2, 8], [4, 4, 60, 0, 13, 2, 9, 1]])
    np.testing.assert_allclose(np.array(got(tokens)), np.array(want(tokens)), atol=1e-4)


def test_gemma4_text_model_is_mlx_lm_text_stack():
    """``Gemma4TextModel(args)``: mlx-lm's parameter names and shapes and its
    ``embed_scale``; a quantized embedding keeps the lookup scale as mlx-lm's does."""
    from mlx_lm.models import gemma4_text as theirs

    from mlx_lm_batched.models import gemma4_text as ours

    want = theirs.Gemma4TextModel(theirs.ModelArgs(**TEXT))
    got = ours.Gemma4TextModel(ours.ModelArgs.from_dict(TEXT))
    shapes = lambda m: {k: v.shape for k, v in tree_flatten(m.parameters())}  # noqa: E731
    assert shapes(got) == shapes(want)
    assert got.embed_scale == want.embed_scale == 32**0.5
    table = mx.random.normal((64, 32), key=mx.random.key(2))
    tokens = mx.array([[0, 7, 63]])
    looked_up = []
    for model in (got, want):
        model.embed_tokens.weight = table
        model.embed_tokens = model.embed_tokens.to_quantized(group_size=32, bits=8)
        looked_up.append(model.embed_tokens(tokens) * model.embed_scale)
    np.testing.assert_array_equal(np.array(looked_up[0]), np.array(looked_up[1]))
    assert np.allclose(np.array(looked_up[0]), np.array(table[tokens]) * 32**0.5, atol=0.2)


def test_multimodal_args_keep_mlx_lm_text_config():
    """The args built from a multimodal config (``from_dict`` or the constructor) keep
    the nested ``text_config`` dict as mlx-lm's do, beside the flattened fields."""
    from mlx_lm.models import gemma4 as theirs

    from mlx_lm_batched.models import gemma4 as ours

    config = {"model_type": "gemma4", "vocab_size": 64, "text_config": dict(TEXT)}
    want = theirs.ModelArgs.from_dict(config)
    got = ours.ModelArgs.from_dict(config)
    assert got.text_config == want.text_config == TEXT
    assert got.text_config is not TEXT  # a copy: the caller's dict stays the caller's
    assert got.num_kv_shared_layers == 2 and got.hidden_size == 32
    built = ours.ModelArgs(model_type="gemma4", vocab_size=64, text_config=dict(TEXT))
    assert built.text_config == TEXT
    assert ours.ModelArgs.from_dict(dict(TEXT, model_type="gemma4")).text_config is None


def test_mixed_bit_checkpoint_by_mlx_lm_loads_its_per_module_bits(tmp_path):
    """A Gemma 4 checkpoint mlx-lm quantized at 4 bits with its per-layer projection and
    router at 8 (per-module entries under ``language_model.model.*``) loads here with
    those bits, and gives the logits mlx-lm's loader gives."""
    from mlx_lm import utils as mlx_lm_utils
    from mlx_lm.models import gemma4 as theirs

    from mlx_lm_batched.utils import load_model

    text = dict(TEXT, num_kv_shared_layers=0, layer_types=["full_attention"] * 2,
                num_hidden_layers=2, enable_moe_block=True, num_experts=4, top_k_experts=2,
                moe_intermediate_size=32)
    config = {"model_type": "gemma4", "vocab_size": 64, "text_config": text}
    model = theirs.Model(theirs.ModelArgs.from_dict(config))
    model.load_weights(list(random_weights(model, 1).items()))
    eight = ("per_layer_model_projection", "router.proj")

    def predicate(path, module):
        return {"group_size": 32, "bits": 8} if path.endswith(eight) else True

    model, config = mlx_lm_utils.quantize_model(model, config, group_size=32, bits=4,
                                                quant_predicate=predicate)
    mlx_lm_utils.save_model(tmp_path, model)
    mlx_lm_utils.save_config(config, tmp_path / "config.json")
    overrides = [k for k, v in json.loads((tmp_path / "config.json").read_text())
                 ["quantization"].items() if isinstance(v, dict)]
    assert "language_model.model.per_layer_model_projection" in overrides

    got, _ = load_model(tmp_path)
    assert got.model.per_layer_model_projection.bits == 8
    assert {layer.router.proj.bits for layer in got.layers} == {8}
    assert got.layers[0].self_attn.q_proj.bits == 4
    assert isinstance(got.layers[0].experts.gate_proj, nn.Module)
    want, _ = mlx_lm_utils.load_model(tmp_path)
    tokens = mx.array([[1, 5, 7, 9, 11, 3]])
    np.testing.assert_allclose(np.array(got(tokens)), np.array(want(tokens)), atol=1e-3)


def test_embeddings_alone_and_explicit_per_layer_inputs_match_mlx_lm():
    """``model(None, input_embeddings=...)`` recovers the ids for the per-layer inputs
    (mlx-lm's logits, and the tokens' own, also with a quantized embedding table);
    ``per_layer_inputs=`` replaces their token part as in mlx-lm."""
    from mlx_lm.models import gemma4_text as theirs

    from mlx_lm_batched.models import gemma4_text as ours

    want = theirs.Model(theirs.ModelArgs(**TEXT))
    got = ours.Model(ours.ModelArgs.from_dict(TEXT))
    weights = random_weights(want, 3)
    want.load_weights(list(weights.items()))
    got.load_weights(list(got.sanitize(dict(weights)).items()))
    tokens = mx.array([[1, 5, 7, 9, 11], [63, 0, 2, 2, 40]])
    embeddings = got.model.embed_tokens(tokens)
    direct = got(tokens)
    check = lambda a, b: np.testing.assert_allclose(np.array(a), np.array(b), atol=1e-4)  # noqa: E731
    check(got(None, input_embeddings=embeddings), direct)
    check(got(None, input_embeddings=embeddings), want(None, input_embeddings=embeddings))
    other = want.model._get_per_layer_inputs(tokens[:, ::-1])
    check(got.model._get_per_layer_inputs(tokens[:, ::-1]), other)
    mixed = got(None, input_embeddings=embeddings, per_layer_inputs=other)
    check(mixed, want(None, input_embeddings=embeddings, per_layer_inputs=other))
    assert not np.allclose(np.array(mixed), np.array(direct), atol=1e-3)
    nn.quantize(got.model, group_size=32, bits=8,
                class_predicate=lambda path, m: path == "embed_tokens")
    embeddings = got.model.embed_tokens(tokens)
    assert mx.array_equal(got.model.token_ids(embeddings), tokens).item()
    check(got(None, input_embeddings=embeddings), got(tokens))
