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
