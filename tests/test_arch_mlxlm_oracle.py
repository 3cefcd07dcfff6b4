"""Families transformers 5.24 has no model for (Bailing MoE, Hunyuan), with mlx-lm
0.32 as the oracle: mlx-lm's module builds a tiny random model, saves it in mlx-lm's
layout (its names, flat config), our ``load`` reads it, and the harness's four checks
run against mlx-lm on each prompt alone. Extra tests cover what the harness's random
weights cannot (checkpoint layouts, ``norm_head``) and where mlx-lm itself departs
from the reference code."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
            rope_theta=10000.0, rms_norm_eps=1e-6)
MLX_LM = {"oracle": "mlx_lm"}

# Ling 2.0: sigmoid router with an expert bias, 4 groups of 2 experts (best 2 kept),
# per-head QK-norm, half the head rotated, layer 0 dense, shared experts.
LING2 = dict(BASE, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=3,
             num_shared_experts=1, first_k_dense_replace=1, norm_topk_prob=True,
             score_function="sigmoid", moe_router_enable_expert_bias=True, n_group=4,
             topk_group=2, routed_scaling_factor=2.5, use_qk_norm=True,
             partial_rotary_factor=0.5, tie_word_embeddings=False)
# Ling 1.x: softmax router, no groups, biased qkv, tied embeddings, all layers MoE.
LING1 = dict(BASE, num_hidden_layers=2, moe_intermediate_size=32, num_experts=4,
             num_experts_per_tok=2, num_shared_experts=2, first_k_dense_replace=0,
             norm_topk_prob=False, use_qkv_bias=True, tie_word_embeddings=True)

# Hunyuan-A13B's layout with cross-layer attention (layer 1 uses layer 0's keys and
# values), per-layer top-k, expert widths and shared-MLP widths. mlx-lm does not
# renormalise the top-k weights (Hunyuan's reference code and transformers do):
# ``norm_topk_prob=False`` asks us for mlx-lm's routing here.
NTK_ALPHA = {"alpha": 50.0, "factor": 1.0, "type": "dynamic"}
HUNYUAN = dict(BASE, rms_norm_eps=1e-5, num_experts=4, moe_topk=[2, 1, 3],
               moe_intermediate_size=[32, 48, 32], num_shared_expert=[1, 2, 1],
               use_mixed_mlp_moe=True, use_cla=True, cla_share_factor=2, use_qk_norm=True,
               attention_bias=False, norm_topk_prob=False, rope_scaling=NTK_ALPHA,
               tie_word_embeddings=True)
# One expert: a dense MLP; attention biases, no QK-norm, no CLA.
HUNYUAN_DENSE = dict(HUNYUAN, num_hidden_layers=2, num_experts=1, moe_topk=1,
                     moe_intermediate_size=None, num_shared_expert=1, use_mixed_mlp_moe=False,
                     use_cla=False, use_qk_norm=False, attention_bias=True)
# transformers' HunYuanMoEV1 (the reference routing: renormalised top-k) saved as a
# "hunyuan" checkpoint: our defaults fill in what its config lacks.
HUNYUAN_HF = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  head_dim=16, num_experts=4, moe_topk=[2, 3], tie_word_embeddings=True,
                  rope_parameters={"rope_type": "dynamic", "alpha": 50.0, "factor": 1.0,
                                   "rope_theta": 10000.0})
# Baichuan-M1: width-2 key/value convolution, layer 1 windowed (4 slots) with its own
# head counts, a normalised LM head.
BAICHUAN_M1 = dict(BASE, sliding_window=4, sliding_window_layers=[1], conv_window=2,
                   num_swa_attention_heads=2, num_swa_key_value_heads=1)


def normalised_head(model):
    """mlx-lm normalises Baichuan-M1's head rows when it loads a checkpoint
    (``sanitize``), so the checkpoints it runs hold unit rows: save those."""
    model.update({"lm_head": {"weight": model.sanitize(
        {"lm_head.weight": model.lm_head.weight})["lm_head.weight"]}})


def positive_expert_bias(model):
    """Keep the router's biased scores above zero, as trained biases do. Dropped
    groups' experts score 0 (Ling's reference code and mlx-lm): a kept expert whose
    biased score is negative would rank below them, and which of those tied zeros is
    picked is an arbitrary tie-break that mlx-lm and we break differently."""
    for layer in model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and "expert_bias" in gate:
            gate.expert_bias = mx.abs(gate.expert_bias)


FAMILIES = {
    "baichuan_m1": (BAICHUAN_M1, dict(MLX_LM, hf_hook=normalised_head)),
    "bailing_moe": (LING2, dict(MLX_LM, hf_hook=positive_expert_bias)),
    "bailing_moe_v1": (LING1, dict(MLX_LM, model_type="bailing_moe")),
    "hunyuan": (HUNYUAN, MLX_LM),
    "hunyuan_dense": (HUNYUAN_DENSE, dict(MLX_LM, model_type="hunyuan")),
    "hunyuan_renormalised": (HUNYUAN_HF, {"model_type": "hunyuan_v1_moe",
                                          "saved_model_type": "hunyuan"}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_mlx_lm_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def _logits_close(model, ref, prompts):
    import numpy as np

    from mlx_lm_oracle import mlx_lm_logits

    for p in prompts:
        np.testing.assert_allclose(np.array(model(mx.array([p]))[0]), mlx_lm_logits(ref, p),
                                   atol=1e-4, rtol=1e-4)


def test_bailing_hugging_face_layout_loads(tmp_path):
    """Ling's own checkpoint names (``mlp.gate.weight``, one tensor per expert) load to
    mlx-lm's logits; layers past ``num_hidden_layers`` (multi-token prediction) are
    dropped."""
    import json

    from mlx.utils import tree_flatten

    from arch_harness import make_prompts
    from mlx_lm_batched.utils import load_model
    from mlx_lm_oracle import build_mlx_lm_model

    ref = build_mlx_lm_model("bailing_moe", LING2)
    positive_expert_bias(ref)
    weights = {}
    for name, w in tree_flatten(ref.parameters()):
        if ".switch_mlp." in name:
            prefix, proj = name.split(".switch_mlp.")
            for e in range(w.shape[0]):
                weights[f"{prefix}.experts.{e}.{proj}"] = w[e]
        else:
            weights[name.replace(".gate.gate_proj.", ".gate.")] = w
    assert "model.layers.1.mlp.gate.weight" in weights
    weights["model.layers.3.attention.dense.weight"] = mx.zeros((64, 64))
    mx.save_safetensors(str(tmp_path / "model.safetensors"), weights)
    (tmp_path / "config.json").write_text(json.dumps(dict(LING2, model_type="bailing_moe")))
    model, _ = load_model(tmp_path)
    _logits_close(model, ref, make_prompts((5, 9)))


def test_bailing_norm_head_normalises_once(tmp_path):
    """``norm_head``: the head's columns are divided by their norms at load, as
    mlx-lm's sanitize does; a checkpoint saved after that loads unchanged."""
    import numpy as np
    from mlx.utils import tree_flatten

    from arch_harness import make_prompts
    from mlx_lm_batched.utils import load_model
    from mlx_lm_oracle import build_mlx_lm_model, save_mlx_lm_model

    config = dict(LING1, norm_head=True, tie_word_embeddings=False)
    ref = build_mlx_lm_model("bailing_moe", config)
    save_mlx_lm_model(ref, dict(config, model_type="bailing_moe"), tmp_path, "transformers4")
    raw = dict(tree_flatten(ref.parameters()))
    ref.load_weights(list(ref.sanitize(dict(raw)).items()))
    assert not np.allclose(np.array(raw["lm_head.weight"]), np.array(ref.lm_head.weight))
    model, _ = load_model(tmp_path)
    _logits_close(model, ref, make_prompts((6,)))
    again = model.sanitize(dict(tree_flatten(model.parameters())))
    assert mx.array_equal(again["lm_head.weight"], model.lm_head.weight)


