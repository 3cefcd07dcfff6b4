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

from arch_harness import VOCAB, run_family
from mlx_lm_batched.models import gemma3n_text

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
    """Only the layers that compute keys/values get caches; each KV-shared layer
    attends through the cache of the last earlier layer of its kind."""
    config = dict(GEMMA3N_TEXT, model_type="gemma3n_text")
    model = gemma3n_text.Model(gemma3n_text.ModelArgs.from_dict(config))
    assert model.kv_sources == [0, 1, 2, 1, 1, 2]
    caches = model.make_cache()
    assert len(caches) == 3
    assert [c.max_size for c in caches[:2]] == [8, 8] and not hasattr(caches[2], "max_size")
    assert [id(c) for c in model.layer_caches(caches)] == [id(caches[s]) for s in (0, 1, 2, 1, 1, 2)]
    names = [name for name, _ in tree_flatten(model.parameters())]
    assert "model.layers.2.self_attn.k_proj.weight" in names
    assert not any(n.startswith(f"model.layers.{i}.self_attn.{p}")
                   for n in names for i in (3, 4, 5) for p in ("k_", "v_"))
    one = gemma3n_text.ModelArgs.from_dict(dict(config, activation_sparsity_pattern=0.5))
    assert one.activation_sparsity_pattern == [0.5] * 6
    with pytest.raises(ValueError, match="KV-shared layer 3"):
        gemma3n_text.ModelArgs.from_dict(dict(config, layer_types=[SLIDING] * 3 + [FULL] * 3))


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

    from mlx_lm_batched.distributed import shard_model
    from mlx_lm_batched.models.layers import Attention, RMSNorm

    holder = nn.Module()
    holder.attn = Attention(64, 4, 2, 16, qk_norm=lambda d: RMSNorm(d), kv_proj=False)
    shard_model(holder, _RankZeroOfTwo())
    assert holder.attn.q_proj.weight.shape == (32, 64) and "k_proj" not in holder.attn
    assert (holder.attn.n_heads, holder.attn.n_kv_heads) == (2, 1)
    config = dict(GEMMA3N_TEXT, model_type="gemma3n_text")
    model = gemma3n_text.Model(gemma3n_text.ModelArgs.from_dict(config))
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.per_layer_model_projection' of TextModel"):
        shard_model(model, _RankZeroOfTwo())
