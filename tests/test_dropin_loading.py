"""mlx-lm's loading contracts that code written for it relies on, against mlx-lm as the
oracle: a checkpoint's own ``model_file`` (refused unless ``trust_remote_code=True``),
``strict=False`` on a directory without weights, ``utils._get_classes`` and
``make_shards``."""

import json
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest

ARCH = """\
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn

(Path(__file__).parent / "ran.txt").write_text("yes")


class ModelArgs:
    def __init__(self, width):
        self.width = width

    @classmethod
    def from_dict(cls, params):
        return cls(params["width"])


class Model(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.proj = nn.Linear(args.width, args.width)

    def __call__(self, x):
        return self.proj(x)
"""


def _custom_dir(path):
    (path / "config.json").write_text(json.dumps({"model_type": "custom", "width": 4,
                                                  "model_file": "arch.py"}))
    (path / "arch.py").write_text(ARCH)
    weights = {"proj.weight": mx.arange(16, dtype=mx.float32).reshape(4, 4) / 10,
               "proj.bias": mx.ones((4,))}
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


def test_model_file_needs_trust_remote_code_and_then_loads_as_mlx_lm(tmp_path):
    from mlx_lm import utils as theirs

    from mlx_lm_batched import utils as ours

    path = _custom_dir(tmp_path)
    with pytest.raises(ValueError, match="trust_remote_code") as refused:
        ours.load_model(path)
    assert "\n" not in str(refused.value) and not (path / "ran.txt").exists()
    model, config = ours.load_model(path, trust_remote_code=True)
    assert (path / "ran.txt").read_text() == "yes" and config["model_file"] == "arch.py"
    reference, _ = theirs.load_model(path, trust_remote_code=True)
    x = mx.array([[1.0, 2.0, 3.0, 4.0]])
    np.testing.assert_array_equal(np.array(model(x)), np.array(reference(x)))
    (path / "arch.py").unlink()
    with pytest.raises(ValueError, match="does not exist"):
        ours.load_model(path, trust_remote_code=True)


def test_strict_false_without_weights_builds_the_architecture(tmp_path):
    from mlx.utils import tree_flatten
    from mlx_lm import utils as theirs

    from mlx_lm_batched import utils as ours

    config = dict(model_type="llama", hidden_size=32, num_hidden_layers=1,
                  intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
                  rms_norm_eps=1e-5, vocab_size=64)
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, loaded = ours.load_model(tmp_path, strict=False)
    reference, _ = theirs.load_model(tmp_path, strict=False)
    assert loaded["model_type"] == "llama"
    shapes = lambda m: {k: v.shape for k, v in tree_flatten(m.parameters())}
    assert shapes(model) == shapes(reference)
    with pytest.raises(ValueError, match="safetensors"):
        ours.load_model(tmp_path)  # strict: the weights are required


def test_get_classes_and_make_shards_match_mlx_lm():
    from mlx_lm import utils as theirs

    from mlx_lm_batched import utils as ours

    for config in ({"model_type": "llama"}, {"model_type": "mistral"},
                   {"model_type": "bailing_hybrid",
                    "architectures": ["BailingMoeV3ForCausalLM"]}):
        assert [c.__module__.split(".")[-1] for c in ours._get_classes(config)] == \
            [c.__module__.split(".")[-1] for c in theirs._get_classes(config)]
    gib = 1 << 30
    sizes = [{}, {"a": gib + 1}, {"a": 1 << 20, "b": gib + 1, "c": 1 << 20},
             {"a": gib // 2, "b": gib // 2, "c": gib // 2}]
    for case in sizes:
        weights = {k: SimpleNamespace(nbytes=n) for k, n in case.items()}
        assert [list(s) for s in ours.make_shards(weights, 1)] == \
            [list(s) for s in theirs.make_shards(weights, 1)]


def test_compressed_tensors_configs_load_as_mlx_lm(tmp_path):
    """A ``quant_method: compressed-tensors`` config with MLX-packed weights loads with
    the format's settings, giving mlx-lm's logits; the helper maps formats as mlx-lm's,
    and an FP8 format is refused in one line."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm import utils as theirs

    from mlx_lm_batched import utils as ours
    from mlx_lm_batched.models import llama

    for fmt in ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "pack-quantized"):
        assert ours._compressed_tensors_quantization({"format": fmt}) == \
            theirs._compressed_tensors_quantization({"format": fmt})
    with pytest.raises(ValueError, match="float-quantized") as refused:
        ours._compressed_tensors_quantization({"format": "float-quantized"})
    assert "\n" not in str(refused.value)

    config = dict(model_type="llama", hidden_size=64, num_hidden_layers=1,
                  intermediate_size=128, num_attention_heads=4, num_key_value_heads=4,
                  rms_norm_eps=1e-5, vocab_size=64, tie_word_embeddings=False,
                  quantization_config={"quant_method": "compressed-tensors",
                                       "format": "pack-quantized"})
    model = llama.Model(llama.ModelArgs.from_dict(config))
    nn.quantize(model, group_size=32, bits=4)
    mx.save_safetensors(str(tmp_path / "model.safetensors"),
                        dict(tree_flatten(model.parameters())))
    (tmp_path / "config.json").write_text(json.dumps(config))
    loaded, _ = ours.load_model(tmp_path)
    reference, _ = theirs.load_model(tmp_path)
    prompt = mx.array([[1, 5, 9, 2]])
    np.testing.assert_allclose(np.array(loaded(prompt)), np.array(reference(prompt)),
                               atol=1e-4)
    assert loaded.model.layers[0].mlp.up_proj.bits == 4
    config["quantization_config"]["format"] = "float-quantized"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="float-quantized"):
        ours.load_model(tmp_path)
