"""DeepSeek V4.1 (``deepseek_v41`` and its
``deepseek_v41_text`` alias), checked against mlx-lm 0.32's module on the same tiny
random checkpoint (transformers 5.24 has no DeepSeek V4.1)."""

import mlx.core as mx
import numpy as np
import pytest
from arch_harness import VOCAB, make_prompts, run_family
from mlx_lm_oracle import build_mlx_lm_model

from mlx_lm_batched.models.deepseek_v41 import Model, ModelArgs

# Four layers: window only; a 2-to-1 compressor that also makes index keys and picks
# the candidate blocks (2 blocks of 2 keys); an indexer reusing those keys within the
# candidates; a layer reusing the previous top-k. A window of 4 slots and a top-k of 3
# groups make prompts of 12 tokens exercise eviction, group closing and selection.
DEEPSEEK_V41 = dict(
    vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
    head_dim=32, q_lora_rank=32, qk_rope_head_dim=8, o_groups=2, o_lora_rank=16,
    moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
    routed_scaling_factor=1.5, swiglu_limit=10.0, rms_norm_eps=1e-6, sliding_window=4,
    compress_ratios=[0, 2, 2, 2], kv_source_layer_ids=[1], index_source_layer_ids=[1, 2],
    candidate_source_layer_id=1, candidate_topk_blocks=2, candidate_block_size=2,
    index_n_heads=2, index_head_dim=32, index_topk=3, rope_theta=10000.0,
    compress_rope_theta=40000.0, max_position_embeddings=256, hc_mult=2,
    hc_sinkhorn_iters=4, tie_word_embeddings=False,
)
MLX_LM = {"oracle": "mlx_lm", "std": 0.3}

