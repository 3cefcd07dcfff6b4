"""The shared attention's named parts (``layers/attention_options.py``): each is checked
once when made, and each switch builds the checkpoint names it stands for."""

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten

from mlx_lm_batched.layers.attention import Attention, OutputGatedAttention
from mlx_lm_batched.layers.attention_options import OutputGate, Projections, QKNorm, Scores
from mlx_lm_batched.layers.kv_sharing import SharedKVAttention
from mlx_lm_batched.layers.norms import RMSNorm


def shapes(module):
    return {k: tuple(v.shape) for k, v in tree_flatten(module.parameters())}


@pytest.mark.parametrize("make, message", [
    (lambda: QKNorm(None), "QKNorm factory must be callable"),
    (lambda: QKNorm(RMSNorm, full=True, after_rope=True), "exclude each other"),
    (lambda: QKNorm(RMSNorm, names=("q_norm",)), "two different names"),
    (lambda: QKNorm(RMSNorm, names=("n", "n")), "two different names"),
    (lambda: Projections(fused_qkv=True, values_from_keys=True), "values_from_keys needs"),
    (lambda: Projections(clip=0), "clip must be positive"),
    (lambda: Projections(qkv_name=""), "qkv_name must be a name"),
    (lambda: Projections(v_norm=1.0), "v_norm must be callable"),
    (lambda: Scores(position_scale=2.0), "position_scale must be callable"),
    (lambda: Attention(64, 4, 2, 16, qk_norm=RMSNorm), "qk_norm must be a QKNorm"),
    (lambda: Attention(64, 4, 2, 16, projections=dict(bias=True)), "projections must be"),
    (lambda: Attention(64, 4, 2, 16, scores=0.5), "scores must be a Scores"),
    (lambda: SharedKVAttention(64, 4, 2, 16, projections=Projections(fused_qkv=True)),
     "projects queries only"),
    (lambda: OutputGate("tanh"), "unknown attention output gate 'tanh'"),
    (lambda: OutputGate(name=""), "OutputGate name must be a name"),
    (lambda: OutputGatedAttention(64, 4, 2, 16, None, "softplus"), "must be an OutputGate"),
])
def test_a_bad_part_is_one_clear_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_the_parts_are_frozen():
    with pytest.raises(AttributeError):
        Projections().bias = True


def test_each_switch_builds_the_names_it_stands_for():
    plain = shapes(Attention(64, 4, 2, 16))
    assert plain == {"q_proj.weight": (64, 64), "k_proj.weight": (32, 64),
                     "v_proj.weight": (32, 64), "o_proj.weight": (64, 64)}
    biased = shapes(Attention(64, 4, 2, 16, projections=Projections(bias=True, o_bias=False)))
    assert "q_proj.bias" in biased and "o_proj.bias" not in biased
    fused = shapes(Attention(64, 4, 2, 16, projections=Projections(fused_qkv=True,
                                                                   qkv_name="W_pack")))
    assert set(fused) == {"W_pack.weight", "o_proj.weight"} and fused["W_pack.weight"] == (128, 64)
    shared_values = shapes(Attention(64, 4, 2, 16, projections=Projections(values_from_keys=True)))
    assert "v_proj.weight" not in shared_values and "k_proj.weight" in shared_values
    normed = shapes(Attention(64, 4, 2, 16, qk_norm=QKNorm(RMSNorm, full=True,
                                                            names=("q_layernorm", "k_layernorm"))))
    assert normed["q_layernorm.weight"] == (64,) and normed["k_layernorm.weight"] == (32,)
    per_head = shapes(Attention(64, 4, 2, 16, qk_norm=QKNorm(RMSNorm)))
    assert per_head["q_norm.weight"] == per_head["k_norm.weight"] == (16,)
    assert shapes(Attention(64, 4, 2, 16, scores=Scores(sinks=True)))["sinks"] == (4,)
    gated = shapes(OutputGatedAttention(64, 4, 2, 16, None,
                                        OutputGate(per_head=True, name="g_proj", bias=True)))
    assert gated["g_proj.weight"] == (4, 64) and gated["g_proj.bias"] == (4,)
    assert shapes(OutputGatedAttention(64, 4, 2, 16, None))["gate_proj.weight"] == (64, 64)


def test_scores_scale_and_softcap_change_the_output():
    mx.random.seed(0)
    x = mx.random.normal((1, 5, 64))
    offset = mx.array([0])
    outs = []
    for scores in (Scores(), Scores(scale=1.0), Scores(softcap=0.5)):
        mx.random.seed(1)  # the same weights for each
        attn = Attention(64, 4, 2, 16, scores=scores)
        outs.append(attn(x, None, offset))
    assert not mx.allclose(outs[0], outs[1]).item()
    assert not mx.allclose(outs[0], outs[2]).item()
