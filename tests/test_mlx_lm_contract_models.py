"""mlx-lm 0.32's model-class contract: models copy and pickle like any ``nn.Module``
(mlx-lm code deep-copies models, e.g. for draft models and LoRA), and every family's
``ModelArgs`` takes mlx-lm's constructor arguments."""

import copy
import dataclasses
import importlib
import pickle

import mlx.core as mx
import numpy as np
import pytest
from arch_harness import collect_families, family_model_type
from mlx.utils import tree_flatten, tree_map

from mlx_lm_batched.models import get_model_module

FAMILIES = collect_families()


def build(name):
    """A tiny random model of one ``FAMILIES`` entry, built from its config."""
    config, _ = FAMILIES[name][1]
    model_type = family_model_type(name, FAMILIES[name][1])
    module = get_model_module(model_type)
    # A deep copy: the entry is shared with the family's own test module.
    args = module.ModelArgs.from_dict(copy.deepcopy({"model_type": model_type, **config}))
    model = module.Model(args)
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_model_deepcopies_and_pickles(name):
    model = build(name)
    prompt = mx.array([[1, 5, 9, 2]])
    expected = np.array(model(prompt))
    copied = copy.deepcopy(model)
    restored = pickle.loads(pickle.dumps(model))
    for clone in (copied, restored):
        assert type(clone) is type(model)
        np.testing.assert_array_equal(np.array(clone(prompt)), expected, err_msg=name)
    # The deep copy owns its parameters: zeroing them leaves the original alone.
    copied.update(tree_map(mx.zeros_like, copied.parameters()))
    np.testing.assert_array_equal(np.array(model(prompt)), expected, err_msg=name)


def mlx_lm_keywords(name):
    """mlx-lm 0.32's ``ModelArgs`` for one family's config, as constructor keywords
    (its field names and values), or None where mlx-lm has no such module or cannot
    read the tiny config. Fields mlx-lm requires that the tiny config leaves out get
    this package's resolved values."""
    config, _ = FAMILIES[name][1]
    model_type = family_model_type(name, FAMILIES[name][1])
    try:
        lm_module = importlib.import_module(f"mlx_lm.models.{model_type}")
    except (ImportError, SystemExit):  # mlx-lm's olmo exits without ai2-olmo
        return None
    # Deep copies: mlx-lm's ModelArgs write into the dicts they are given (gemma4 sets
    # text_config["vocab_size"]), and the entry is shared with the family's own tests.
    full = copy.deepcopy({"model_type": model_type, **config})
    ours = get_model_module(model_type).ModelArgs.from_dict(copy.deepcopy(full))
    for f in dataclasses.fields(lm_module.ModelArgs):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        value = getattr(ours, f.name, None)
        if required and f.name not in full and value is not None and not callable(value):
            full[f.name] = value
    try:
        theirs = lm_module.ModelArgs.from_dict(copy.deepcopy(full))
    except (TypeError, ValueError):
        return None
    return {f.name: getattr(theirs, f.name) for f in dataclasses.fields(theirs)}


WITH_MLX_LM = [n for n in sorted(FAMILIES) if mlx_lm_keywords(n) is not None]


@pytest.mark.parametrize("name", WITH_MLX_LM)
def test_model_args_take_mlx_lm_names(name):
    """``ModelArgs(**fields of mlx-lm's ModelArgs)`` builds, or names the one field
    whose value this package does not implement."""
    model_type = family_model_type(name, FAMILIES[name][1])
    keywords = mlx_lm_keywords(name)
    try:
        get_model_module(model_type).ModelArgs(**keywords)
    except (NotImplementedError, ValueError) as e:  # one line naming a field
        assert "\n" not in str(e) and any(k in str(e) for k in keywords), str(e)


DIMS = dict(hidden_size=32, num_attention_heads=4, vocab_size=64)


