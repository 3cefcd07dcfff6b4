"""``gguf.convert_to_gguf`` (mlx-lm's signature): SmolLM2 written as a GGUF loads back in
this package's GGUF reader with the same weights, config and tokenizer, and llama.cpp's
own ``gguf`` reader (the test extra) sees llama.cpp's names and tokenizer keys."""

import glob
import json

import gguf as llama_cpp_gguf
import mlx.core as mx
import pytest
from transformers import AutoTokenizer

from mlx_lm_batched.gguf import convert_to_gguf, read_gguf
from mlx_lm_batched.loading.gguf_tokenizer import build_gguf_tokenizer

TEXTS = ["Hello world! 12345 apples cost $3.50.", "  spaced\tout\nlines 007 ", "naïve café"]


@pytest.fixture(scope="module")
def written(float_dirs, tmp_path_factory):
    directory = float_dirs["smollm2"]
    config = json.loads((directory / "config.json").read_text())
    weights = {}
    for f in glob.glob(str(directory / "*.safetensors")):
        weights.update(mx.load(f))
    path = tmp_path_factory.mktemp("gguf") / "smollm2.gguf"
    convert_to_gguf(directory, weights, config, str(path))
    return directory, config, weights, path


def test_round_trip_through_our_reader(written):
    directory, config, weights, path = written
    back, back_config, metadata = read_gguf(str(path))
    assert sorted(back) == sorted(weights)
    for name, w in weights.items():
        assert mx.array_equal(back[name], w), name
    assert {k: back_config[k] for k in back_config if k in config} == \
        {k: config[k] for k in back_config if k in config}
    ours = build_gguf_tokenizer(metadata, "llama")
    original = AutoTokenizer.from_pretrained(str(directory))
    for text in TEXTS:
        assert ours.encode(text) == original.encode(text), text
    assert metadata["tokenizer.chat_template"] == original.chat_template


def test_llama_cpp_reader_sees_llama_names(written):
    _, config, _, path = written
    reader = llama_cpp_gguf.GGUFReader(str(path))
    field = lambda key: reader.fields[key].contents()  # noqa: E731
    assert field("general.architecture") == "llama"
    assert field("llama.block_count") == config["num_hidden_layers"]
    assert field("llama.attention.head_count_kv") == config["num_key_value_heads"]
    assert field("tokenizer.ggml.model") == "gpt2"
    assert len(field("tokenizer.ggml.tokens")) == config["vocab_size"]
    names = {t.name for t in reader.tensors}
    assert {"token_embd.weight", "output_norm.weight", "blk.0.attn_q.weight",
            "blk.0.ffn_down.weight"} <= names and "output.weight" not in names  # tied


def test_other_models_refused_with_one_line(written, tmp_path):
    directory, config, weights, _ = written
    with pytest.raises(NotImplementedError, match="model_type 'gemma3_text'"):
        convert_to_gguf(directory, weights, dict(config, model_type="gemma3_text"),
                        str(tmp_path / "x.gguf"))
    with pytest.raises(NotImplementedError, match="quantized"):
        convert_to_gguf(directory, {"model.norm.scales": mx.zeros((2,))}, config,
                        str(tmp_path / "x.gguf"))
