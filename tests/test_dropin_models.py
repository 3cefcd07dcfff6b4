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


@pytest.mark.parametrize("scaling", [
    None, {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0}])
def test_initialize_rope_gives_mlx_lm_classes_and_rotations(scaling):
    """``rope_utils.initialize_rope`` returns an instance of the class mlx-lm's returns
    (``nn.RoPE``, ``Llama3RoPE``, ``ProportionalRoPE``) that rotates as mlx-lm's module
    and as this package's own ``make_rope``, with per-row offsets too."""
    import mlx.nn as nn
    from mlx_lm.models import rope_utils as theirs

    from mlx_lm_batched.layers.rope import make_rope
    from mlx_lm_batched.models import rope_utils as ours

    got = ours.initialize_rope(16, 500.0, False, scaling, 256)
    want = theirs.initialize_rope(16, 500.0, False, scaling, 256)
    mlx_lm_class = type(want) if type(want) is not nn.RoPE else nn.RoPE
    assert isinstance(got, nn.RoPE)
    assert isinstance(got, getattr(ours, mlx_lm_class.__name__, nn.RoPE))
    x = mx.random.normal((2, 2, 5, 16), key=mx.random.key(1))
    np.testing.assert_allclose(np.array(got(x, offset=3)), np.array(want(x, offset=3)),
                               atol=1e-5)
    rows = mx.array([3, 0])
    np.testing.assert_array_equal(np.array(got(x, rows)),
                                  np.array(make_rope(16, 500.0, False, scaling, 256)(x, rows)))


def test_phi3small_masks_mlx_lm_dummy_token_ids():
    """``model._dummy_tokenizer_ids`` (mlx-lm's attribute) are the ids whose logits are
    -inf, mlx-lm's list within the vocabulary."""
    from mlx_lm.models import phi3small as theirs

    from mlx_lm_batched.models import phi3small as ours

    fields = dict(model_type="phi3small", hidden_size=64, dense_attention_every_n_layers=2,
                  ff_intermediate_size=128, gegelu_limit=1.0, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, layer_norm_epsilon=1e-4,
                  vocab_size=100352)
    model = ours.Model(ours.ModelArgs(**fields))
    reference = theirs.Model(theirs.ModelArgs(**fields))
    assert model._dummy_tokenizer_ids.tolist() == reference._dummy_tokenizer_ids.tolist()
    out = model(mx.array([[1, 2, 3]]))
    assert mx.all(out[..., model._dummy_tokenizer_ids] == -mx.inf).item()
    assert mx.all(mx.isfinite(out[..., :100256])).item()


def test_laguna_sanitize_strips_language_model_prefix_as_mlx_lm():
    """Weights under a ``language_model.`` prefix (public repacks) load into the text
    model and give the same logits; mlx-lm's sanitize strips the prefix too."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import laguna as theirs

    from mlx_lm_batched.models import laguna as ours

    fields = dict(model_type="laguna", vocab_size=50, hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  head_dim=8, sliding_window=4, num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=16, shared_expert_intermediate_size=16,
                  layer_types=["full_attention", "sliding_attention"],
                  mlp_layer_types=["dense", "sparse"])
    model = ours.Model(ours.ModelArgs(**fields))
    prefixed = {f"language_model.{k}": v for k, v in tree_flatten(model.parameters())}
    copy = ours.Model(ours.ModelArgs(**fields))
    copy.load_weights(list(copy.sanitize(dict(prefixed)).items()), strict=True)
    prompt = mx.array([[0, 1, 2, 3, 4]])
    assert mx.array_equal(copy(prompt), model(prompt)).item()
    reference = theirs.Model(theirs.ModelArgs(**fields))
    mlx_lm_own = {f"language_model.{k}": v for k, v in tree_flatten(reference.parameters())}
    assert not any(k.startswith("language_model.") for k in reference.sanitize(mlx_lm_own))


def test_mistral4_args_built_with_rope_parameters_scale_attention_as_mlx_lm():
    """``ModelArgs(rope_parameters=...)`` (transformers 5's layout, passed to the
    constructor) sets the YaRN settings as ``from_dict`` does: the attention scale is
    mlx-lm's, with the YaRN factor squared."""
    from mlx_lm.models import mistral4 as theirs

    from mlx_lm_batched.models import mistral4 as ours

    rope = {"rope_type": "yarn", "factor": 128.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "beta_fast": 32, "beta_slow": 1, "original_max_position_embeddings": 4096,
            "rope_theta": 100000.0, "llama_4_scaling_beta": 0.1}
    fields = dict(model_type="mistral4", vocab_size=64, hidden_size=64, intermediate_size=64,
                  moe_intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=2, n_routed_experts=4, num_experts_per_tok=2,
                  kv_lora_rank=16, q_lora_rank=16, qk_rope_head_dim=16, qk_nope_head_dim=16,
                  v_head_dim=16, n_shared_experts=1, routed_scaling_factor=1.0,
                  norm_topk_prob=True, max_position_embeddings=4096, rms_norm_eps=1e-6,
                  n_group=1, topk_group=1, first_k_dense_replace=0, rope_parameters=rope)
    built = ours.ModelArgs(**fields)
    assert built.rope_scaling == ours.ModelArgs.from_dict(fields).rope_scaling
    assert built.rope_theta == 100000.0
    got = ours.Model(built).layers[0].self_attn.scale
    want = theirs.Model(theirs.ModelArgs(**fields)).layers[0].self_attn.scale
    assert got == pytest.approx(want, rel=1e-6) and got > 32 ** -0.5


