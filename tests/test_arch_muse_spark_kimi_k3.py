"""Muse Spark against transformers and Kimi K3 against mlx-lm 0.32 (which
transformers lacks) on tiny random checkpoints, in both config layouts (Muse Spark's
language model; its vision and audio towers are ignored)."""

import pytest
import torch

from arch_harness import VOCAB, run_family

# 4 layers: sliding (RoPE) x3 then global (NoPE); layer 1 dense, the others a
# compressed-width MoE (64 -> 24) over 6 experts.
MUSE_SPARK_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       max_position_embeddings=256, num_hidden_layers=4, sliding_window=8,
                       qk_scale_factor=2.0, output_multiplier=0.5,
                       final_logit_softcapping=10.0, num_local_experts=6,
                       num_experts_per_tok=2, moe_hidden_size=24, moe_intermediate_size=32,
                       routed_scaling_factor=1.5,
                       mlp_layer_types=["sparse", "dense", "sparse", "sparse"])
MUSE_SPARK_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=2, patch_size=2, pos_emb_height=4,
                         pos_emb_width=4)
# The audio tower's output joins the text embeddings: its width is the text model's.
MUSE_SPARK_AUDIO = dict(patch_sizes=(4, 2), hidden_sizes=(8, 16), depths=(1, 1),
                        num_hidden_layers=2, out_hidden_size=64)
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}


