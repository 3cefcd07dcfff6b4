"""Mixture-of-experts families with latent or sparse attention: each family
against its reference on a tiny random checkpoint, in both config layouts —
transformers where it has the model, else mlx-lm 0.32 on the same weights."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, run_family
from test_arch_gemma4 import TEXT as GEMMA4_TEXT
from test_arch_gemma4 import WINDOWED as GEMMA4_WINDOWED
from test_arch_gemma4 import random_layer_scalars
from test_arch_deepseek import sharpen

MLX_LM = {"oracle": "mlx_lm"}
SMALL = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=256)
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}

# K-EXAONE: sliding (RoPE), sliding, global (no RoPE); layer 0 dense, then a grouped
# sigmoid router with a shared expert.
EXAONE_MOE = dict(SMALL, num_hidden_layers=3, sliding_window=8, sliding_window_pattern=3,
                  moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  num_shared_experts=1, n_group=2, topk_group=1, first_k_dense_replace=1)
# Gemma 4's encoder-free multimodal checkpoint: its patch embedder is ignored; its
# text model has no per-layer inputs (the config omits them: our default follows).
GEMMA4_UNIFIED_TEXT = {k: v for k, v in GEMMA4_TEXT.items()
                       if k not in ("hidden_size_per_layer_input", "vocab_size_per_layer_input")}
GEMMA4_UNIFIED_VISION = dict(patch_size=2, pooling_kernel_size=2, mm_embed_dim=16,
                             mm_posemb_size=8, output_proj_dims=16)

# Mistral 4: DeepSeek V3's latent attention with yarn RoPE and Llama 4's query
# temperature (steps every 4 positions here); a softmax router over 2 groups.
MLA = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
           kv_lora_rank=16, q_lora_rank=24, qk_nope_head_dim=16, qk_rope_head_dim=8,
           v_head_dim=12, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
           n_shared_experts=1, first_k_dense_replace=1)
MISTRAL4 = dict(MLA, n_group=2, topk_group=1, routed_scaling_factor=1.5,
                rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 4, "beta_fast": 32,
                                 "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0,
                                 "llama_4_scaling_beta": 0.5})

# AFMoE: sliding (RoPE), sliding, global (no RoPE); gated attention; layer 0 dense;
# muP embedding scale.
AFMOE = dict(SMALL, num_hidden_layers=3, sliding_window=8, global_attn_every_n_layers=3,
             num_dense_layers=1, moe_intermediate_size=32, num_experts=8,
             num_experts_per_tok=3, num_shared_experts=1, route_scale=1.7, mup_enabled=True)

# Laguna: sliding, full, sliding layers with 4, 2, 4 query heads; each layer type its
# own theta (the same partial rotation: the flat transformers-4 keys hold one);
# per-head softplus gates; soft-capped router; layer 0 dense.
LAGUNA = dict(SMALL, num_hidden_layers=3, sliding_window=8,
              layer_types=["sliding_attention", "full_attention", "sliding_attention"],
              num_attention_heads_per_layer=[4, 2, 4], mlp_layer_types=["dense", "sparse", "sparse"],
              moe_intermediate_size=32, shared_expert_intermediate_size=24, num_experts=8,
              num_experts_per_tok=2, moe_routed_scaling_factor=1.5,
              moe_router_logit_softcapping=3.0,
              rope_parameters={
                  "full_attention": {"rope_type": "default", "rope_theta": 500000.0,
                                     "partial_rotary_factor": 0.5},
                  "sliding_attention": {"rope_type": "default", "rope_theta": 100.0,
                                        "partial_rotary_factor": 0.5}})

# MiMo-V2-Flash: full, sliding, sliding (twice the KV heads, attention sinks); value
# heads narrower than query/key heads and scaled; a third of each head rotated with
# per-type thetas; grouped sigmoid router without shared experts.
MIMO_V2_FLASH = dict(SMALL, num_hidden_layers=3, head_dim=24, v_head_dim=16, sliding_window=8,
                     layer_types=["full_attention", "sliding_attention", "sliding_attention"],
                     mlp_layer_types=["dense", "sparse", "sparse"], moe_intermediate_size=32,
                     n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
                     routed_scaling_factor=1.5, attention_value_scale=0.6,
                     rope_parameters={
                         "full_attention": {"rope_type": "default", "rope_theta": 5e6,
                                            "partial_rotary_factor": 0.334},
                         "sliding_attention": {"rope_type": "default", "rope_theta": 100.0,
                                               "partial_rotary_factor": 0.334}})

# DeepSeek V3.2: sparse attention keeping each query's 4 best keys (prompts up to 20
# tokens: most queries attend a strict subset), 8 indexer heads of 16 features.
DSA = dict(MLA, n_group=2, topk_group=1, routed_scaling_factor=2.5, index_topk=4,
           index_n_heads=8, index_head_dim=16)

# LongCat-Flash: two layers of two MLA sublayers each, the shortcut MoE choosing among
# 4 routed and 2 identity experts.
LONGCAT = dict(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_attention_heads=4,
               max_position_embeddings=256, ffn_hidden_size=96, q_lora_rank=24,
               kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, head_dim=8,
               v_head_dim=12, moe_topk=2, n_routed_experts=4, zero_expert_num=2,
               expert_ffn_hidden_size=32, routed_scaling_factor=1.5)

# Muse Glimmer's language model: sliding, global (NoPE), sliding, global (NoPE).
MUSE_GLIMMER_TEXT = dict(SMALL, num_hidden_layers=4, sliding_window=8, qk_scale_factor=2.0,
                         output_multiplier=0.5, final_logit_softcapping=10.0)
MUSE_GLIMMER_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                           num_attention_heads=2, patch_size=2, pos_emb_height=4,
                           pos_emb_width=4)

# LongCat-Flash with n-gram embeddings (mlx-lm the reference): 2- and 3-grams, two
# hash tables each.
LONGCAT_NGRAM = dict(LONGCAT, rms_norm_eps=1e-5, rope_theta=10000.0, mla_scale_q_lora=True,
                     mla_scale_kv_lora=True, ngram_vocab_size_ratio=4, emb_neighbor_num=3,
                     emb_split_num=2)

# Spark 2.5 (mlx-lm the reference; its configs exist only with per-type RoPE):
# sliding, sliding, full; biased projections and head-wise gates.
SPARK2_5 = dict(SMALL, num_hidden_layers=3, sliding_window=8, attention_bias=True,
                layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                rope_parameters={"sliding_attention": {"rope_theta": 100.0},
                                 "full_attention": {"rope_theta": 10000.0,
                                                    "partial_rotary_factor": 0.5}})

# Step 3.5 (mlx-lm the reference): sliding layers with their own head counts, a theta
# and partial rotation per layer, clamped SwiGLU on layer 2's experts and shared
# expert, layers 1-2 MoE.
STEP3P5 = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3, num_attention_heads=4,
               num_attention_groups=2, head_dim=16, intermediate_size=96,
               max_position_embeddings=256, sliding_window=8, rope_theta=[100.0, 1e4, 500.0],
               partial_rotary_factors=[0.5, 1.0, 0.5],
               attention_other_setting={"num_attention_heads": 2, "num_attention_groups": 1},
               moe_num_experts=8, moe_top_k=2, moe_intermediate_size=32, share_expert_dim=24,
               moe_router_scaling_factor=2.0, swiglu_limits=[0, 0, 0.5],
               swiglu_limits_shared=[0, 0, 0.7])

# AFM 7 (mlx-lm the reference): three regular layers, the last two layers reusing the
# third's keys and values; 8-bit key/value rounding at a coarse learned scale.
AFM7 = dict(vocab_size=VOCAB, hidden_dim=64, num_layers=5, num_kv_reuse_layers=2,
            num_heads=4, num_kv_heads=2, hidden_dim_scale_factor=1.5, rope_theta=10000.0)


def coarse_kv_scales(model):
    """Scales large enough that the 8-bit rounding changes keys and values visibly."""
    for layer in model.model.layers:
        layer.self_attn.quant_key_scale = mx.array(0.05)
        layer.self_attn.quant_value_scale = mx.array(0.05)


def random_router_bias(model):
    """transformers keeps ``e_score_correction_bias`` as a zero buffer: give it values
    that change which experts are chosen."""
    import torch

    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, buf in list(model.named_buffers()) + list(model.named_parameters()):
            if name.endswith(("e_score_correction_bias", "expert_bias")):
                buf.copy_(torch.rand(buf.shape, generator=gen) * 0.2)


FAMILIES = {
    "afmoe": (AFMOE, dict(WINDOWED, hf_hook=random_router_bias)),
    "deepseek_v32": (DSA, dict(WINDOWED, hf_hook=sharpen)),
    "glm_moe_dsa": (dict(DSA, v_head_dim=16), dict(WINDOWED, hf_hook=sharpen)),
    "exaone_moe": (EXAONE_MOE, dict(WINDOWED, hf_hook=random_router_bias)),
    "laguna": (LAGUNA, dict(WINDOWED, hf_hook=random_router_bias)),
    "laguna_per_element_gates": (dict(LAGUNA, gating="per-element"),
                                 dict(WINDOWED, model_type="laguna", hf_hook=random_router_bias)),
    "mimo_v2_flash": (MIMO_V2_FLASH, dict(WINDOWED, hf_hook=random_router_bias)),
    "longcat_flash": (LONGCAT, dict(hf_hook=random_router_bias)),
    "muse_glimmer": (dict(text_config=MUSE_GLIMMER_TEXT, vision_config=MUSE_GLIMMER_VISION),
                     WINDOWED),
    "longcat_flash_ngram": (LONGCAT_NGRAM, MLX_LM),
    "spark2_5": (SPARK2_5, dict(WINDOWED, **MLX_LM)),
    "step3p5": (STEP3P5, dict(WINDOWED, **MLX_LM)),
    "afm7": (AFM7, dict(MLX_LM, hf_hook=coarse_kv_scales)),
    "mistral4": (MISTRAL4, {"hf_hook": sharpen}),
    "gemma4_unified": (dict(text_config=GEMMA4_UNIFIED_TEXT, vision_config=GEMMA4_UNIFIED_VISION,
                            image_token_id=5, video_token_id=6, audio_token_id=7),
                       dict(GEMMA4_WINDOWED, hf_hook=random_layer_scalars)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_reference_and_batches_exactly(name, layout):
    config, options = FAMILIES[name]
    # 8 new tokens keep this file's 30 checks fast; each row still decodes past its prompt.
    run_family(name, (config, dict({"new_tokens": 8}, **options)), layout)


def test_new_attention_kinds_shard_their_gates_and_value_heads():
    """Rank 0 of 2: Laguna's per-head gate keeps its heads' rows, AFMoE's per-feature
    gate its heads' features, MiMo-V2-Flash's narrower value heads their own width;
    DeepSeek sparse attention half of the latent attention's heads and the whole
    indexer (its keys ride in each rank's cache as the extra head). (Run on 2 real
    ranks, the sparse model's logits, greedy tokens and joining rows equal one
    process, as ``distributed_harness.assert_tensor_parallel_exact`` checks; too slow
    for this file.)"""
    from mlx_lm_batched.models import afmoe, deepseek_v32, laguna, mimo_v2_flash
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    def sharded(module, config):
        model = module.Model(module.ModelArgs.from_dict(dict(config, model_type=module.__name__
                                                              .rsplit(".", 1)[1])))
        return shard_model(model, TwoRanks())

    attn = sharded(laguna, LAGUNA).layers[0].self_attn
    assert attn.g_proj.weight.shape == (2, 64) and attn.q_proj.weight.shape == (32, 64)
    attn = sharded(afmoe, AFMOE).layers[0].self_attn
    assert attn.gate_proj.weight.shape == (32, 64)
    attn = sharded(mimo_v2_flash, MIMO_V2_FLASH).layers[1].self_attn
    assert attn.v_proj.weight.shape == (2 * 16, 64)  # 2 of 4 sliding KV heads, 16 wide
    assert attn.o_proj.weight.shape == (64, 2 * 16)  # 2 of 4 query heads' values
    attn = sharded(deepseek_v32, DSA).layers[0].self_attn
    assert attn.n_heads == 2 and attn.kv_b_proj.weight.shape == (2 * (16 + 12), 16)
    assert attn.indexer.wq_b.weight.shape == (8 * 16, 24)  # replicated


def test_ngram_embeddings_refuse_tensor_parallelism_by_name():
    from mlx_lm_batched.models import longcat_flash_ngram
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    model = longcat_flash_ngram.Model(longcat_flash_ngram.ModelArgs.from_dict(
        dict(LONGCAT_NGRAM, model_type="longcat_flash_ngram")))
    with pytest.raises(ValueError, match="cannot shard layer 'model.ngram_embeddings"):
        shard_model(model, TwoRanks())


def test_glm5_shared_indexer_layers_are_refused_by_name(tmp_path):
    from mlx_lm_batched.models import glm_moe_dsa

    with pytest.raises(NotImplementedError, match="indexer_types"):
        glm_moe_dsa.ModelArgs.from_dict(dict(DSA, model_type="glm_moe_dsa",
                                             indexer_types=["full", "shared", "full"]))
