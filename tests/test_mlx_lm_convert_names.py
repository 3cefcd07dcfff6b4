"""``convert`` writes what mlx-lm 0.32 loads (weight names and the config keys it reads),
checked by loading the output with ``mlx_lm.utils.load_model`` and comparing its logits
with this package's; the output (mlx-lm names) still loads here."""

import importlib
from pathlib import Path

import mlx.core as mx
import mlx_lm.utils
import pytest
from mlx.utils import tree_flatten

from arch_harness import build_hf_model, save_hf_model
from mlx_lm_batched.convert import convert
from mlx_lm_batched.loading.load import load_model

# (test module holding the tiny config, family name there[, checkpoint layout])
CASES = {
    "mixtral": ("test_arch_moe", "mixtral"),  # experts stacked into switch_mlp
    "phi": ("test_arch_dense_b", "phi"),  # attention output named dense there
    "qwen3_moe": ("test_arch_moe", "qwen3_moe"),  # num_experts (transformers 5 renamed it)
    "gemma4_text": ("test_arch_gemma4", "gemma4_text"),  # global_head_dim, rope keys
    "gemma4": ("test_arch_gemma4", "gemma4"),  # the language_model. prefix
    "gemma4_text_moe": ("test_arch_gemma4", "gemma4_text_moe"),
    # text-only model_types mlx-lm lacks (written as qwen3_5 / qwen3_5_moe), layer_types
    # as its full_attention_interval, RoPE as its rope_parameters; both config layouts
    "qwen3_5_text": ("test_arch_recurrent", "qwen3_5_text"),
    "qwen3_5_text-t4": ("test_arch_recurrent", "qwen3_5_text", "transformers4"),
    "qwen3_5_moe_text": ("test_arch_recurrent", "qwen3_5_moe_text"),
    "qwen3_5-flat": ("test_arch_recurrent", "qwen3_5-flat"),
    "qwen3_5_moe-flat": ("test_arch_recurrent", "qwen3_5_moe-flat"),
}
PROMPT = [[1, 9, 3, 11, 40]]  # no multimodal placeholder ids (5, 6, 7)


def converted(tmp_path, module, family, layout="transformers5", change=None):
    config, options = importlib.import_module(module).FAMILIES[family]
    hf = build_hf_model(options.get("model_type", family), dict(config, **(change or {})))
    save_hf_model(hf, tmp_path / "hf", layout, options.get("saved_model_type"))
    return convert(str(tmp_path / "hf"), str(tmp_path / "out"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_converted_model_loads_in_mlx_lm_with_our_logits(tmp_path, name):
    out = converted(tmp_path, *CASES[name])
    ours = load_model(Path(out))
    ours = ours[0] if isinstance(ours, tuple) else ours
    theirs, _ = mlx_lm.utils.load_model(Path(out))
    x = mx.array(PROMPT)
    worst = float(mx.abs(theirs(x) - ours(x)).max())
    assert worst < 1e-4, (name, worst)


def test_gemma4_experts_are_written_as_mlx_lms_switch_glu_and_load_back(tmp_path):
    out = converted(tmp_path, "test_arch_gemma4", "gemma4_text_moe")
    names = list(mx.load(str(Path(out) / "model.safetensors")))
    assert any(".experts.switch_glu.gate_proj." in n for n in names)
    assert not any(".experts.gate_proj." in n for n in names)
    model = load_model(Path(out))
    model = model[0] if isinstance(model, tuple) else model
    params = dict(tree_flatten(model.parameters()))
    assert any(".experts.gate_proj." in n for n in params)  # this package's own names
    source = load_model(tmp_path / "hf")  # the Hugging Face checkpoint itself
    source = source[0] if isinstance(source, tuple) else source
    x = mx.array(PROMPT)
    assert mx.allclose(model(x), source(x), atol=1e-5).item()


def test_qwen3_5_layers_mlx_lm_cannot_represent_are_one_warning_and_load_here(tmp_path):
    """mlx-lm 0.32 places Qwen3.5's full-attention layers by ``full_attention_interval``
    only: other ``layer_types`` are one warning line; the output still loads here."""
    types = ["linear_attention", "full_attention", "full_attention", "linear_attention"]
    with pytest.warns(UserWarning, match=r"mlx-lm 0.32 cannot load this qwen3_5 checkpoint "
                                         r"correctly: layer_types \[.*\] are not every n-th"):
        out = converted(tmp_path, "test_arch_recurrent", "qwen3_5_text",
                        change={"layer_types": types})
    model = load_model(Path(out))[0]
    source = load_model(tmp_path / "hf")[0]
    assert model.args.layer_types == types
    x = mx.array(PROMPT)
    assert mx.allclose(model(x), source(x), atol=1e-5).item()


def test_qwen3_5_moe_with_dense_layers_is_one_warning_and_loads_here(tmp_path):
    """mlx-lm 0.32's Qwen3.5-MoE has experts in every layer: a checkpoint with dense
    layers (``mlp_only_layers``, which this package reads) converts with one warning."""
    import json

    from test_arch_recurrent import QWEN3_5_MOE
    from mlx_lm_batched.models import qwen3_5

    config = dict(QWEN3_5_MOE, model_type="qwen3_5_moe_text", intermediate_size=40,
                  mlp_only_layers=[1])
    source = qwen3_5.Model(qwen3_5.ModelArgs.from_dict(config))
    (tmp_path / "src").mkdir()
    mx.save_safetensors(str(tmp_path / "src" / "model.safetensors"),
                        dict(tree_flatten(source.parameters())))
    (tmp_path / "src" / "config.json").write_text(json.dumps(config))
    with pytest.warns(UserWarning, match="qwen3_5_moe checkpoint correctly: some layers "
                                         "have a dense MLP"):
        out = convert(str(tmp_path / "src"), str(tmp_path / "out"))
    model = load_model(Path(out))[0]
    assert not model.args.is_moe_layer(1) and model.args.is_moe_layer(0)
    x = mx.array(PROMPT)
    assert mx.allclose(model(x), source(x), atol=1e-5).item()


def test_convert_cli_mixed_recipe_loads_in_mlx_lm_with_our_logits(tmp_path):
    """``python -m mlx_lm_batched.convert -q --quant-predicate mixed_3_6`` (mlx-lm's flags)
    writes mlx-lm's per-layer bit widths; mlx-lm loads the output with our logits."""
    import json
    import subprocess
    import sys

    config = dict(hidden_size=64, num_hidden_layers=8, intermediate_size=128,
                  num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                  rms_norm_eps=1e-5, tie_word_embeddings=False)
    save_hf_model(build_hf_model("llama", config), tmp_path / "hf", "transformers5")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.convert", "--hf-path",
                           str(tmp_path / "hf"), "--mlx-path", str(out), "-q", "--q-group-size",
                           "32", "--quant-predicate", "mixed_3_6"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    quantization = json.loads((out / "config.json").read_text())["quantization"]
    bits = {v["bits"] for v in quantization.values() if isinstance(v, dict)}
    assert bits == {3, 6} and quantization["group_size"] == 32
    ours = load_model(out)
    ours = ours[0] if isinstance(ours, tuple) else ours
    theirs, _ = mlx_lm.utils.load_model(out)
    x = mx.array(PROMPT)
    assert mx.allclose(theirs(x), ours(x), atol=1e-4).item()
    bad = subprocess.run([sys.executable, "-m", "mlx_lm_batched.convert", "--hf-path",
                          str(tmp_path / "hf"), "--mlx-path", str(tmp_path / "o2"),
                          "--quant-predicate", "mixed_3_6"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--quantize" in bad.stderr
