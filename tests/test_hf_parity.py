"""Logits against Hugging Face transformers (torch, CPU) on the same weights.

transformers loads the float32 directories our ``convert`` made from the GGUFs, so
this checks the GGUF conversion and our architectures at once.
"""

import mlx.core as mx
import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from conftest import corpus_prompts
from mlx_lm_batched.engine.prefill_plan import left_pad

# float32 through 18-30 layers with logits up to ~30: summation order differs between
# torch and MLX (measured max differences: 7e-5 at 7 tokens, 4e-4 at 600).
ATOL = 1e-3


@pytest.mark.parametrize("name", ["smollm2", "gemma3"])
def test_logits_match_transformers(name, float_dirs, float_models):
    model, tokenizer = float_models[name]
    hf = AutoModelForCausalLM.from_pretrained(str(float_dirs[name]), dtype=torch.float32).eval()
    # The long prompt crosses Gemma's 512-token window.
    prompts = corpus_prompts(tokenizer, (7, 600))
    tokens, padding = left_pad(prompts)
    batch = model(tokens, offset=mx.array([-p for p in padding]))
    for i, prompt in enumerate(prompts):
        n = min(16, len(prompt))
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0, -n:].numpy()
        ours = np.array(batch[i, -n:])
        np.testing.assert_allclose(ours, ref, atol=ATOL, rtol=0,
                                   err_msg=f"{name} prompt of {len(prompt)} tokens")
        assert (ours.argmax(-1) == ref.argmax(-1)).all()
