"""Recurrent and hybrid families (RWKV-7, Bailing linear and hybrid, PLaMo 2, OLMo
hybrid, a Hadamard-packed Qwen 3.5), with mlx-lm 0.32 as the oracle where transformers
5.24 has no model: mlx-lm's module builds a tiny random model and saves it in its
layout, our ``load`` reads it, and the harness's four checks (padded-batch logits,
greedy rows equal solo, incremental decode, rows joining a running ``BatchGenerator``)
run against mlx-lm on each prompt alone, in both config layouts."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, layout_cases, run_family
from test_arch_mlxlm_oracle import positive_expert_bias

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_theta=10000.0, rms_norm_eps=1e-6)
MLX_LM = {"oracle": "mlx_lm"}

# Ling-linear: layers 0 and 1 linear (lightning) attention, layer 2 softmax; a sigmoid
# router with an expert bias over 2 groups, QK-norm, half the head rotated, the output
# norm in 2 groups, layer 0 dense.
BAILING_LINEAR = dict(BASE, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                      num_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
                      score_function="sigmoid", moe_router_enable_expert_bias=True, n_group=2,
                      topk_group=1, routed_scaling_factor=2.0, use_qk_norm=True,
                      partial_rotary_factor=0.5, layer_group_size=3, group_norm_size=2)

# Ling 2.5: layers 0 and 1 lightning attention (heads of 16), layer 2 multi-head latent
# attention with a low-rank query; shared experts sized as a whole.
BAILING_HYBRID = dict(BAILING_LINEAR, head_dim=16, kv_lora_rank=32, qk_rope_head_dim=8,
                      qk_nope_head_dim=16, v_head_dim=16, q_lora_rank=24,
                      moe_shared_expert_intermediate_size=48, num_shared_experts=2)

# Ling V3: layers 0 and 1 Kimi delta attention (heads of 16), layer 2 gated MLA.
BAILING_V3 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                  num_attention_heads=4, head_dim=16, max_position_embeddings=256,
                  rope_theta=10000.0, rms_norm_eps=1e-6, moe_intermediate_size=32,
                  moe_shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                  num_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
                  routed_scaling_factor=2.0, layer_group_size=3, q_lora_rank=24,
                  kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                  short_conv_kernel_size=4, kda_lower_bound=-5.0)

# PLaMo 2: SSM, attention, SSM (mamba_step 2); 4 SSM heads of 16 share one B/C group.
# mlx-lm attends over every slot: the window (layers outside full_attention_idx) is wider
# than the prompts here.
PLAMO2 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, hidden_size_per_head=16,
              max_position_embeddings=256, attention_window_size=64, full_attention_idx=[],
              mamba_d_state=16, mamba_d_conv=4, mamba_num_heads=4, mamba_step=2,
              rms_norm_eps=1e-6, tie_word_embeddings=True)

# A PrismML Hadamard pack of a tiny Qwen3.5 (linear attention, full attention; width 512,
# the smallest Hadamard block): the tied embedding (block 512), layer 0's MLP gate (block
# 512) and up projection (block 0, no rotation) and layer 1's query projection (block
# 512) are packed, in 2-bit groups of 128; the rest stays float.
PRISM_MODULES = [dict(path="model.embed_tokens", embedding=True, dtype="float16", block=512),
                 dict(path="model.layers.0.mlp.gate_proj", embedding=False, dtype="float16",
                      block=512),
                 dict(path="model.layers.0.mlp.up_proj", embedding=False, dtype="float16",
                      block=0),
                 dict(path="model.layers.1.self_attn.q_proj", embedding=False, dtype="float16",
                      block=512)]
PRISM = dict(text_config=dict(vocab_size=VOCAB, hidden_size=512, intermediate_size=256,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                              head_dim=32, linear_num_value_heads=4, linear_num_key_heads=2,
                              linear_key_head_dim=16, linear_value_head_dim=16,
                              full_attention_interval=2, tie_word_embeddings=True,
                              max_position_embeddings=256,
                              rope_parameters={"type": "default", "rope_theta": 10000.0,
                                               "partial_rotary_factor": 0.25}),
             schema_version=1, tensor_namespace="mlx-lm-text", gdn_activation_layout="grouped",
             quantization={"bits": 2, "group_size": 128, "mode": "affine"},
             modules=PRISM_MODULES)


def pack_hadamard_modules(model, seed=3):
    """Give mlx-lm's packed modules real packs: random float weights rotated by random
    signs and quantized to 2 bits (the random init gave them float noise)."""
    import mlx_lm.models.prism_hadamard_qwen35 as prism

    modules = dict(model.language_model.named_modules())
    keys = iter(mx.random.split(mx.random.key(seed), 2 * len(PRISM_MODULES)))
    for record in PRISM_MODULES:
        m = modules[record["path"]]
        rows, cols = m.scales.shape[0], m.scales.shape[1] * 128
        w = mx.random.normal((rows, cols), key=next(keys)) * 0.3
        signs_key = next(keys)
        if record["block"]:
            m.signs = mx.where(mx.random.bernoulli(0.5, (cols,), key=signs_key), 1.0, -1.0)
            w = prism.hadamard_rotate(w, record["block"], m.signs)
        m.weight, scales, biases = mx.quantize(w, group_size=128, bits=2)
        m.scales, m.biases = scales.astype(mx.float16), biases.astype(mx.float16)


# RWKV-7: 4 heads of 16; ``norm_eps`` 4e-5 makes the group norm's ``head_dim *
# norm_eps`` mlx-lm's fixed 64e-5. Layers past 0 mix in layer 0's values.
RWKV7 = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
             head_dim=16, a_low_rank_dim=8, v_low_rank_dim=8, gate_low_rank_dim=16,
             decay_low_rank_dim=8, norm_eps=4e-5)

# OLMo hybrid (transformers is the reference): linear, full, linear; 2 key heads serve 4
# value heads; beta in [0, 2]. With RoPE, and without (the released checkpoints: no
# ``rope_theta``; transformers skips RoPE then), beta in [0, 1].
OLMO_HYBRID = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                   rms_norm_eps=1e-6, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                   layer_types=["linear_attention", "full_attention",
                                                   "linear_attention"],
                   linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
                   linear_value_head_dim=16, linear_conv_kernel_dim=4,
                   rope_parameters={"rope_type": "default", "rope_theta": 10000.0})

FAMILIES = {
    "prism_hadamard_qwen35": (PRISM, dict(MLX_LM, hf_hook=pack_hadamard_modules)),
    "plamo2": (PLAMO2, MLX_LM),
    # Raw (partly negative) router biases: dropped groups score -inf, as in V3's code.
    "bailing_moe_v3": (BAILING_V3, MLX_LM),
    # A bailing_hybrid config naming the V3 architecture loads as V3 (mlx-lm's remapping);
    # one expert per token, its weight renormalised to 1 as V3 does.
    "bailing_hybrid_v3": (dict(BAILING_V3, architectures=["BailingMoeV3ForCausalLM"],
                               num_experts_per_tok=1),
                          dict(MLX_LM, hf_hook=positive_expert_bias, model_type="bailing_moe_v3",
                               saved_model_type="bailing_hybrid")),
    "olmo_hybrid": (OLMO_HYBRID, {}),
    "olmo_hybrid_nope": (dict(OLMO_HYBRID, rope_parameters={"rope_type": "default",
                                                             "rope_theta": None},
                              linear_allow_neg_eigval=False), {"model_type": "olmo_hybrid"}),
    "bailing_hybrid": (BAILING_HYBRID, dict(MLX_LM, hf_hook=positive_expert_bias)),
    "rwkv7": (RWKV7, MLX_LM),
    "bailing_moe_linear": (BAILING_LINEAR, dict(MLX_LM, hf_hook=positive_expert_bias)),
}


# Configs without top-level RoPE keys (RWKV-7, PLaMo 2's fixed theta, the pack's nested
# text config) are the same file in both layouts, and the remapped V3 entry checks the
# architecture lookup only: one layout each (CI time).
CASES = layout_cases(FAMILIES, one_layout={"rwkv7", "plamo2", "prism_hadamard_qwen35",
                                           "bailing_hybrid_v3"})


@pytest.mark.parametrize("name,layout", CASES)
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


@pytest.mark.parametrize("groups", [2, 1])
def test_bailing_linear_shards_heads_decays_and_norm_groups(groups):
    """Rank 0 of 2 keeps 2 of the 4 linear-attention heads with their decays, the gate's
    matching rows and its norm groups: whole groups (2 groups), or its part of the one
    group with the sum of squares all-reduced. (Two real ranks matched one process when
    run, in 80 s: too slow for CI.)"""
    from mlx_lm_batched.models import bailing_moe_linear
    from mlx_lm_batched.parallel.recurrent import ShardedGatedRMSNorm
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    args = bailing_moe_linear.ModelArgs.from_dict(
        dict(BAILING_LINEAR, group_norm_size=groups, model_type="bailing_moe_linear"))
    model = bailing_moe_linear.Model(args)
    slopes = model.layers[0].self_attn._slope
    shard_model(model, TwoRanks())
    attn = model.layers[0].self_attn
    assert attn.n_heads == attn.n_kv_heads == 2
    assert attn.qkv_proj.weight.shape == (3 * 2 * 16, 64)
    assert attn.g_proj.weight.shape == (32, 64)
    assert mx.array_equal(attn._slope, slopes[:2])
    assert attn.g_norm.weight.shape == (32,)
    assert isinstance(attn.g_norm, ShardedGatedRMSNorm) == (groups == 1)
    assert attn.g_norm.groups == 1
    assert model.layers[2].self_attn.n_heads == 2  # softmax attention: the shared split


def _load_family(name, tmp_path):
    """Our model loaded from the family's checkpoint (mlx-lm's or transformers', random
    weights)."""
    from mlx_lm_batched.utils import load_model
    from mlx_lm_oracle import build_mlx_lm_model, save_mlx_lm_model

    config, options = FAMILIES[name]
    model_type = options.get("model_type", name)
    if options.get("oracle") != "mlx_lm":  # a transformers entry: its checkpoint
        from arch_harness import build_hf_model, save_hf_model

        save_hf_model(build_hf_model(model_type, config), tmp_path, "transformers5")
        return load_model(tmp_path)[0]
    ref = build_mlx_lm_model(model_type, config)
    if options.get("hf_hook"):
        options["hf_hook"](ref)
    save_mlx_lm_model(ref, dict(config, model_type=model_type), tmp_path, "transformers4")
    return load_model(tmp_path)[0]


@pytest.mark.parametrize("name", ["rwkv7", "bailing_moe_linear", "bailing_hybrid",
                                  "bailing_moe_v3", "olmo_hybrid"])
def test_grouped_prefill_rows_equal_solo(name, tmp_path):
    """Rows of mixed lengths prefill in groups (``StateRowsView``: fewer columns than
    one group padded to the longest), and each row's first token, logprobs and state
    equal that prompt alone."""
    import numpy as np

    from arch_harness import make_prompts
    from mlx_lm_batched.engine.prefill_plan import plan_prefill_groups
    from test_arch_recurrent import _states
    from test_hybrid_prefill import CountingModel, _prefill

    model = _load_family(name, tmp_path)
    lengths = (1, 2, 3, 9, 12, 20, 23)
    prompts = make_prompts(lengths, seed=11)
    counting = CountingModel(model)
    engine, y, logprobs = _prefill(counting, prompts, prefill_step_size=8)
    cols = [n - 1 for n in lengths]
    assert len(plan_prefill_groups(cols)) > 1
    computed = sum(r * c for r, c in counting.calls[:-1])
    assert computed < len(lengths) * max(cols)
    states = _states(engine)
    for i, p in enumerate(prompts):
        solo, solo_y, solo_lp = _prefill(model, [p])
        assert int(y[i]) == int(solo_y[0]), f"{name} row {i}"
        np.testing.assert_allclose(np.array(logprobs[i]), np.array(solo_lp[0]), atol=1e-4,
                                   err_msg=f"{name} row {i}")
        for ours, theirs in zip(states, _states(solo)):
            for a, b in zip(ours, theirs):
                np.testing.assert_allclose(a[i], b[0], atol=1e-4, rtol=1e-3,
                                           err_msg=f"{name} row {i}")


def test_rwkv7_tensor_parallel_is_refused_by_name():
    """No sharder splits RWKV-7's time mixing: sharding names the layer instead of
    splitting it wrongly."""
    from mlx_lm_batched.models import rwkv7
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    model = rwkv7.Model(rwkv7.ModelArgs.from_dict(dict(RWKV7, model_type="rwkv7")))
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.layers\.0\.attn\.r_proj' "
                                         r"of TimeMixing"):
        shard_model(model, TwoRanks())


def test_olmo_hybrid_without_rope_theta_has_no_rope():
    """A config without any RoPE setting (the released checkpoints) builds position-free
    full-attention layers, as transformers does; one with ``rope_theta`` rotates."""
    from mlx_lm_batched.models import olmo_hybrid

    config = {k: v for k, v in OLMO_HYBRID.items() if k != "rope_parameters"}
    nope = olmo_hybrid.Model(olmo_hybrid.ModelArgs.from_dict(dict(config, model_type="olmo_hybrid")))
    assert nope.layers[1].self_attn.rope is None
    rope = olmo_hybrid.Model(olmo_hybrid.ModelArgs.from_dict(
        dict(config, rope_theta=10000.0, model_type="olmo_hybrid")))
    assert rope.layers[1].self_attn.rope is not None


def test_olmo_hybrid_mlx_lm_layout_loads(tmp_path):
    """mlx-lm's layout (three ``(C, K, 1)`` convolutions, its flat config) loads to
    mlx-lm's logits."""
    from arch_harness import make_prompts
    from mlx_lm_batched.utils import load_model
    from mlx_lm_oracle import build_mlx_lm_model, save_mlx_lm_model
    from test_arch_mlxlm_oracle import _logits_close

    config = {k: v for k, v in OLMO_HYBRID.items() if k != "rope_parameters"}
    config.update(rope_theta=10000.0, linear_allow_neg_eigval=True, tie_word_embeddings=False,
                  attention_bias=False)
    ref = build_mlx_lm_model("olmo_hybrid", config)
    assert ref.layers[0].linear_attn.q_conv1d.weight.shape == (32, 4, 1)
    save_mlx_lm_model(ref, dict(config, model_type="olmo_hybrid"), tmp_path, "transformers4")
    model, _ = load_model(tmp_path)
    _logits_close(model, ref, make_prompts((5, 9)))