def random_gates(model):
    """Random residual gates, router biases and norm gains (the checkpoint's values are
    not zero; random init leaves some of them at 0 or 1)."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("residual_gate.gate", "norm.weight")) and "vision" not in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen) * 0.1)


# Kimi K3: KDA (layers 1, 2, 4; lower-bounded decay, full-rank output gates) and latent
# attention (layer 3; per-feature output gates); attention residuals over blocks of 2
# layers; SiTU with both betas; layer 1 dense, then a latent MoE (64 -> 24, normed) over
# 6 experts in 2 groups with a shared expert.
KIMI_K3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
               num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
               linear_attn_config={"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                                   "kda_layers": [1, 2, 4], "full_attn_layers": [3],
                                   "gate_lower_bound": -5.0, "use_full_rank_gate": True},
               kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
               v_head_dim=12, mla_use_output_gate=True, num_experts=6,
               num_experts_per_token=2, moe_intermediate_size=32, num_shared_experts=1,
               first_k_dense_replace=1, routed_expert_hidden_size=24, latent_moe_use_norm=True,
               num_expert_group=2, topk_group=1, routed_scaling_factor=1.5,
               activation_situ_beta=2.0, activation_situ_linear_beta=3.0, attn_res_block_size=2)

FAMILIES = {
    "kimi_k3": (KIMI_K3, {"oracle": "mlx_lm"}),
    "muse_spark": (dict(text_config=MUSE_SPARK_TEXT, vision_config=MUSE_SPARK_VISION,
                        audio_config=MUSE_SPARK_AUDIO),
                   dict(WINDOWED, hf_hook=random_gates)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_reference_and_batches_exactly(name, layout):
    config, options = FAMILIES[name]
    run_family(name, (config, dict({"new_tokens": 8}, **options)), layout)


def test_muse_spark_shards_heads_gates_and_experts():
    """Two ranks: attention and its output gate split by heads (the per-head output
    norm needs no sum), the experts by hidden units, the compressing projections and
    the router stay whole. (The 2-rank run itself is too slow for this file.)"""
    from mlx_lm_batched.models import muse_spark
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    config = dict(MUSE_SPARK_TEXT, model_type="muse_spark")
    model = muse_spark.Model(muse_spark.ModelArgs.from_dict(config))
    shard_model(model, TwoRanks())
    layer = model.layers[0]
    assert layer.self_attn.q_proj.weight.shape == (2 * 16, 64)
    assert layer.self_attn.gate_proj.weight.shape == (2 * 16, 64)
    assert layer.self_attn.o_proj.weight.shape == (64, 2 * 16)
    experts = layer.mlp.experts
    assert experts.gate_proj.weight.shape == (6, 16, 24)
    assert experts.down_proj.weight.shape == (6, 24, 16)
    assert layer.mlp.pre_expert_proj.weight.shape == (24, 64)
    assert layer.mlp.post_expert_proj.weight.shape == (64, 24)
    assert model.layers[1].mlp.down_proj.weight.shape == (64, 48)  # the dense layer


def test_muse_spark_refuses_unknown_feed_forward_kinds():
    from mlx_lm_batched.models import muse_spark

    with pytest.raises(ValueError, match="unknown mlp_layer_types"):
        muse_spark.ModelArgs.from_dict(dict(MUSE_SPARK_TEXT, model_type="muse_spark",
                                            mlp_layer_types=["sparse", "moe", "dense", "dense"]))


def test_kimi_k3_variants_match_mlx_lm():
    """The other switches on one prompt: low-rank KDA gates with the softplus decay, no
    attention residuals, a plain MoE on the full width, per-feature MLA gates off."""
    import mlx.core as mx
    import numpy as np

    import mlx_lm_oracle
    from arch_harness import make_prompts
    from mlx_lm_batched.models import kimi_k3
    from mlx.utils import tree_flatten

    config = dict(KIMI_K3, linear_attn_config={"num_heads": 4, "head_dim": 16,
                                               "short_conv_kernel_size": 4,
                                               "kda_layers": [1, 3]},
                  attn_res_block_size=None, routed_expert_hidden_size=None,
                  latent_moe_use_norm=False, mla_use_output_gate=False, num_hidden_layers=3,
                  activation_situ_linear_beta=None)
    ref = mlx_lm_oracle.build_mlx_lm_model("kimi_k3", config)
    ours = kimi_k3.Model(kimi_k3.ModelArgs.from_dict(dict(config, model_type="kimi_k3")))
    weights = ours.sanitize(dict(tree_flatten(ref.parameters())))
    ours.load_weights(list(weights.items()))
    prompt = make_prompts((9,))[0]
    np.testing.assert_allclose(np.array(ours(mx.array([prompt]))[0]),
                               mlx_lm_oracle.mlx_lm_logits(ref, prompt), atol=1e-4, rtol=1e-4)


def test_kimi_k3_shards_heads_gates_and_experts():
    """Two ranks: KDA by heads (its full-rank output gate too), latent attention by
    heads (each head's v_head_dim gates), the SiTU experts and shared MLP by hidden
    units; the latent projections, their norm and the router stay whole."""
    from mlx_lm_batched.models import kimi_k3
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    model = kimi_k3.Model(kimi_k3.ModelArgs.from_dict(dict(KIMI_K3, model_type="kimi_k3")))
    shard_model(model, TwoRanks())
    kda, mla = model.layers[0].self_attn, model.layers[2].self_attn
    assert kda.g_proj.weight.shape == (2 * 16, 64) and kda.q_proj.weight.shape == (32, 64)
    assert mla.n_heads == 2 and mla.g_proj.weight.shape == (2 * 12, 64)
    moe = model.layers[1].mlp
    assert moe.switch_mlp.gate_proj.weight.shape == (6, 16, 24)
    assert moe.shared_experts.down_proj.weight.shape == (64, 16)
    assert moe.routed_expert_down_proj.weight.shape == (24, 64)
    assert model.layers[0].mlp.gate_proj.weight.shape == (48, 64)  # the dense layer


def test_kimi_k3_refuses_other_activations_by_name():
    from mlx_lm_batched.models import kimi_k3

    with pytest.raises(ValueError, match="hidden_act 'silu' is not supported"):
        kimi_k3.ModelArgs.from_dict(dict(KIMI_K3, model_type="kimi_k3", hidden_act="silu"))


def test_kimi_k3_loads_moonshot_names():
    """The same weights under Moonshot's checkpoint names (separate q/k/v projections
    and ``(C, 1, K)`` convolutions, ``kv_b_proj``, ``block_sparse_moe`` with per-expert
    ``w1``/``w2``/``w3``, ``*_res.proj_weight``) give mlx-lm's logits."""
    import mlx.core as mx
    import numpy as np

    import mlx_lm_oracle
    from arch_harness import make_prompts
    from mlx_lm_batched.models import kimi_k3
    from mlx.utils import tree_flatten

    ref = mlx_lm_oracle.build_mlx_lm_model("kimi_k3", KIMI_K3)
    params = {k.removeprefix("language_model."): v for k, v in tree_flatten(ref.parameters())}
    hub = {}
    for k, v in params.items():
        if k.endswith(("qkv_proj.weight", "qkv_conv.conv.weight")):
            conv = "conv" in k
            for name, part in zip("qkv", mx.split(v, 3, axis=0)):
                hub[k.replace("qkv_proj", f"{name}_proj") if not conv else
                    k.replace("qkv_conv.conv", f"{name}_conv1d")] = (
                    part.swapaxes(1, 2) if conv else part)
        elif k.endswith("embed_q.weight") and "unembed" not in k:
            wv = params[k.replace("embed_q", "unembed_out")]
            hub[k.replace("embed_q", "kv_b_proj")] = mx.concatenate(
                [v.swapaxes(-1, -2), wv], axis=1).reshape(-1, v.shape[1])
        elif "unembed_out" in k:
            continue
        elif ".switch_mlp." in k:
            prefix, proj = k.split(".mlp.switch_mlp.")
            w = {"gate_proj": "w1", "down_proj": "w2", "up_proj": "w3"}[proj.split(".")[0]]
            for e in range(v.shape[0]):
                hub[f"{prefix}.block_sparse_moe.experts.{e}.{w}.weight"] = v[e]
        elif "_res_" in k:
            src, param = k.rsplit("_", 1)[0], k.rsplit("_", 1)[1]  # "..._res", "proj.weight"
            hub[f"{src}.{param.split('.')[0]}_weight"] = v.reshape(-1)
        else:
            hub[k.replace(".mlp.", ".block_sparse_moe.") if ".mlp." in k and "layers.0." not in k
                else k] = v
    ours = kimi_k3.Model(kimi_k3.ModelArgs.from_dict(dict(KIMI_K3, model_type="kimi_k3")))
    ours.load_weights(list(ours.sanitize(hub).items()))
    prompt = make_prompts((9,))[0]
    np.testing.assert_allclose(np.array(ours(mx.array([prompt]))[0]),
                               mlx_lm_oracle.mlx_lm_logits(ref, prompt), atol=1e-4, rtol=1e-4)
