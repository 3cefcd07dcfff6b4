"""Module-level helpers of model files that code written for mlx-lm calls, against
mlx-lm as the oracle (same inputs, same arrays)."""

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
