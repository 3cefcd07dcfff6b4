"""mlx_lm_batched.gguf (weights and config) against transformers' own GGUF conversion, on the
two real demo GGUFs. The tokenizer is tested in test_gguf_tokenizer.py.

The transformers reference is ``load_gguf_checkpoint`` -- the function
``AutoModelForCausalLM.from_pretrained(..., gguf_file=...)`` loads its tensors and config
with -- called once per model: from_pretrained would parse the file twice with the slow
``gguf.GGUFReader`` (about a minute for Gemma on 2 cores). Its only need for a model is
the parameter-name map, so the model is built on the meta device.
"""

import json

import mlx_lm_batched  # noqa: F401  (before mlx.core: loads the fast BLAS)
import mlx.core as mx
import numpy as np
import pytest

from mlx_lm_batched.loading.gguf import _parse, _rope_scaling, _unpermute, gguf_architecture, read_gguf

import torch  # the oracle (test extra): missing fails, never skips
import transformers



def _reference(path):
    """(transformers' parsed GGUF config, its float32 tensors, the model's state_dict names)."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ours = _config_only(path)  # only shapes the meta model; names come from its class
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**ours))
    parsed = load_gguf_checkpoint(path, return_tensors=True, model_to_load=model, torch_dtype=torch.float32)
    tied = model.config.tie_word_embeddings
    names = [k for k in model.state_dict() if not (tied and k == "lm_head.weight")]
    return parsed["config"], parsed["tensors"], names


def _config_only(path):
    from mlx_lm_batched.loading.gguf import _config

    md, tensors = _parse(path)
    return _config(md, md["general.architecture"], tensors)


@pytest.fixture(scope="module")
def smol_ref(smol_path):
    return _reference(smol_path)


@pytest.fixture(scope="module")
def gemma_ref(gemma_path):
    return _reference(gemma_path)


@pytest.fixture(scope="module")
def smol_f32(smol_path):
    return read_gguf(smol_path, dtype=mx.float32)


@pytest.fixture(scope="module")
def gemma_f32(gemma_path):
    return read_gguf(gemma_path, dtype=mx.float32)


def _check_weights(ref, ours):
    _, tensors, names = ref
    weights = ours[0]
    assert not [n for n in names if n not in weights], "names missing from read_gguf"
    assert not [n for n in names if n not in tensors], "names missing from transformers' load"
    assert set(weights) == set(names)
    for name in names:
        expect, got = tensors[name].numpy(), np.array(weights[name])
        assert got.dtype == np.float32 and got.shape == expect.shape, name
        # Both dequantize with gguf's reference arithmetic, so the values agree exactly.
        assert np.array_equal(got, expect), (name, float(np.abs(got - expect).max()))


def test_llama_weights_match_transformers(smol_ref, smol_f32):
    _check_weights(smol_ref, smol_f32)  # proves the q/k row un-permutation


def test_gemma3_weights_match_transformers(gemma_ref, gemma_f32):
    _check_weights(gemma_ref, gemma_f32)  # proves the norm - 1 (incl. q/k norms)
    names = gemma_ref[2]
    assert "model.layers.0.pre_feedforward_layernorm.weight" in names
    assert "model.layers.0.self_attn.q_norm.weight" in names


def test_quantized_triples(smol_path, smol_f32):
    weights, config, _ = read_gguf(smol_path)
    quant = config["quantization"]
    assert quant == config["quantization_config"]
    assert quant["group_size"] == 32 and quant["bits"] == 4
    assert quant["model.embed_tokens"] == {"group_size": 32, "bits": 8}  # Q8_0 embedding
    modules = [k[: -len(".scales")] for k in weights if k.endswith(".scales")]
    assert len(modules) == 30 * 7 + 1  # every Q4_1 linear + the Q8_0 embedding
    for m in modules:
        bits = quant.get(m, quant)["bits"]
        w, s, b = weights[f"{m}.weight"], weights[f"{m}.scales"], weights[f"{m}.biases"]
        assert w.dtype == mx.uint32 and s.dtype == mx.float16 and b.dtype == mx.float16
        deq = mx.dequantize(w, s.astype(mx.float32), b.astype(mx.float32), group_size=32, bits=bits)
        ref = smol_f32[0][f"{m}.weight"]
        # scale * q + bias vs ggml's d * (q - offset): equal up to float32 rounding
        assert mx.allclose(deq, ref, rtol=0, atol=1e-6 * mx.abs(ref).max().item()).item(), m
    assert weights["model.norm.weight"].dtype == mx.float32  # F32 tensors are passed through

    # Our repacking equals mx.load's own GGUF reader bit for bit (after the q/k un-permutation).
    loaded = mx.load(smol_path)
    for part in ("weight", "scales", "biases"):
        for gname, hname, heads in [("attn_q", "q_proj", 9), ("attn_k", "k_proj", 3), ("ffn_down", "down_proj", 0)]:
            ref = np.array(loaded[f"blk.5.{gname}.{part}"])
            ref = _unpermute(ref, heads) if heads else ref
            np.testing.assert_array_equal(np.array(weights[f"model.layers.5.self_attn.{hname}.{part}"
                                                           if heads else f"model.layers.5.mlp.{hname}.{part}"]), ref)
        np.testing.assert_array_equal(np.array(weights[f"model.embed_tokens.{part}"]),
                                      np.array(loaded[f"token_embd.{part}"]))


KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "max_position_embeddings", "tie_word_embeddings",
        "bos_token_id", "pad_token_id", "rope_parameters"]


def _check_config(ref, ours, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(ours))
    loaded = transformers.AutoConfig.from_pretrained(tmp_path)
    theirs = transformers.AutoConfig.for_model(**ref[0])
    assert type(loaded) is type(theirs)
    for key in KEYS:
        assert getattr(loaded, key) == getattr(theirs, key), key
    assert loaded.rms_norm_eps == pytest.approx(theirs.rms_norm_eps, rel=1e-6)
    return loaded, theirs


def test_llama_config(smol_ref, smol_f32, tmp_path):
    cfg = smol_f32[1]
    assert cfg["model_type"] == "llama" and cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["rms_norm_eps"] == 1e-5 and cfg["rope_theta"] == 100000.0 and cfg["rope_scaling"] is None
    assert "quantization" not in cfg  # everything was dequantized
    loaded, theirs = _check_config(smol_ref, cfg, tmp_path)
    assert loaded.eos_token_id == theirs.eos_token_id == 2


def test_gemma3_config(gemma_ref, gemma_f32, tmp_path):
    cfg = gemma_f32[1]
    assert cfg["model_type"] == "gemma3_text" and cfg["architectures"] == ["Gemma3ForCausalLM"]
    assert cfg["rope_theta"] == 1e6 and cfg["rope_local_base_freq"] == 10000.0
    assert cfg["sliding_window"] == 512 and cfg["query_pre_attn_scalar"] == 256
    assert cfg["layer_types"].count("full_attention") == 3 and cfg["layer_types"][5] == "full_attention"
    assert cfg["hidden_activation"] == "gelu_pytorch_tanh" and cfg["final_logit_softcapping"] is None
    loaded, theirs = _check_config(gemma_ref, cfg, tmp_path)
    assert loaded.layer_types == theirs.layer_types
    assert loaded.sliding_window == theirs.sliding_window
    assert loaded.query_pre_attn_scalar == theirs.query_pre_attn_scalar
    assert loaded.eos_token_id == [1, 106]  # <eos>, <end_of_turn>


def test_llama3_rope_freqs():
    theta, head_dim = 500000.0, 64
    wavelen = 2 * np.pi / theta ** (-np.arange(0, head_dim, 2) / head_dim)
    smooth = (8192 / wavelen - 1) / 3
    freqs = np.where(wavelen < 2048, 1, np.where(wavelen > 8192, 32.0, 1 / ((1 - smooth) / 32 + smooth)))
    tensors = {"rope_freqs.weight": (0, freqs.shape, freqs.astype(np.float32).view(np.uint8))}
    got = _rope_scaling({}, "llama", tensors, theta, head_dim)
    assert got == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    tensors = {"rope_freqs.weight": (0, freqs.shape, (freqs * 1.1).astype(np.float32).view(np.uint8))}
    with pytest.raises(ValueError, match="llama3"):
        _rope_scaling({}, "llama", tensors, theta, head_dim)


def test_float_tensors_and_rope_scaling(tmp_path):
    """A tiny llama GGUF with BF16/F16/F32 tensors: dtypes kept, q/k un-permuted, yarn scaling."""
    import gguf

    heads, kv_heads, head_dim, hidden = 4, 2, 8, 32
    rng = np.random.default_rng(0)
    q = (rng.integers(-64, 64, (heads * head_dim, hidden)) / 64).astype(np.float32)  # exact in bf16
    k = (rng.integers(-64, 64, (kv_heads * head_dim, hidden)) / 64).astype(np.float16)

    def permute(w, n):  # what llama.cpp's convert_hf_to_gguf.py does to q/k
        return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    path = str(tmp_path / "tiny.gguf")
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(1)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(64)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_context_length(4096)
    writer.add_vocab_size(16)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    writer.add_rope_scaling_factor(4.0)
    writer.add_rope_scaling_orig_ctx_len(1024)
    bf16 = (permute(q, heads).view(np.uint32) >> 16).astype(np.uint16)
    writer.add_tensor("blk.0.attn_q.weight", bf16, raw_shape=q.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
    writer.add_tensor("blk.0.attn_k.weight", permute(k, kv_heads))
    writer.add_tensor("token_embd.weight", np.ones((16, hidden), np.float32))
    writer.add_tensor("output.weight", np.ones((16, hidden), np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    weights, config, _ = read_gguf(path)
    got_q = weights["model.layers.0.self_attn.q_proj.weight"]
    assert got_q.dtype == mx.bfloat16
    np.testing.assert_array_equal(np.array(got_q.astype(mx.float32)), q)
    assert weights["model.layers.0.self_attn.k_proj.weight"].dtype == mx.float16
    np.testing.assert_array_equal(np.array(weights["model.layers.0.self_attn.k_proj.weight"]), k)
    assert weights["lm_head.weight"].dtype == mx.float16 and config["tie_word_embeddings"] is False
    assert "quantization" not in config
    assert config["rope_scaling"] == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024}
    assert read_gguf(path, dtype=mx.float32)[0]["model.layers.0.self_attn.q_proj.weight"].dtype == mx.float32


def test_unknown_architecture(tmp_path):
    import gguf

    path = str(tmp_path / "fake.gguf")
    writer = gguf.GGUFWriter(path, "fakearch")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    for fn in (gguf_architecture, read_gguf):
        with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'fakearch'.*llama, gemma3"):
            fn(path)


def test_architecture_names(smol_path, gemma_path):
    assert gguf_architecture(smol_path) == "llama"
    assert gguf_architecture(gemma_path) == "gemma3"
