"""mlx-lm 0.32's module-level contract, checked against mlx-lm itself: the masks
``models.base`` builds, the module names mlx-lm code imports, and ``utils``' loading
helpers (``load_model(strict=False)``, ``get_model_classes``, ``make_shards``)."""

import importlib

import mlx.core as mx
import mlx_lm.models.base as lm_base
import mlx_lm.models.cache as lm_cache
import mlx_lm.utils as lm_utils
import numpy as np
import pytest

from mlx_lm_batched.models import MODEL_TYPES, base, llama
from mlx_lm_batched.models import cache as our_cache
from mlx_lm_batched.utils import (
    ModelLoadError,
    get_model_classes,
    hf_repo_to_path,
    load_model,
    make_shards,
    save_config,
    save_model,
)


def same_mask(theirs, ours):
    if theirs is None or isinstance(theirs, str):
        return theirs == ours
    return (hasattr(ours, "shape") and ours.shape == theirs.shape
            and np.array_equal(np.array(ours), np.array(theirs)))


@pytest.mark.parametrize("window", [None, 2, 4, 7, 9])
def test_attention_masks_have_mlx_lm_values_and_shapes(window):
    """None, "causal" or an (N, S) array, case by case as mlx-lm returns them."""
    for queries in (1, 3):
        for cached in (0, 2, 5):
            for return_array in (False, True):
                caches = [None, None]
                if cached:
                    caches = [lm_cache.KVCache(), our_cache.KVCache()]
                    for c in caches:
                        kv = mx.zeros((2, 1, cached, 4))
                        c.update_and_fetch(kv, kv)
                h = mx.zeros((2, queries, 8))
                theirs, ours = (module.create_attention_mask(h, c, window, return_array)
                                for module, c in zip((lm_base, base), caches))
                assert same_mask(theirs, ours), (queries, cached, return_array, theirs, ours)
    for offset in (0, 3):
        assert same_mask(lm_base.create_causal_mask(4, offset, window),
                         base.create_causal_mask(4, offset, window))


@pytest.mark.parametrize("model_type", sorted(MODEL_TYPES))
def test_every_model_type_has_its_module(model_type):
    module = importlib.import_module(f"mlx_lm_batched.models.{model_type}")
    assert module.Model is not None and module.ModelArgs is not None
    assert get_model_classes({"model_type": model_type}) == (module.Model, module.ModelArgs)


def test_modules_mlx_lm_code_imports():
    from mlx_lm_batched.layers.rope import make_rope
    from mlx_lm_batched.models import activations, rope_utils, switch_layers

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    rope = rope_utils.initialize_rope(16, 5e5, False, scaling, 256)
    reference = make_rope(16, 5e5, False, scaling, 256)
    x = mx.random.normal((1, 2, 5, 16))
    offset = mx.array([3])
    np.testing.assert_array_equal(np.array(rope(x, offset)), np.array(reference(x, offset)))
    gate, up = mx.array([-2.0, 0.5, 3.0]), mx.array([1.0, 2.0, -1.0])
    expected = np.array(gate * mx.sigmoid(gate) * up)
    np.testing.assert_allclose(np.array(activations.swiglu(gate, up)), expected, rtol=1e-6)
    experts = switch_layers.SwitchGLU(8, 16, 4)
    assert experts(mx.ones((1, 2, 8)), mx.array([[[0, 3], [1, 2]]])).shape == (1, 2, 2, 8)


def tiny_llama_dir(path):
    config = dict(model_type="llama", hidden_size=32, num_hidden_layers=1,
                  intermediate_size=64, num_attention_heads=4, num_key_value_heads=2,
                  vocab_size=64, rms_norm_eps=1e-5, tie_word_embeddings=True)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    save_model(path, model)
    save_config(config, path / "config.json")
    return model


