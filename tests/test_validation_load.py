"""``load`` on real model directories made broken: one clear line naming the file."""

import json

import mlx.core as mx
import pytest

from mlx_lm_batched import load
from mlx_lm_batched.utils import ModelLoadError


def _copy(src, dst, skip=()):
    """A model directory of symlinks to ``src``'s files, except those in ``skip``."""
    dst.mkdir()
    for f in src.iterdir():
        if f.name not in skip:
            (dst / f.name).symlink_to(f)
    return dst


def _config(src):
    return json.loads((src / "config.json").read_text())


def _one_line_error(path, *words, kind=ModelLoadError, **kwargs):
    with pytest.raises(kind) as e:
        load(str(path), **kwargs)
    message = str(e.value)
    assert "\n" not in message, message
    for w in words:
        assert w in message, (w, message)
    return message


def test_truncated_and_corrupt_safetensors(tmp_path, float_dirs):
    src = float_dirs["smollm2"]
    real = src / "model.safetensors"
    cases = {
        "truncated": real.open("rb").read(3_000_000),  # header intact, tensors cut off
        "garbage": b"this is not a safetensors file at all",
        "empty": b"",
    }
    for name, data in cases.items():
        d = _copy(src, tmp_path / name, skip={"model.safetensors"})
        (d / "model.safetensors").write_bytes(data)
        _one_line_error(d, str(d / "model.safetensors"), "cannot read weights")


def test_missing_weights_are_listed_on_one_line(tmp_path, float_dirs):
    src = float_dirs["smollm2"]
    d = _copy(src, tmp_path / "partial", skip={"model.safetensors"})
    real = mx.load(str(src / "model.safetensors"))
    keep = ["model.norm.weight", "model.layers.0.input_layernorm.weight"]
    mx.save_safetensors(str(d / "model.safetensors"), {k: real[k] for k in keep})
    missing = len(real) - len(keep)
    message = _one_line_error(d, f"missing {missing} parameters: ", "model.embed_tokens.weight",
                              f"(and {missing - 8} more)", "*.safetensors")
    assert message.count(", ") >= 7


def test_weights_that_do_not_fit_the_config(float_dirs):
    _one_line_error(float_dirs["smollm2"], "has shape", "the model expects",
                    model_config={"intermediate_size": 100})


@pytest.mark.parametrize("text,words", [
    ("{not json", ["cannot read", "config.json"]),
    ("[1, 2, 3]", ["must hold a JSON object", "list"]),
    ("\"llama\"", ["must hold a JSON object", "str"]),
])
def test_config_that_is_not_a_json_object(tmp_path, float_dirs, text, words):
    d = _copy(float_dirs["smollm2"], tmp_path / "m", skip={"config.json"})
    (d / "config.json").write_text(text)
    _one_line_error(d, str(d / "config.json"), *words)


@pytest.mark.parametrize("change,words", [
    ({"model_type": None}, ["has no 'model_type'"]),
    ({"model_type": ["llama"]}, ["'model_type' must be a string"]),
    ({"model_type": "no_such_arch"}, ["unknown model_type 'no_such_arch'", "supported:"]),
    ({"hidden_size": None}, ["missing required key 'hidden_size'"]),
    ({"hidden_size": "576"}, ["'hidden_size' must be int", "str"]),
    ({"num_hidden_layers": 2.5}, ["'num_hidden_layers' must be int", "float"]),
    ({"num_attention_heads": 0}, ["'num_attention_heads' must be an integer >= 1"]),
    ({"rope_theta": "big"}, ["'rope_theta' must be float"]),
    ({"rope_scaling": [1, 2]}, ["'rope_scaling' must be"]),
    ({"tie_word_embeddings": "yes"}, ["'tie_word_embeddings' must be bool"]),
])
def test_config_with_a_missing_or_wrongly_typed_key(tmp_path, float_dirs, change, words):
    src = float_dirs["smollm2"]
    config = _config(src)
    for k, v in change.items():
        if v is None:
            config.pop(k)
        else:
            config[k] = v
    d = _copy(src, tmp_path / "m", skip={"config.json"})
    (d / "config.json").write_text(json.dumps(config))
    _one_line_error(d, str(d / "config.json"), *words)


def test_missing_directory_and_bad_argument_types(tmp_path):
    _one_line_error(tmp_path / "nowhere", "does not exist")
    _one_line_error(tmp_path, "no config.json")
    with pytest.raises(TypeError, match="path_or_hf_repo"):
        load(42)
    with pytest.raises(TypeError, match="model_config must be a dict"):
        load(str(tmp_path), model_config=[1])


def test_broken_tokenizer_is_one_line(tmp_path, float_dirs):
    d = _copy(float_dirs["smollm2"], tmp_path / "m", skip={"tokenizer.json"})
    (d / "tokenizer.json").write_text("{broken")
    _one_line_error(d, "cannot load the tokenizer", str(d))


def test_generation_config_eos_wins_over_config_json(tmp_path, float_dirs):
    src = float_dirs["smollm2"]
    assert _config(src)["eos_token_id"] == 2
    d = _copy(src, tmp_path / "m")
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    _, tokenizer, config = load(str(d), return_config=True)
    assert tokenizer.eos_token_ids == {2, 7} and config["eos_token_id"] == [2, 7]
    # model_config still overrides both.
    _, tokenizer = load(str(d), model_config={"eos_token_id": 9})
    assert tokenizer.eos_token_ids == {2, 9}


def test_trust_remote_code_is_accepted(float_dirs):
    model, tokenizer = load(str(float_dirs["smollm2"]), trust_remote_code=True)
    assert model.args.model_type == "llama" and tokenizer.eos_token_id == 2