def test_checkpoint_names_as_constructor_fields():
    from mlx_lm_batched.models import deepseek_v2, exaone, gemma4, gpt2, lfm2

    args = exaone.ModelArgs(model_type="exaone", num_layers=3, layer_norm_epsilon=1e-3,
                            intermediate_size=64, **DIMS)
    assert (args.num_hidden_layers, args.rms_norm_eps) == (3, 1e-3)
    args = gpt2.ModelArgs(model_type="gpt2", n_embd=32, n_layer=1, n_head=4, vocab_size=64,
                          n_ctx=77)
    assert args.n_positions == 77
    args = lfm2.ModelArgs(model_type="lfm2", num_hidden_layers=2, block_dim=32,
                          block_ff_dim=96, **DIMS)
    assert args.intermediate_size == 96
    with pytest.raises(ValueError, match="block_dim"):
        lfm2.ModelArgs(model_type="lfm2", num_hidden_layers=2, block_dim=16, block_ff_dim=96,
                       **DIMS)
    deepseek_v2.ModelArgs(model_type="deepseek_v2", num_key_value_heads=32)
    text = dict(model_type="gemma4_text", num_hidden_layers=2, intermediate_size=64,
                head_dim=8, global_head_dim=8, num_key_value_heads=1, **DIMS)
    built = gemma4.ModelArgs(model_type="gemma4", text_config=text)
    assert built == gemma4.ModelArgs.from_dict({"model_type": "gemma4", "text_config": text})
    assert built.hidden_size == 32


@pytest.mark.parametrize("model_type", ["cohere", "cohere2", "falcon_h1", "phi", "starcoder2",
                                        "gpt_neox"])
def test_intermediate_size_defaults_to_four_times_hidden(model_type):
    args = get_model_module(model_type).ModelArgs(model_type=model_type, num_hidden_layers=1,
                                                  **DIMS)
    assert args.intermediate_size == 128


def test_phimoe_longrope_without_max_position_embeddings():
    """transformers and mlx-lm default phimoe's context to 131072; an explicit null in
    the config means that default too (longrope needs it)."""
    from mlx_lm_batched.models import phimoe

    factors = [1.0] * 4
    args = phimoe.ModelArgs.from_dict(dict(
        model_type="phimoe", num_hidden_layers=1, intermediate_size=32, num_local_experts=2,
        max_position_embeddings=None, original_max_position_embeddings=64,
        rope_scaling=dict(type="longrope", short_factor=factors, long_factor=factors),
        **DIMS))
    assert args.max_position_embeddings == 131072
    assert args.rope_scaling["original_max_position_embeddings"] == 64
    model = phimoe.Model(args)
    assert model(mx.array([[1, 2, 3]])).shape == (1, 3, 64)


def test_llama_layer_types_match_mlx_lm():
    """Sliding-window llamas (mlx-lm's ``layer_types``) give mlx-lm's logits."""
    import mlx_lm.models.llama as lm_llama

    from mlx_lm_batched.models import llama

    config = dict(model_type="llama", num_hidden_layers=2, intermediate_size=64,
                  rms_norm_eps=1e-5, num_key_value_heads=2, sliding_window=3,
                  layer_types=["sliding_attention", "full_attention"],
                  tie_word_embeddings=True, **DIMS)
    ours = llama.Model(llama.ModelArgs(**config))
    theirs = lm_llama.Model(lm_llama.ModelArgs(**config))
    mx.random.seed(3)
    theirs.update(tree_map(lambda p: mx.random.normal(p.shape) * 0.3, theirs.parameters()))
    ours.load_weights(list(tree_flatten(theirs.parameters())))
    prompt = mx.array([[5, 9, 1, 33, 7, 2, 40, 11, 3]])
    np.testing.assert_allclose(np.array(ours(prompt)), np.array(theirs(prompt)), atol=1e-4)
    full = llama.Model(llama.ModelArgs(**dict(config, layer_types=None, sliding_window=None)))
    full.load_weights(list(tree_flatten(theirs.parameters())))
    assert np.abs(np.array(full(prompt)) - np.array(ours(prompt))).max() > 1e-3