def test_bailing_v3_shards_gated_mla_and_refuses_delta_attention_by_name():
    """Rank 0 of 2 keeps half of the MLA heads with their output gates; the delta
    attention has no sharder and is named."""
    from mlx_lm_batched.models import bailing_moe_v3
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    def build(**changes):
        args = dict(BAILING_V3, model_type="bailing_moe_v3", **changes)
        return bailing_moe_v3.Model(bailing_moe_v3.ModelArgs.from_dict(args))

    model = shard_model(build(layer_group_size=1), TwoRanks())  # every layer MLA
    attn = model.layers[0].self_attn
    assert attn.n_heads == 2 and attn.g_proj.weight.shape == (2, 64)
    assert attn.q_b_proj.weight.shape == (2 * 24, 24)
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.layers\.0\.self_attn\."
                                         r"q_proj' of DeltaAttention"):
        shard_model(build(), TwoRanks())


def test_plamo2_shards_attention_norm_rows_and_refuses_its_ssm_by_name():
    """Rank 0 of 2 keeps 2 of 4 query heads and 1 of 2 KV heads with their QK-norm rows;
    PLaMo's SSM mixer has no sharder and is named."""
    from mlx_lm_batched.models import plamo2
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    def build(**changes):
        return plamo2.Model(plamo2.ModelArgs.from_dict(dict(PLAMO2, model_type="plamo2",
                                                            **changes)))

    model = build(mamba_enabled=False)  # attention only
    q_weight = model.layers[0].mixer.q_weight
    shard_model(model, TwoRanks())
    attn = model.layers[0].mixer
    assert (attn.n_heads, attn.n_kv_heads) == (2, 1)
    assert mx.array_equal(attn.q_weight, q_weight[:2]) and attn.k_weight.shape == (1, 16)
    with pytest.raises(ValueError, match=r"cannot shard layer 'model\.layers\.0\.mixer\.in_proj' "
                                         r"of Mamba"):
        shard_model(build(), TwoRanks())


