"""The language model of vision-language checkpoints, group B (LFM2-VL, Pixtral,
Kimi-VL, Kimi K2.5; vision towers in the checkpoint are ignored, image input is not
supported): each against transformers where it has the model, else mlx-lm 0.32 on the
same tiny random checkpoint (``tests/mlx_lm_oracle.py``), in both config layouts, with
the harness's four checks."""

import mlx.core as mx
import pytest

from arch_harness import VOCAB, run_family

BASE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
MLX_LM = {"oracle": "mlx_lm"}
# DeepSeek V3's latent attention with its sigmoid-routed MoE from layer 1 on (Kimi's
# text model).
MLA = dict(BASE, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
           qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, bos_token_id=1,
           eos_token_id=2, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
           n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1,
           routed_scaling_factor=2.5)
# A one-layer vision tower: its weights are in the checkpoint and must be ignored.
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)


def kimi_k25_hub_names(directory):
    """transformers 5.24 saves Kimi K2.5 through its load-time renames run backwards,
    one of which (vision ``blocks`` -> ``layers``) also renames the text model's
    ``layers`` to ``blocks``; the hub checkpoints keep ``language_model.model.layers``."""
    import glob

    for path in glob.glob(f"{directory}/*.safetensors"):
        weights = mx.load(path)
        mx.save_safetensors(path, {k.replace("language_model.model.blocks.",
                                             "language_model.model.layers."): v
                                   for k, v in weights.items()}, metadata={"format": "pt"})


def positive_correction_bias(model):
    """Keep mlx-lm's router biases above zero, as trained ones are: mlx-lm scores the
    experts of dropped groups 0 (we drop them outright), so a negative biased score
    would rank a kept expert below them and the tie-break would decide."""
    for layer in model.language_model.model.layers:
        gate = getattr(layer.mlp, "gate", None)
        if gate is not None and "e_score_correction_bias" in gate:
            gate.e_score_correction_bias = mx.abs(gate.e_score_correction_bias)


FAMILIES = {
    "lfm2-vl": (dict(text_config=dict(BASE, num_hidden_layers=3, block_multiple_of=16,
                                      layer_types=["conv", "full_attention", "conv"]),
                     vision_config=dict(VISION, num_patches=4), projector_hidden_size=32),
                {"model_type": "lfm2_vl", "saved_model_type": "lfm2-vl"}),
    "pixtral": (dict(text_config=dict(BASE, head_dim=16, model_type="mistral"),
                     vision_config=dict(VISION, model_type="pixtral", head_dim=16, image_size=28,
                                        patch_size=14)),
                {"model_type": "llava", "saved_model_type": "pixtral"}),
    "kimi_vl": (dict(text_config=dict(MLA, rope_theta=10000.0, rms_norm_eps=1e-6,
                                      model_type="deepseek_v3")),
                dict(MLX_LM, hf_hook=positive_correction_bias)),
    "kimi_k25": (dict(text_config=dict(MLA, model_type="deepseek_v3"),
                      vision_config=dict(VISION, patch_size=14, pos_emb_height=4, pos_emb_width=4,
                                         pos_emb_time=2)), {"rewrite": kimi_k25_hub_names}),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_matches_reference_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)
