"""Decoder blocks: how a layer's attention and MLP are wired with their norms and
residuals (pre-norm, parallel, sandwich). Parameter names follow Hugging Face
checkpoints (``self_attn``, ``mlp``, ``input_layernorm`` ...)."""

import mlx.nn as nn


class PreNormBlock(nn.Module):
    """``h = x + attn(norm1(x)); out = h + mlp(norm2(h))`` (llama family).

    ``norm_names``: the checkpoint's names for the two norms. ``residual_scale``
    multiplies each branch before it is added (Granite's ``residual_multiplier``).
    """

    def __init__(self, attn, mlp, norm, norm_names=("input_layernorm", "post_attention_layernorm"),
                 residual_scale=None, mlp_name="mlp"):
        """``mlp_name``: the checkpoint's name for the MLP (Mixtral: ``block_sparse_moe``)."""
        super().__init__()
        self.self_attn = attn
        self.mlp_name = mlp_name
        setattr(self, mlp_name, mlp)
        self.norm_names = tuple(norm_names)
        for name in self.norm_names:
            setattr(self, name, norm())
        self.residual_scale = residual_scale

    def __call__(self, x, mask, offset, cache=None, attention=None):
        attn_norm, mlp_norm = (getattr(self, n) for n in self.norm_names)
        r = self.self_attn(attn_norm(x), mask, offset, cache, attention)
        h = x + (r if self.residual_scale is None else r * self.residual_scale)
        r = getattr(self, self.mlp_name)(mlp_norm(h))
        return h + (r if self.residual_scale is None else r * self.residual_scale)


class ParallelBlock(nn.Module):
    """``out = x + attn(norm1(x)) + mlp(norm2(x))``: attention and MLP read the same
    input (GPT-NeoX, Phi, Cohere). ``norm_names`` with one name: both branches share
    that norm (Phi, Cohere, StableLM)."""

    def __init__(self, attn, mlp, norm, norm_names=("input_layernorm", "post_attention_layernorm")):
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.norm_names = tuple(norm_names)
        for name in self.norm_names:
            setattr(self, name, norm())

    def __call__(self, x, mask, offset, cache=None, attention=None):
        h = getattr(self, self.norm_names[0])(x)
        m = h if len(self.norm_names) == 1 else getattr(self, self.norm_names[1])(x)
        return x + self.self_attn(h, mask, offset, cache, attention) + self.mlp(m)


class SandwichBlock(nn.Module):
    """Norms before and after both attention and MLP (Gemma 2/3).

    ``norm_names``: the checkpoint's names for the (pre-attention, post-attention,
    pre-MLP, post-MLP) norms; a None name means no norm there (OLMo 2 and EXAONE 4
    have post-norms only; GLM 4 names them differently). ``mixer_name``: the
    checkpoint's name of the attention (Gear's convolution layers: ``local_mixer``).
    """

    NORM_NAMES = ("input_layernorm", "post_attention_layernorm",
                  "pre_feedforward_layernorm", "post_feedforward_layernorm")

    def __init__(self, attn, mlp, norm, norm_names=NORM_NAMES, mixer_name="self_attn"):
        super().__init__()
        self.mixer_name = mixer_name
        setattr(self, mixer_name, attn)
        self.mlp = mlp
        self.norm_names = tuple(norm_names)
        for name in self.norm_names:
            if name is not None:
                setattr(self, name, norm())

    def _norm(self, i, x):
        name = self.norm_names[i]
        return x if name is None else getattr(self, name)(x)

    def __call__(self, x, mask, offset, cache=None, attention=None):
        mixer = getattr(self, self.mixer_name)
        h = x + self._norm(1, mixer(self._norm(0, x), mask, offset, cache, attention))
        return h + self._norm(3, self.mlp(self._norm(2, h)))