@pytest.mark.parametrize("model_type", ["mamba", "falcon_mamba"])
def test_mamba_ssm_step_matches_mlx_lm(model_type):
    """``MambaBlock.ssm_step`` (mlx-lm's one-position scan, Falcon-Mamba's weightless
    dt/B/C norms included) gives mlx-lm's outputs and states over several steps from
    the same weights, and the steps equal this package's whole-sequence mixer."""
    import mlx.nn as nn
    from mlx.utils import tree_flatten
    from mlx_lm.models import mamba as theirs

    from mlx_lm_batched.models import mamba as ours

    fields = dict(model_type=model_type, vocab_size=32, hidden_size=8, num_hidden_layers=1,
                  state_size=4, intermediate_size=16, time_step_rank=2, conv_kernel=4,
                  use_bias=False, use_conv_bias=True)
    want_block = theirs.MambaBlock(theirs.ModelArgs(**fields))
    got_block = ours.MambaBlock(ours.ModelArgs(**fields))
    keys = iter(mx.random.split(mx.random.key(5), 8))
    shared = {k: mx.random.normal(v.shape, key=next(keys)) * 0.5
              for k, v in tree_flatten(want_block.parameters())
              if k.split(".")[0] in ("x_proj", "dt_proj", "D", "A_log")}
    want_block.load_weights(list(shared.items()), strict=False)
    got_block.mixer.load_weights(list(shared.items()), strict=False)
    A = -mx.exp(shared["A_log"])
    xs = nn.silu(mx.random.normal((2, 3, 16), key=mx.random.key(6)))
    want_state = got_state = None
    steps = []
    for t in range(3):
        want, want_state = want_block.ssm_step(xs[:, t], A, want_state)
        got, got_state = got_block.ssm_step(xs[:, t], A, got_state)
        np.testing.assert_allclose(np.array(got), np.array(want), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(np.array(got_state), np.array(want_state), rtol=1e-4,
                                   atol=1e-5)
        steps.append(got)
    # the steps are the scan the mixer runs over a sequence (before gate and projection)
    from mlx_lm_batched.layers.ssm import selective_scan

    mixer = got_block.mixer
    D, N, R = mixer.sizes
    dt, Bm, Cm = mixer._norm_bcdt(*mx.split(mixer.x_proj(xs), [R, R + N], axis=-1))
    y, _ = selective_scan(xs, nn.softplus(mixer.dt_proj(dt)), A, Bm, Cm, mixer.D, None,
                          mx.ones((2, 3), mx.bool_))
    np.testing.assert_allclose(np.array(mx.stack(steps, axis=1)), np.array(y), rtol=1e-5,
                               atol=1e-6)


def test_spark2_5_layers_say_which_slide_as_mlx_lm():
    """``layer.is_sliding`` per layer is mlx-lm's, and the sliding layers are the ones
    ``make_cache`` gives a ring of the window (mlx-lm's caches by type)."""
    from mlx_lm.models import spark2_5 as theirs

    from mlx_lm_batched.models import spark2_5 as ours

    fields = dict(model_type="spark2_5", hidden_size=32, num_hidden_layers=6,
                  intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
                  head_dim=16, vocab_size=50, sliding_window=8,
                  rope_parameters={"sliding_attention": {"rope_theta": 1e4},
                                   "full_attention": {"rope_theta": 1e6,
                                                      "partial_rotary_factor": 0.25}},
                  layer_types=["sliding_attention", "full_attention", "sliding_attention",
                               "sliding_attention", "full_attention", "sliding_attention"])
    got, want = ours.Model(ours.ModelArgs(**fields)), theirs.Model(theirs.ModelArgs(**fields))
    assert ([layer.is_sliding for layer in got.layers]
            == [layer.is_sliding for layer in want.layers]
            == [t == "sliding_attention" for t in fields["layer_types"]])
    assert ([type(c).__name__ for c in got.make_cache()]
            == [type(c).__name__ for c in want.make_cache()])
    assert [getattr(c, "max_size", None) for c in got.make_cache()] == [
        8 if sliding else None for sliding in (layer.is_sliding for layer in got.layers)]
