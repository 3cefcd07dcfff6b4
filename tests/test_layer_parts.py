"""The named parts of the layer and mixer constructors (``LatentDims``,
``SharedExpert``, ``DeltaHeads``, ``SSDDims``/``SSDOutput``, ``SSMDims``) and of
``_native_build.cached_build`` (``BuildOptions``): each is checked once when made, and
builds the checkpoint names and shapes it stands for."""

import pytest
from mlx.utils import tree_flatten

from mlx_lm_batched._native_build import BuildOptions
from mlx_lm_batched.layers.gated_delta import DeltaHeads, GatedDeltaNet
from mlx_lm_batched.layers.mla import LatentDims, MultiHeadLatentAttention
from mlx_lm_batched.layers.mlp import MLP
from mlx_lm_batched.layers.moe import SharedExpert, SparseMoE
from mlx_lm_batched.models.mamba import MambaMixer, SSMDims
from mlx_lm_batched.models.mamba2 import Mamba2Mixer, SSDDims, SSDOutput


def shapes(module):
    return {k: tuple(v.shape) for k, v in tree_flatten(module.parameters())}


@pytest.mark.parametrize("make, message", [
    (lambda: LatentDims(8, 0, 8, 16), "qk_rope_head_dim must be an integer >= 1"),
    (lambda: LatentDims(8, 4, 8, 16, q_lora_rank=2.5), "q_lora_rank must be an integer"),
    (lambda: MultiHeadLatentAttention(64, 4, (8, 4, 8, 16)), "must be a LatentDims"),
    (lambda: SharedExpert(None), "SharedExpert mlp must be a module"),
    (lambda: SharedExpert(MLP(8, 16), name=""), "SharedExpert name must be a name"),
    (lambda: SparseMoE(8, 16, 4, 2, shared=MLP(8, 16)), "must be a SharedExpert or None"),
    (lambda: DeltaHeads(2, 4, 0, 8), "DeltaHeads k_dim must be a positive integer"),
    (lambda: GatedDeltaNet(64, (2, 4, 8, 8), 4, 1e-6), "must be a DeltaHeads"),
    (lambda: SSDDims(2, 16, 8, True, 4), "SSDDims groups must be a positive integer"),
    (lambda: Mamba2Mixer(64, SSDDims(2, 16, 8, 1, 4), 1e-6, output=False), "an SSDOutput"),
    (lambda: SSMDims(32, 8, 0, 4), "SSMDims dt_rank must be a positive integer"),
    (lambda: MambaMixer(64, (32, 8, 4, 4)), "must be an SSMDims"),
])
def test_a_bad_part_is_one_clear_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_latent_dims_build_the_low_rank_projections():
    full = shapes(MultiHeadLatentAttention(64, 4, LatentDims(8, 4, 6, 16)))
    assert full["q_proj.weight"] == (4 * 12, 64) and "q_a_proj.weight" not in full
    assert full["kv_a_proj_with_mqa.weight"] == (16 + 4, 64)
    assert full["kv_b_proj.weight"] == (4 * (8 + 6), 16)
    low = shapes(MultiHeadLatentAttention(64, 4, LatentDims(8, 4, 6, 16, q_lora_rank=24)))
    assert low["q_a_proj.weight"] == (24, 64) and low["q_b_proj.weight"] == (48, 24)


def test_a_shared_expert_is_named_and_gated_as_its_part_says():
    plain = shapes(SparseMoE(8, 16, 4, 2))
    assert not any(k.startswith(("shared", "shared_expert_gate")) for k in plain)
    gated = shapes(SparseMoE(8, 16, 4, 2, shared=SharedExpert(MLP(8, 12), gated=True)))
    assert gated["shared_expert.gate_proj.weight"] == (12, 8)
    assert gated["shared_expert_gate.weight"] == (1, 8)
    named = shapes(SparseMoE(8, 16, 4, 2, shared=SharedExpert(MLP(8, 12), "shared_experts")))
    assert "shared_experts.up_proj.weight" in named and "shared_expert_gate.weight" not in named


def test_mixer_dims_build_their_widths():
    delta = GatedDeltaNet(64, DeltaHeads(2, 4, 8, 16), 4, 1e-6)
    assert delta.sizes == (2, 4, 8, 16)
    assert shapes(delta)["in_proj_qkvz.weight"] == (2 * 16 + 2 * 64, 64)
    ssd = shapes(Mamba2Mixer(64, SSDDims(4, 16, 8, 2, 4), 1e-6, bias=True,
                             output=SSDOutput(rms_norm=False, bias=False)))
    assert ssd["in_proj.weight"] == (64 + (64 + 2 * 2 * 8) + 4, 64) and "in_proj.bias" in ssd
    assert "norm.weight" not in ssd and "out_proj.bias" not in ssd
    ssm = shapes(MambaMixer(64, SSMDims(32, 8, 4, 3)))
    assert ssm["x_proj.weight"] == (4 + 2 * 8, 32) and ssm["A_log"] == (32, 8)


def test_build_options_default_to_a_shared_object_library():
    assert BuildOptions() == BuildOptions(".so", (), (), 300)
    with pytest.raises(AttributeError):
        BuildOptions().timeout = 1