def test_prism_pack_uses_hadamard_layers_and_refuses_sharding(tmp_path):
    """The listed modules load as Hadamard-packed 2-bit layers (the others stay float);
    tensor parallelism refuses the pack by name; a manifest naming an unknown module,
    or a pack quantized otherwise, is refused with one line."""
    from mlx_lm_batched.layers.hadamard import HadamardQuantizedEmbedding, HadamardQuantizedLinear
    from mlx_lm_batched.models import prism_hadamard_qwen35 as prism
    from mlx_lm_batched.parallel.shard import shard_model
    from distributed_harness import TwoRanks

    model = _load_family("prism_hadamard_qwen35", tmp_path)
    assert isinstance(model.model.embed_tokens, HadamardQuantizedEmbedding)
    assert isinstance(model.layers[0].mlp.gate_proj, HadamardQuantizedLinear)
    assert type(model.layers[1].self_attn.k_proj).__name__ == "Linear"
    with pytest.raises(ValueError, match="cannot shard 'prism_hadamard_qwen35': Hadamard"):
        shard_model(model, TwoRanks())
    args = lambda **c: prism.ModelArgs.from_dict(dict(PRISM, model_type="prism_hadamard_qwen35",
                                                      **c))
    bad = [dict(PRISM_MODULES[0], path="model.layers.0.mlp.nothing")]
    with pytest.raises(ValueError, match="packed module model.layers.0.mlp.nothing is not"):
        prism.Model(args(modules=bad))
    with pytest.raises(ValueError, match="2-bit affine weights in groups of 128"):
        args(quantization={"bits": 4, "group_size": 64})
