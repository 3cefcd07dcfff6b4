"""Gemma 3n (text model and the language model of multimodal checkpoints) against
transformers' ``Gemma3nForCausalLM``: AltUp streams, LAuReL, per-layer inputs,
gaussian top-k sparsity, soft-capped logits, and KV-shared layers reading the
caches of earlier layers, with sliding windows that bind, in both config layouts.

transformers cannot build the multimodal ``Gemma3nForConditionalGeneration`` here
(its vision tower needs timm), so the ``gemma3n`` entry rewrites the text model's
checkpoint into the multimodal layout hub checkpoints use: config under
``text_config``, weights under ``model.language_model.``, tower weights next to
them, and the key/value weights hub checkpoints keep for KV-shared layers."""

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from arch_harness import VOCAB, make_prompts, run_family
from mlx_lm_batched.engine.batch_engine import BatchEngine
from mlx_lm_batched.engine.prefill_plan import left_pad
from mlx_lm_batched.models import gemma3n_text, gemma4_text
from mlx_lm_batched.models.cache import load_prompt_cache, save_prompt_cache
from mlx_lm_batched.layers.attention_options import QKNorm
from mlx_lm_batched.layers.kv_sharing import KVShare, SharedKVAttention, layer_inputs

SLIDING, FULL = "sliding_attention", "full_attention"
TEXT = dict(vocab_size=VOCAB, vocab_size_per_layer_input=96, hidden_size=64, intermediate_size=96,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            hidden_size_per_layer_input=8, sliding_window=8, laurel_rank=4,
            max_position_embeddings=256)
# Six layers, the last three reading the keys/values of layers 1 (sliding) and 2
# (global); sparsity in the first two MLPs; ids >= 96 have no per-layer embedding.
GEMMA3N_TEXT = dict(TEXT, num_hidden_layers=6, layer_types=[SLIDING, SLIDING, FULL] * 2,
                    num_kv_shared_layers=3, altup_num_inputs=3,
                    activation_sparsity_pattern=[0.95, 0.95, 0.0, 0.0, 0.0, 0.0])
# Per-layer MLP sizes, sparsity in every layer, AltUp active on the second stream,
# no scale of the corrected output, and a global layer first.
GEMMA3N = dict(TEXT, num_hidden_layers=5, layer_types=[FULL, SLIDING, SLIDING, FULL, SLIDING],
               intermediate_size=[96, 64, 96, 32, 64], num_kv_shared_layers=2, altup_num_inputs=2,
               altup_active_idx=1, altup_correct_scale=False, activation_sparsity_pattern=[0.6] * 5)
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}


def multimodal_layout(directory):
    """Rewrite a saved ``Gemma3nForCausalLM`` as a ``gemma3n`` multimodal checkpoint."""
    path = Path(directory)
    text = json.loads((path / "config.json").read_text())
    outer = {k: text.pop(k) for k in ("architectures", "dtype", "transformers_version",
                                      "tie_word_embeddings") if k in text}
    text["model_type"] = "gemma3n_text"
    config = dict(outer, model_type="gemma3n", architectures=["Gemma3nForConditionalGeneration"],
                  text_config=text, vision_config={"model_type": "gemma3n_vision"},
                  audio_config={"model_type": "gemma3n_audio"})
    (path / "config.json").write_text(json.dumps(config, indent=2))
    weights = mx.load(str(path / "model.safetensors"))
    out = {"model.language_model." + k[len("model."):]: v for k, v in weights.items()}
    key = mx.random.key(3)
    n, d = text["num_hidden_layers"], text["hidden_size"]
    kv = text["num_key_value_heads"] * text["head_dim"]
    for i in range(n - text["num_kv_shared_layers"], n):
        prefix = f"model.language_model.layers.{i}.self_attn"
        out[f"{prefix}.k_proj.weight"] = mx.random.normal((kv, d), key=key)
        out[f"{prefix}.v_proj.weight"] = mx.random.normal((kv, d), key=key)
        out[f"{prefix}.k_norm.weight"] = mx.ones((text["head_dim"],))
    out["model.vision_tower.timm_model.conv_stem.conv.weight"] = mx.zeros((8, 3, 3, 3))
    out["model.embed_vision.embedding.weight"] = mx.zeros((4, d))
    out["model.audio_tower.subsample_conv_projection.input_proj_linear.weight"] = mx.zeros((d, 8))
    out["model.embed_audio.embedding_projection.weight"] = mx.zeros((d, 8))
    mx.save_safetensors(str(path / "model.safetensors"), out, metadata={"format": "pt"})