def test_load_model_strict_and_classes_hook(tmp_path):
    model = tiny_llama_dir(tmp_path)
    prompt = mx.array([[1, 2, 3]])
    expected = np.array(model(prompt))
    loaded, config = load_model(tmp_path, get_model_classes=lambda c: (llama.Model,
                                                                       llama.ModelArgs))
    np.testing.assert_array_equal(np.array(loaded(prompt)), expected)
    # trust_remote_code only matters for a config naming a model_file
    # (tests/test_dropin_loading.py); this one loads the registry's llama either way.
    trusted, _ = load_model(tmp_path, trust_remote_code=True)
    np.testing.assert_array_equal(np.array(trusted(prompt)), expected)
    # Drop one weight: strict loading names it, strict=False keeps the initial value.
    weights = mx.load(str(tmp_path / "model.safetensors"))
    dropped = "model.layers.0.mlp.down_proj.weight"
    del weights[dropped]
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    with pytest.raises(ModelLoadError, match="down_proj"):
        load_model(tmp_path)
    partial, _ = load_model(tmp_path, strict=False)
    np.testing.assert_array_equal(np.array(partial.model.embed_tokens.weight),
                                  np.array(model.model.embed_tokens.weight))
    assert hf_repo_to_path(str(tmp_path)) == tmp_path


def test_make_shards_matches_mlx_lm():
    weights = {f"w{i}": mx.zeros((n,)) for i, n in enumerate([5, 3, 8, 1])}
    for gb in (0, 1):
        theirs = lm_utils.make_shards(weights, gb)
        ours = make_shards(weights, gb)
        assert [list(s) for s in ours] == [list(s) for s in theirs]


def test_submodules_are_attributes_of_the_package_as_in_mlx_lm():
    """``import mlx_lm; mlx_lm.utils.load`` works (mlx-lm's ``__init__`` imports its
    modules); so does it here, in a fresh interpreter, with the functions kept."""
    import subprocess
    import sys

    code = ("import mlx_lm_batched as m, sys, types\n"
            "assert isinstance(m.utils, types.ModuleType) and callable(m.utils.load)\n"
            "assert isinstance(m.models.cache, types.ModuleType)\n"
            "assert isinstance(m.sample_utils, types.ModuleType) and callable(m.generate)\n"
            "assert callable(m.convert) and not hasattr(m, 'no_such_module')\n"
            "assert m.models.llama is sys.modules['mlx_lm_batched.models.llama']\n"
            "for pkg, name in ((m, '_blas_x'), (m.models, 'no_such_arch'), (m.models, '_x')):\n"
            "    try:\n"
            "        getattr(pkg, name)\n"
            "    except AttributeError as e:\n"
            "        assert str(e) == f'module {pkg.__name__!r} has no attribute {name!r}'\n"
            "    else:\n"
            "        raise AssertionError(name)\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout == "ok\n", proc.stderr[-2000:]


def test_switch_glu_takes_mlx_lms_activation_modules():
    """``SwitchGLU(..., activation=SwiGLU())`` / ``SwigluOAI(...)`` as mlx-lm code writes
    it: the same output as mlx-lm's SwitchGLU on the same weights, and it still pickles."""
    import copy
    import pickle

    import mlx_lm.models.activations as lm_act
    import mlx_lm.models.switch_layers as lm_switch
    from mlx.utils import tree_flatten

    from mlx_lm_batched.models import activations, switch_layers

    x = mx.random.normal((1, 3, 8), key=mx.random.key(1))
    indices = mx.array([[[0, 3], [1, 2], [3, 3]]])
    for ours_act, theirs_act in ((switch_layers.SwiGLU(), lm_switch.SwiGLU()),
                                 (activations.SwigluOAI(1.5, 4.0), lm_act.SwigluOAI(1.5, 4.0))):
        theirs = lm_switch.SwitchGLU(8, 16, 4, activation=theirs_act)
        ours = switch_layers.SwitchGLU(8, 16, 4, activation=ours_act)
        ours.load_weights(tree_flatten(theirs.parameters()))
        np.testing.assert_allclose(np.array(ours(x, indices)), np.array(theirs(x, indices)),
                                   atol=1e-5, rtol=1e-5)
        mixed = switch_layers.SwitchGLU(8, 16, 4, activation=theirs_act)  # mlx-lm's own module
        mixed.load_weights(tree_flatten(theirs.parameters()))
        np.testing.assert_allclose(np.array(mixed(x, indices)), np.array(theirs(x, indices)),
                                   atol=1e-5, rtol=1e-5)
        for clone in (copy.deepcopy(ours), pickle.loads(pickle.dumps(ours))):
            np.testing.assert_array_equal(np.array(clone(x, indices)), np.array(ours(x, indices)))
