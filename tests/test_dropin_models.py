"""What code written for mlx-lm reaches in model files, against mlx-lm as the oracle:
module-level helpers (same inputs, same arrays) and ``ModelArgs`` built with few fields."""

import mlx.core as mx
import numpy as np
import pytest


@pytest.mark.parametrize("shape", [(2, 5, 12), (1, 5, 3, 12)])
@pytest.mark.parametrize("inverse", [False, True])
def test_deepseek_v41_apply_rope_matches_mlx_lm(shape, inverse):
    from mlx_lm.models import deepseek_v41 as theirs
    from mlx_lm.models.rope_utils import YarnRoPE as TheirRope

    from mlx_lm_batched.models import deepseek_v41 as ours
    from mlx_lm_batched.models.rope_utils import YarnRoPE as OurRope

    kw = dict(dims=4, traditional=True, base=160000.0, scaling_factor=4.0,
              original_max_position_embeddings=16, mscale=1.0, mscale_all_dim=0.5)
    x = mx.random.normal(shape, key=mx.random.key(3)).astype(mx.bfloat16)
    args = dict(rope_dim=4, offset=7, scale=0.5, inverse=inverse)
    want = theirs._apply_rope(x, TheirRope(**kw), **args)
    got = ours._apply_rope(x, OurRope(**kw), **args)
    assert got.dtype == want.dtype == mx.bfloat16
    assert np.allclose(np.array(got.astype(mx.float32)), np.array(want.astype(mx.float32)),
                       atol=1e-2)
    assert mx.array_equal(got[..., :-4], x[..., :-4]).item()  # the head is untouched
    assert ours._apply_rope(x, OurRope(**kw), rope_dim=0) is x


def test_falcon_h1_args_with_few_fields_take_mlx_lm_sizes():
    """The sizes left out are mlx-lm's; the Mamba width left out is transformers' (what
    a checkpoint omitting it means); the model builds and runs."""
    from mlx_lm.models import falcon_h1 as theirs
    from transformers import FalconH1Config

    from mlx_lm_batched.models import falcon_h1 as ours

    fields = dict(num_hidden_layers=1, vocab_size=50)
    got, want = ours.ModelArgs(**fields), theirs.ModelArgs(**fields)
    for name in ("model_type", "hidden_size", "num_attention_heads", "vocab_size"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.mamba_d_ssm == FalconH1Config().mamba_d_ssm
    assert ours.ModelArgs(mamba_d_ssm=None, hidden_size=64).mamba_d_ssm == 128  # expand x
    small = ours.ModelArgs(hidden_size=64, num_attention_heads=4, mamba_n_heads=8,
                           mamba_d_head=8, mamba_d_ssm=64, mamba_d_state=8, **fields)
    model = ours.Model(small)
    assert model(mx.array([[1, 2, 3]])).shape == (1, 3, 50)