FAMILIES = {
    "gemma3n_text": (GEMMA3N_TEXT, WINDOWED),
    # Every layer on a ring of 12 slots: KV-shared global layers read a ring too.
    "gemma3n_text_ring": (GEMMA3N_TEXT, dict(WINDOWED, model_type="gemma3n_text",
                                             max_kv_size=12)),
    "gemma3n": (GEMMA3N, dict(WINDOWED, model_type="gemma3n_text", saved_model_type="gemma3n",
                              rewrite=multimodal_layout)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_gemma3n_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def test_kv_shared_layers_read_their_source_cache():
    """Only the layers that compute keys/values get caches (mlx-lm's list); each
    KV-shared layer gets its source's mask and the KVShare wrapping its source's
    cache, which the source fills in the same pass."""
    config = dict(GEMMA3N_TEXT, model_type="gemma3n_text")
    model = gemma3n_text.Model(gemma3n_text.ModelArgs.from_dict(config))
    sources = model.model.sources
    assert sources == [0, 1, 2, 1, 1, 2]
    caches = model.make_cache()
    assert len(caches) == 3 and len(model.layer_windows) == 3
    assert [c.max_size for c in caches[:2]] == [8, 8] and not hasattr(caches[2], "max_size")
    masks = ["m0", "m1", "m2"]
    wired = layer_inputs(sources, caches, masks)
    assert [m for m, _ in wired] == ["m0", "m1", "m2", "m1", "m1", "m2"]
    assert wired[0][1] is caches[0]  # read by no later layer: its own cache
    for layer, source in ((3, 1), (4, 1), (5, 2)):
        assert wired[layer][1] is wired[source][1] and isinstance(wired[source][1], KVShare)
        assert wired[source][1].cache is caches[source]
    with pytest.raises(RuntimeError, match="before its source"):
        wired[3][1].fetch()
    keys = values = mx.ones((1, 2, 3, 16))
    assert wired[1][1].update_and_fetch(keys, values)[0].shape == (1, 2, 3, 16)
    assert caches[1].offset == 3 and wired[4][1].fetch()[0].shape == (1, 2, 3, 16)
    assert layer_inputs(sources, None, masks)[4][1].cache is None
    names = [name for name, _ in tree_flatten(model.parameters())]
    assert "model.layers.2.self_attn.k_proj.weight" in names
    assert not any(n.startswith(f"model.layers.{i}.self_attn.{p}")
                   for n in names for i in (3, 4, 5) for p in ("k_", "v_"))
    one = gemma3n_text.ModelArgs.from_dict(dict(config, activation_sparsity_pattern=0.5))
    assert one.activation_sparsity_pattern == [0.5] * 6
    with pytest.raises(ValueError, match=r"layer 3 \(full_attention\) shares keys and values"):
        gemma3n_text.ModelArgs.from_dict(dict(config, layer_types=[SLIDING] * 3 + [FULL] * 3))


@pytest.mark.parametrize("model_type", ["gemma3n_text", "gemma4_text"])
def test_kv_shared_caches_save_load_and_continue_exactly(model_type, tmp_path):
    """Gemma 3n and 4 keep one cache per source layer (mlx-lm's list); a padded
    batch's caches, saved and loaded, continue exactly where the originals do, with
    the sliding windows bound."""
    from test_arch_gemma4 import TEXT as GEMMA4_TEXT

    module = {"gemma3n_text": gemma3n_text, "gemma4_text": gemma4_text}[model_type]
    config = GEMMA3N_TEXT if model_type == "gemma3n_text" else GEMMA4_TEXT
    mx.random.seed(5)
    model = module.Model(module.ModelArgs.from_dict(dict(config, model_type=model_type)))
    owners = config["num_hidden_layers"] - config["num_kv_shared_layers"]
    tokens, padding = left_pad(make_prompts((13, 4, 10), seed=4))
    engine = BatchEngine(model)
    y, _ = engine.prefill(tokens, padding)
    path = str(tmp_path / "cache.safetensors")
    save_prompt_cache(path, engine.cache)
    loaded = load_prompt_cache(path)
    assert len(loaded) == owners
    assert [type(c) for c in loaded] == [type(c) for c in model.make_cache()]
    again = BatchEngine(model, prompt_cache=loaded)
    y1, y2 = y, y
    for _ in range(4):
        (y1, lp1), (y2, lp2) = engine.step(y1), again.step(y2)
        np.testing.assert_array_equal(np.array(y1), np.array(y2))
        np.testing.assert_allclose(np.array(lp1), np.array(lp2), atol=1e-5)


def test_gaussian_topk_keeps_the_top_share():
    """Sparsity 0.95 keeps about the top 5% of a gaussian row (transformers' cut)."""
    x = mx.random.normal((4, 4096), key=mx.random.key(0))
    kept = np.array(gemma3n_text.sparse_activation(lambda t: t, 0.95)(x) > 0).mean()
    assert 0.04 < kept < 0.06



class _RankZeroOfTwo:
    """Rank 0 of a 2-rank group, where sharding itself needs no collective."""

    def size(self):
        return 2

    def rank(self):
        return 0


def test_tensor_parallel_kv_shared_attention_keeps_its_query_heads_and_gemma3n_is_refused():
    """A KV-shared attention shards like its source (its query heads and their norm);
    the whole model is refused by name (AltUp/LAuReL projections are not shardable)."""
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.layers.norms import RMSNorm

    holder = nn.Module()
    holder.attn = SharedKVAttention(64, 4, 2, 16, qk_norm=QKNorm(lambda d: RMSNorm(d)))
    shard_model(holder, _RankZeroOfTwo())
    assert holder.attn.q_proj.weight.shape == (32, 64) and "k_proj" not in holder.attn
    assert "k_norm" not in holder.attn and holder.attn.q_norm.weight.shape == (16,)
    assert (holder.attn.n_heads, holder.attn.n_kv_heads) == (2, 1)
    config = dict(GEMMA3N_TEXT, model_type="gemma3n_text")
    model = gemma3n_text.Model(gemma3n_text.ModelArgs.from_dict(config))
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.per_layer_model_projection' of TextModel"):
        shard_model(model, _RankZeroOfTwo())