def test_hunyuan_fused_projections_load(tmp_path):
    """The original release's fused ``qkv_proj`` (rows grouped per key/value head) and
    ``gate_and_up_proj`` (up first) load to mlx-lm's logits; mlx-lm's own sanitize
    splits the same tensors back into its weights, so the fused layout is the real one."""
    import json

    from mlx.utils import tree_flatten

    from arch_harness import make_prompts
    from mlx_lm_batched.utils import load_model
    from mlx_lm_oracle import build_mlx_lm_model

    config = dict(HUNYUAN_DENSE, attention_bias=False)
    ref = build_mlx_lm_model("hunyuan", config)
    params = dict(tree_flatten(ref.parameters()))
    n_kv, hd = config["num_key_value_heads"], config["hidden_size"] // config["num_attention_heads"]
    split_names = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
    fused = {k: v for k, v in params.items() if k.split(".")[-2] not in split_names}
    for i in range(config["num_hidden_layers"]):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        q, k, v = (params[f"{a}.{n}_proj.weight"] for n in "qkv")
        groups = [t.reshape(n_kv, -1, hd, t.shape[-1]) for t in (q, k, v)]
        fused[f"{a}.qkv_proj.weight"] = mx.concatenate(groups, axis=1).reshape(-1, q.shape[-1])
        fused[f"{m}.gate_and_up_proj.weight"] = mx.concatenate(
            [params[f"{m}.up_proj.weight"], params[f"{m}.gate_proj.weight"]], axis=0)
    split = ref.sanitize(dict(fused))
    assert sorted(split) == sorted(params)
    assert all(mx.array_equal(split[k], params[k]) for k in params)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), fused)
    (tmp_path / "config.json").write_text(json.dumps(dict(config, model_type="hunyuan")))
    model, _ = load_model(tmp_path)
    _logits_close(model, ref, make_prompts((5, 9)))


