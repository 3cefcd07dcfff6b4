"""Gemma 4: the text model (``gemma4_text``) and the language model of the
multimodal checkpoint (``gemma4``) against transformers, in both config layouts.

The tiny configs exercise what Gemma 4 adds to Gemma 3: global layers with their
own head size and proportional RoPE, per-layer inputs, KV sharing with double-wide
MLPs, keys as values on global layers, the expert block, learned layer scalars."""

import torch
import pytest

from arch_harness import VOCAB, run_family

# Sliding, sliding, global, then two layers sharing the keys and values of layers 1
# (sliding) and 2 (global).
TYPES = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
         "full_attention"]
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=48, num_hidden_layers=5,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, global_head_dim=32,
            max_position_embeddings=256, sliding_window=8, layer_types=TYPES,
            hidden_size_per_layer_input=8, vocab_size_per_layer_input=VOCAB,
            num_kv_shared_layers=2, use_double_wide_mlp=True, final_logit_softcapping=30.0)
# The large models' shape: no per-layer inputs or sharing; keys as values on global
# layers with their own key/value heads; the expert block beside the MLP.
MOE = dict(TEXT, num_hidden_layers=3, layer_types=TYPES[:3], hidden_size_per_layer_input=0,
           num_kv_shared_layers=0, use_double_wide_mlp=False, attention_k_eq_v=True,
           num_global_key_value_heads=1, enable_moe_block=True, num_experts=4, top_k_experts=2,
           moe_intermediate_size=16)
VISION = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
              num_key_value_heads=2, head_dim=16, patch_size=4, pooling_kernel_size=2,
              position_embedding_size=64)
WINDOWED = {"lengths": (11, 3, 20, 9), "gen_lengths": (5, 14, 1)}


def random_layer_scalars(model):
    """``layer_scalar`` is a buffer (ones from transformers' init): give it values."""
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.uniform_(0.5, 1.5)


FAMILIES = {
    "gemma4_text": (TEXT, dict(WINDOWED, hf_hook=random_layer_scalars)),
    "gemma4_text_moe": (MOE, dict(WINDOWED, model_type="gemma4_text",
                                  hf_hook=random_layer_scalars)),
    # Placeholder ids inside the tiny vocabulary: prompts holding them, with no media,
    # embed them as padding (transformers' text-only behaviour).
    "gemma4": (dict(text_config=TEXT, vision_config=VISION, image_token_id=5,
                    video_token_id=6, audio_token_id=7),
               dict(WINDOWED, hf_hook=random_layer_scalars)),
}


@pytest.mark.parametrize("layout", ["transformers4", "transformers5"])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_gemma4_matches_transformers_and_batches_exactly(name, layout):
    run_family(name, FAMILIES[name], layout)


def hub_text(config):
    """``config`` as hub checkpoints write it: per-type ``rope_parameters``, the global
    layers' sizes as ``global_head_dim`` / ``num_global_key_value_heads``."""
    from mlx_lm_batched.models.gemma4_text import DEFAULT_ROPE

    return dict(config, rope_parameters=DEFAULT_ROPE)


@pytest.mark.parametrize("name", ["gemma4_text", "gemma4_text_moe", "gemma4"])
def test_mlx_lm_converted_checkpoints_load_with_mlx_lm_logits(name):
    """A checkpoint saved by mlx-lm 0.32 (its parameter names: ``switch_glu`` experts,
    ``language_model.model.*``; no keys/values in KV-sharing layers) loads here and
    gives mlx-lm's logits on every row of a left-padded batch."""
    import tempfile

    import mlx.core as mx
    import mlx_lm_oracle
    import numpy as np

    from arch_harness import ATOL, make_prompts
    from mlx_lm_batched.engine.prefill_plan import left_pad
    from mlx_lm_batched.utils import load_model

    text = FAMILIES["gemma4_text_moe" if name == "gemma4_text_moe" else "gemma4_text"][0]
    text = hub_text(text)
    config = dict(text_config=text, vocab_size=VOCAB) if name == "gemma4" else text
    model_type = "gemma4" if name == "gemma4" else "gemma4_text"
    with tempfile.TemporaryDirectory() as d:
        ref = mlx_lm_oracle.build_mlx_lm_model(model_type, config)
        mlx_lm_oracle.save_mlx_lm_model(ref, dict(config, model_type=model_type), d,
                                        "transformers4")
        model, _ = load_model(d)
    prompts = make_prompts((11, 3, 20))
    tokens, padding = left_pad(prompts)
    logits = model(tokens, offset=mx.array([-p for p in padding]))
    for i, p in enumerate(prompts):
        np.testing.assert_allclose(np.array(logits[i, padding[i]:]),
                                   mlx_lm_oracle.mlx_lm_logits(ref, p), atol=ATOL, rtol=ATOL,
                                   err_msg=f"{name} row {i} vs mlx-lm")


@pytest.mark.parametrize("change, message", [
    (dict(use_bidirectional_attention="all"), "use_bidirectional_attention='all'"),
    (dict(num_kv_shared_layers=5), r"num_kv_shared_layers must be in \[0, 4\]"),
    (dict(num_kv_shared_layers=3, layer_types=TYPES[:2] + ["sliding_attention"] * 2
          + ["full_attention"]), "no earlier layer of that type"),
    (dict(per_layer_config={"2": {"intermediate_size": 8}}), r"overrides \['intermediate_size'\]"),
])
def test_unsupported_configs_fail_with_one_clear_line(change, message):
    """What text-only Gemma 4 cannot run exactly is refused up front, naming the key."""
    from mlx_lm_batched.models import gemma4_text

    with pytest.raises(ValueError, match=message):
        gemma4_text.Model(gemma4_text.ModelArgs.from_dict(
            dict(TEXT, model_type="gemma4_text", **change)))