FAMILIES = {
    "deepseek_v41": (DEEPSEEK_V41, MLX_LM),
    "deepseek_v41_text": (DEEPSEEK_V41, dict(MLX_LM, model_type="deepseek_v41",
                                             saved_model_type="deepseek_v41_text")),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def _deepseek_names(params):
    """mlx-lm's parameter names back to DeepSeek's checkpoint names (the inverse of
    the renames both loaders apply), per-expert tensors and ``wo_a`` as one matrix."""
    renames = [(".self_attn.", ".attn."), (".mlp.", ".ffn."),
               (".input_layernorm.", ".attn_norm."), (".post_attention_layernorm.", ".ffn_norm."),
               (".attn_hc.", ".hc_attn_"), (".ffn_hc.", ".hc_ffn_"), (".sinks", ".attn_sink"),
               (".q_a_proj.", ".wq_a."), (".q_b_proj.", ".wq_b."), (".kv_proj.", ".wkv."),
               (".gate_proj.", ".wgate."), (".o_a_proj.", ".wo_a."), (".o_b_proj.", ".wo_b."),
               (".q_a_norm.", ".q_norm."), (".compressor.kv_norm.", ".compressor.norm."),
               (".indexer.k_proj.", ".indexer.wk."),
               (".gate.e_score_correction_bias", ".gate.bias"),
               (".shared_experts.gate_proj.", ".shared_experts.w1."),
               (".shared_experts.down_proj.", ".shared_experts.w2."),
               (".shared_experts.up_proj.", ".shared_experts.w3.")]
    out = {}
    for name, w in params.items():
        if name == "lm_head.weight":
            out["head.weight"] = w
            continue
        if name == "model.embed_tokens.weight":
            out["embed.weight"] = w
            continue
        key = name.removeprefix("model.")
        if ".switch_mlp." in key:
            layer = key.split(".")[1]
            proj = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[key.split(".")[-2]]
            for e in range(w.shape[0]):
                out[f"layers.{layer}.ffn.experts.{e}.{proj}.weight"] = w[e]
            continue
        for new, old in reversed(renames):
            key = key.replace(new, old)
        if key.endswith(".wo_a.weight"):
            w = w.reshape(-1, w.shape[-1])
        out[key] = w
    return out


def test_deepseek_checkpoint_names_load_to_mlx_lm_logits(tmp_path):
    """A checkpoint in DeepSeek's own names (``layers.0.attn.wq_a.weight``, one tensor
    per expert, ``wo_a`` as one matrix, MTP and vision weights) renames to the same
    weights as mlx-lm's sanitize and gives mlx-lm's logits."""
    import json

    from mlx.utils import tree_flatten
    from mlx_lm_oracle import mlx_lm_logits

    from mlx_lm_batched.utils import load_model

    ref = build_mlx_lm_model("deepseek_v41", DEEPSEEK_V41)
    params = dict(tree_flatten(ref.parameters()))
    weights = _deepseek_names(params)
    assert "layers.1.attn.compressor.wgate.weight" in weights and "embed.weight" in weights
    weights["mtp.0.head.weight"] = mx.zeros((4, 4))
    weights["layers.0.ffn.gate.bias_vl"] = mx.zeros((4,))
    theirs = ref.sanitize(dict(weights))
    ours = Model(ModelArgs.from_dict(dict(DEEPSEEK_V41))).sanitize(dict(weights))
    assert sorted(ours) == sorted(theirs) == sorted(params)
    assert all(mx.array_equal(ours[k], params[k]) for k in params)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    (tmp_path / "config.json").write_text(json.dumps(dict(DEEPSEEK_V41, model_type="deepseek_v41")))
    model, _ = load_model(tmp_path)
    for p in make_prompts((9,)):
        np.testing.assert_allclose(np.array(model(mx.array([p]))[0]), mlx_lm_logits(ref, p),
                                   atol=1e-4, rtol=1e-4)


def test_multimodal_config_reads_its_text_model_and_packed_weights_are_refused():
    """A ``text_config`` wrapper (both RoPE layouts inside) gives the text model's args;
    engram layers and FP8/FP4 packed weights are refused with one clear line."""
    text = dict(DEEPSEEK_V41, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
    text.pop("rope_theta")
    args = ModelArgs.from_dict({"model_type": "deepseek_v41", "text_config": text,
                                "vision_config": {"hidden_size": 8}})
    assert (args.hidden_size, args.rope_theta, args.hc_mult) == (64, 5000.0, 2)
    with pytest.raises(NotImplementedError, match="engram memory"):
        ModelArgs.from_dict(dict(DEEPSEEK_V41, engram_layer_ids=[1]))
    model = Model(ModelArgs.from_dict(dict(DEEPSEEK_V41)))
    with pytest.raises(NotImplementedError, match=r"packed weights \(\.scale\)"):
        model.sanitize({"embed.weight": mx.zeros((2, 2)), "layers.0.attn.wq_a.scale": mx.ones(2)})


def test_tensor_parallel_is_refused_by_name():
    from mlx_lm_batched.parallel.shard import shard_model

    class RankZeroOfTwo:
        def size(self):
            return 2

        def rank(self):
            return 0

    model = Model(ModelArgs.from_dict(dict(DEEPSEEK_V41)))
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.layers\.0' "
                                         r"\(DecoderLayer\): DeepSeek V4\.1"):
        shard_model(model, RankZeroOfTwo())


def test_second_turn_on_cached_rows_equals_each_row_alone():
    """A second prefill on a batch's caches (rows of different lengths, so each row's
    new tokens start at another column) continues every row as if it ran alone."""
    from mlx.utils import tree_flatten

    model = Model(ModelArgs.from_dict(dict(DEEPSEEK_V41)))
    ref = build_mlx_lm_model("deepseek_v41", DEEPSEEK_V41)
    model.load_weights(tree_flatten(ref.parameters()))
    first, second = make_prompts((5, 9, 2), seed=3), make_prompts((6, 1, 3), seed=4)
    _, batch = _two_turns(model, first, second)
    for i in range(len(first)):
        _, alone = _two_turns(model, first[i:i + 1], second[i:i + 1])
        np.testing.assert_allclose(np.array(batch[i]), np.array(alone[0]), atol=1e-4, rtol=1e-4)


def _two_turns(model, first, second):
    from mlx_lm_batched.engine.batch_engine import BatchEngine
    from mlx_lm_batched.engine.prefill_plan import left_pad

    engine = BatchEngine(model)
    engine.prefill(*left_pad(first))
    return engine.prefill(*left_pad(second))


def test_extracted_row_cache_continues_like_the_row_alone():
    """A row's cache taken out of a padded batch (``BatchEngine.extract_row``) keeps the
    ragged per-row state (window, open group, compressed keys) and its class, so the
    next token's logits equal the prompt run alone."""
    from mlx.utils import tree_flatten

    from mlx_lm_batched.cache.ragged import RaggedStateCache
    from mlx_lm_batched.engine.batch_engine import BatchEngine
    from mlx_lm_batched.engine.prefill_plan import left_pad

    model = Model(ModelArgs.from_dict(dict(DEEPSEEK_V41)))
    model.load_weights(tree_flatten(build_mlx_lm_model("deepseek_v41", DEEPSEEK_V41).parameters()))
    prompts = make_prompts((11, 4), seed=5)
    engine = BatchEngine(model)
    engine.prefill(*left_pad(prompts))
    for row, p in enumerate(prompts):
        cache = engine.extract_row(row)
        assert all(type(c) is RaggedStateCache for c in cache)
        nxt = mx.array([[7]])
        ours = model(nxt, offset=mx.array([len(p)]), cache=cache)[0, -1]
        full = model(mx.array([p + [7]]))[0, -1]
        np.testing.assert_allclose(np.array(ours), np.array(full), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
def test_yarn_scaling_of_compressed_layers_matches_mlx_lm(layout):
    """With YaRN ``rope_scaling`` the compressed layers rotate with YaRN's frequencies
    (attention factor 1), the window-only layer stays unscaled, as in mlx-lm."""
    from mlx.utils import tree_flatten
    from mlx_lm_oracle import mlx_lm_logits, to_rope_parameters

    config = dict(DEEPSEEK_V41, rope_scaling={"type": "yarn", "factor": 4.0, "beta_fast": 32,
                                              "beta_slow": 1,
                                              "original_max_position_embeddings": 16})
    ref = build_mlx_lm_model("deepseek_v41", config)
    saved = to_rope_parameters(config) if layout == "transformers5" else config
    model = Model(ModelArgs.from_dict(dict(saved)))
    model.load_weights(tree_flatten(ref.parameters()))
    for p in make_prompts((12,), seed=6):
        np.testing.assert_allclose(np.array(model(mx.array([p]))[0]), mlx_lm_logits(ref, p),
                                   atol=1e-4, rtol=1e-4)