@pytest.mark.slow
def test_tensor_parallel_cla_matches_one_process(tmp_path):
    """Hunyuan with cross-layer attention sharded over 2 ranks generates what it
    generates in one process: layer 1 attends with layer 0's sharded keys/values."""
    from mlx_lm_oracle import build_mlx_lm_model, save_mlx_lm_model
    from distributed_harness import assert_tensor_parallel_exact, tiny_tokenizer

    ref = build_mlx_lm_model("hunyuan", HUNYUAN)
    save_mlx_lm_model(ref, dict(HUNYUAN, model_type="hunyuan"), tmp_path, "transformers4")
    tiny_tokenizer(tmp_path)
    assert_tensor_parallel_exact(tmp_path, [2, 4])


def test_bailing_shards_heads_and_experts_and_replicates_its_router():
    """Rank 0 of 2 keeps half of the fused q/k/v heads and of each expert, and the
    whole router (``gate.gate_proj``, a linear inside the router module)."""
    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.models import bailing_moe
    from distributed_harness import TwoRanks

    model = bailing_moe.Model(bailing_moe.ModelArgs.from_dict(dict(LING2,
                                                                   model_type="bailing_moe")))
    shard_model(model, TwoRanks())
    layer = model.layers[1]
    assert layer.self_attn.qkv_proj.weight.shape == ((2 + 2 * 1) * 16, 64)
    assert layer.mlp.gate.gate_proj.weight.shape == (8, 64)
    assert layer.mlp.switch_mlp.gate_proj.weight.shape == (8, 16, 64)
    assert layer.mlp.shared_experts.down_proj.weight.shape == (64, 16)


def test_bailing_mlx_lm_quantized_checkpoint_loads(tmp_path):
    """An mlx-lm 4-bit conversion (its router kept at 8 bits by a per-layer entry of
    the config's ``quantization``) loads with each layer's own bits and gives
    mlx-lm's quantized logits."""
    import json

    from mlx.utils import tree_flatten
    from mlx_lm.utils import quantize_model

    from arch_harness import make_prompts
    from mlx_lm_batched.utils import load_model
    from mlx_lm_oracle import build_mlx_lm_model

    ref = build_mlx_lm_model("bailing_moe", LING2)
    positive_expert_bias(ref)
    ref, config = quantize_model(ref, dict(LING2, model_type="bailing_moe"), 32, 4)
    assert config["quantization"]["model.layers.1.mlp.gate.gate_proj"]["bits"] == 8
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(ref.parameters())))
    (tmp_path / "config.json").write_text(json.dumps(config))
    model, _ = load_model(tmp_path)
    assert model.layers[1].mlp.gate.gate_proj.bits == 8
    assert model.layers[1].mlp.switch_mlp.up_proj.bits == 4
    _logits_close(model, ref, make_prompts((5, 9)))
