"""Read llama.cpp GGUF files: weights under Hugging Face names and a HF config.

The tokenizer is built from the same file by ``gguf_tokenizer.py``.

Supported architectures: ``llama`` (Mistral GGUFs also declare ``llama``) and ``gemma3``.

The file is parsed by a small reader of our own instead of ``gguf.GGUFReader``, which
builds a numpy view per array element and takes ~20 s on Gemma's 262k-token vocabulary
(ours: well under a second). ``gguf.quants.dequantize`` still decodes the types MLX cannot
hold (Q2_K, Q3_K, Q6_K).

Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 and the Q4_K / Q5_K super-blocks are exactly MLX's affine
format with ``group_size=32`` (``gguf_blocks.py``), so they are repacked, not dequantized: for
Q4_0 / Q4_1 / Q8_0 the triples equal what ``mx.load`` produces, and unlike ``mx.load`` (which
turns every other type into float16) a Q4_K_M file stays about 6 bits a weight instead of
becoming float. Q6_K (groups of 16, which MLX lacks) is dequantized to float32.
"""

import mmap
import os
import struct

import mlx.core as mx
import numpy as np

from .gguf_blocks import AFFINE_TYPES, GROUP_SIZE, to_float32, to_mlx_affine

SUPPORTED_ARCHITECTURES = ("llama", "gemma3")

_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
               10: "<Q", 11: "<q", 12: "<d"}
_ARRAY_DTYPE = {0: "u1", 1: "i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?",
                10: "<u8", 11: "<i8", 12: "<f8"}
_F32, _F16, _BF16 = 0, 1, 30  # ggml type ids

# GGUF block-tensor name -> HF module name (inside ``model.layers.{i}``).
_LAYER_COMMON = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
}
_LAYER_NAMES = {
    "llama": {**_LAYER_COMMON, "ffn_norm": "post_attention_layernorm"},
    # Gemma 3 has four norms per block (sandwich norms) plus q/k norms.
    "gemma3": {**_LAYER_COMMON, "post_attention_norm": "post_attention_layernorm",
               "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm",
               "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"},
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class _Reader:
    """Sequential little-endian reader over a memory-mapped GGUF file."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.pos = 0

    def take(self, fmt):
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def string(self):
        n = self.take("<Q")
        self.pos += n
        return self.buf[self.pos - n:self.pos].decode("utf-8", errors="replace")

    def value(self, vtype):
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, n = self.take("<I"), self.take("<Q")
            if etype in _ARRAY_DTYPE:  # numeric arrays in one go (Gemma has 262k scores)
                arr = np.frombuffer(self.buf, _ARRAY_DTYPE[etype], n, self.pos)
                self.pos += arr.nbytes
                return arr.tolist()
            return [self.value(etype) for _ in range(n)]
        return self.take(_SCALAR_FMT[vtype])


def _parse(path, with_tensors=True):
    """(metadata, {name: (ggml_type, numpy_shape, raw uint8 bytes)}) of a GGUF file."""
    r = _Reader(path)
    if r.buf[:4] != b"GGUF":
        raise ValueError(f"{path} is not a GGUF file")
    r.pos = 4
    version = r.take("<I")
    if version < 2:
        raise ValueError(f"GGUF version {version} is too old (need >= 2)")
    n_tensors, n_kv = r.take("<Q"), r.take("<Q")
    metadata = {}
    for _ in range(n_kv):
        key = r.string()
        metadata[key] = r.value(r.take("<I"))
    if not with_tensors:
        return metadata, {}
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    infos = []
    for _ in range(n_tensors):
        name = r.string()
        dims = [r.take("<Q") for _ in range(r.take("<I"))]
        infos.append((name, r.take("<I"), tuple(reversed(dims)), r.take("<Q")))  # ggml dims are fastest-first
    align = metadata.get("general.alignment", 32)
    start = -(-r.pos // align) * align
    tensors = {}
    for name, ttype, shape, offset in infos:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(ttype)]
        nbytes = int(np.prod(shape)) // block * size
        tensors[name] = (ttype, shape, np.frombuffer(r.buf, np.uint8, nbytes, start + offset))
    return metadata, tensors


def gguf_architecture(path, metadata=None):
    """The GGUF's ``general.architecture``; ValueError unless it is one we support."""
    metadata = metadata if metadata is not None else _parse(path, with_tensors=False)[0]
    arch = metadata.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {os.path.basename(path)}; "
                         f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    return arch


def _to_float(ttype, shape, raw):
    """A tensor as an array: F32/F16 as stored, BF16 via mx, quantized ones float32."""
    if ttype == _F32:
        return raw.view(np.float32).reshape(shape)
    if ttype == _F16:
        return raw.view(np.float16).reshape(shape)
    if ttype == _BF16:
        return mx.array(raw.view(np.uint16).reshape(shape)).view(mx.bfloat16)
    if ttype in AFFINE_TYPES:
        # scale * q + bias in float32: bit-identical to gguf's reference dequantizer, which
        # is ~10x slower (Gemma's Q8_0 embedding alone takes it 10 s).
        return to_float32(ttype, shape, raw)
    from gguf import GGMLQuantizationType, quants

    return quants.dequantize(raw.reshape(*shape[:-1], -1), GGMLQuantizationType(ttype)).reshape(shape)


def _unpermute(x, n_head):
    """Undo convert_hf_to_gguf.py's q/k row permutation.

    llama.cpp rotates interleaved pairs (GPT-J style) while HF llama rotates halves, so the
    converter reorders each head's rows with ``reshape(n_head, 2, r, ...).swapaxes(1, 2)``.
    This is the inverse; it is a pure row permutation, so it applies to packed weights,
    scales and biases alike.
    """
    return x.reshape(n_head, x.shape[0] // n_head // 2, 2, *x.shape[1:]).swapaxes(1, 2).reshape(x.shape)


def _hf_name(arch, gguf_name):
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk" and len(parts) == 3 and parts[2] in _LAYER_NAMES[arch]:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[arch][parts[2]]}.{suffix}"
    if base in _TOP_NAMES:
        return f"{_TOP_NAMES[base]}.{suffix}"
    raise ValueError(f"unexpected tensor {gguf_name!r} in a {arch} GGUF")


def _f32(value):
    """GGUF stores floats as float32; write the shortest decimal (1e-06, not 9.99999997e-07)."""
    return float(str(np.float32(value)))


def _rope_scaling(md, arch, tensors, theta, head_dim):
    """HF ``rope_scaling`` from ``{arch}.rope.scaling.*`` or from a llama3 ``rope_freqs`` tensor."""
    kind = md.get(f"{arch}.rope.scaling.type")
    if kind not in (None, "none"):
        out = {"rope_type": kind, "factor": _f32(md[f"{arch}.rope.scaling.factor"])}
        if f"{arch}.rope.scaling.original_context_length" in md:
            out["original_max_position_embeddings"] = md[f"{arch}.rope.scaling.original_context_length"]
        return out
    if "rope_freqs.weight" not in tensors:
        return None
    # Llama 3.x: the converter bakes rope_scaling into per-frequency divisors and drops the
    # parameters. Every released Llama 3.x uses low=1, high=4, original=8192 with only the
    # factor varying, so rebuild that and check it reproduces the tensor exactly.
    freqs = _to_float(*tensors["rope_freqs.weight"]).astype(np.float64)
    factor, low, high, orig = float(freqs.max()), 1.0, 4.0, 8192
    wavelen = 2 * np.pi / theta ** (-np.arange(0, head_dim, 2) / head_dim)
    smooth = (orig / wavelen - low) / (high - low)
    expect = np.where(wavelen < orig / high, 1.0,
                      np.where(wavelen > orig / low, factor, 1 / ((1 - smooth) / factor + smooth)))
    if expect.shape != freqs.shape or not np.allclose(expect, freqs, rtol=1e-4):
        raise ValueError("rope_freqs.weight does not match llama3 rope scaling (low=1, high=4, original=8192)")
    return {"rope_type": "llama3", "factor": _f32(factor), "low_freq_factor": low,
            "high_freq_factor": high, "original_max_position_embeddings": orig}


def _config(md, arch, tensors):
    """A transformers config.json dict (flat, transformers-4 style rope keys)."""
    g = lambda key, default=None: md.get(f"{arch}.{key}", default)  # noqa: E731
    hidden, heads = g("embedding_length"), g("attention.head_count")
    kv_heads = g("attention.head_count_kv", heads)
    kv_heads = max(kv_heads) if isinstance(kv_heads, list) else kv_heads
    head_dim = g("attention.key_length", hidden // heads)
    theta = _f32(g("rope.freq_base", 10000.0))
    eos = md.get("tokenizer.ggml.eos_token_id")
    cfg = {
        "vocab_size": g("vocab_size", len(md.get("tokenizer.ggml.tokens", ()))),
        "hidden_size": hidden, "intermediate_size": g("feed_forward_length"),
        "num_hidden_layers": g("block_count"), "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "max_position_embeddings": g("context_length"),
        "rms_norm_eps": _f32(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": theta, "rope_scaling": _rope_scaling(md, arch, tensors, theta, head_dim),
        "tie_word_embeddings": "output.weight" not in tensors,
        "attention_bias": "blk.0.attn_q.bias" in tensors, "attention_dropout": 0.0,
        "bos_token_id": md.get("tokenizer.ggml.bos_token_id"), "eos_token_id": eos,
        "pad_token_id": md.get("tokenizer.ggml.padding_token_id"),
    }
    if arch == "llama":
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], **cfg,
                "hidden_act": "silu", "mlp_bias": False}
    n_layers = cfg["num_hidden_layers"]
    pattern = g("attention.sliding_window_pattern", 6)
    if isinstance(pattern, list):  # newer converters write one bool per layer (True = sliding)
        layer_types = ["sliding_attention" if s else "full_attention" for s in pattern]
    else:  # llama.cpp's default for gemma3: every 6th layer is global
        layer_types = ["full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)]
    tokens = md.get("tokenizer.ggml.tokens", [])
    if "<end_of_turn>" in tokens and not isinstance(eos, list):
        # Gemma's generation_config stops on <end_of_turn> too; llama.cpp also treats it as EOG.
        cfg["eos_token_id"] = [eos, tokens.index("<end_of_turn>")]
    return {
        "model_type": "gemma3_text", "architectures": ["Gemma3ForCausalLM"], **cfg,
        "hidden_activation": "gelu_pytorch_tanh",
        # Not in the GGUF; llama.cpp hardcodes these: local rope base 10000, and the query
        # scale 1/sqrt(head_dim) except for the 62-layer 27B which uses hidden/heads.
        "rope_local_base_freq": 10000.0,
        "query_pre_attn_scalar": hidden // heads if n_layers == 62 else head_dim,
        "sliding_window": g("attention.sliding_window"), "layer_types": layer_types,
        "final_logit_softcapping": g("final_logit_softcapping"),
        "attn_logit_softcapping": g("attn_logit_softcapping"),
        "use_bidirectional_attention": False,
    }


def read_gguf(path, dtype=None):
    """Load a GGUF as ``(weights, config, metadata)`` with Hugging Face parameter names.

    ``weights`` maps HF names (``model.layers.0.self_attn.q_proj.weight``, ...) to mx
    arrays; ``lm_head.weight`` only when the file has an untied ``output.weight``.
    llama.cpp's conversions are undone: the llama q/k row permutation and Gemma's
    ``norm + 1``. With ``dtype=None``, Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K tensors stay
    quantized as MLX affine triples (``.weight`` uint32, ``.scales``/``.biases`` f16, or
    float32 for the K-quants; group size 32; 4, 5 or 8 bits), F16/BF16/F32 keep their dtype
    and other quantizations (Q2_K, Q3_K, Q6_K) become float32;
    ``config["quantization"]`` (and ``quantization_config``) then gives the default bits
    plus per-module overrides. With a ``dtype``, everything is dequantized to it.
    ``config`` is a transformers config.json dict; ``metadata`` the raw GGUF key/values.
    """
    md, tensors = _parse(path)
    arch = gguf_architecture(path, md)
    config = _config(md, arch, tensors)
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    weights, bits = {}, {}
    for gname, (ttype, shape, raw) in tensors.items():
        if gname == "rope_freqs.weight":  # folded into config["rope_scaling"]
            continue
        name = _hf_name(arch, gname)
        n_head = None
        if arch == "llama" and ".attn_q." in gname:
            n_head = heads
        elif arch == "llama" and ".attn_k." in gname:
            n_head = kv_heads
        # Gemma is converted without the permutation (llama.cpp uses NEOX rope for it).
        fix = (lambda a: _unpermute(a, n_head)) if n_head else (lambda a: a)
        if dtype is None and ttype in AFFINE_TYPES and len(shape) == 2:
            w, s, b, nbits = to_mlx_affine(ttype, shape, raw)
            module = name[: -len(".weight")]
            weights.update({name: mx.array(fix(w)), f"{module}.scales": mx.array(fix(s)),
                            f"{module}.biases": mx.array(fix(b))})
            bits[module] = nbits
            continue
        # With a dtype, the affine types are dequantized in numpy with ggml's own arithmetic
        # (d * q - m in float32, as llama.cpp and transformers do): bit-identical to them and
        # several times faster than mx.dequantize on the CPU backend.
        value = fix(_to_float(ttype, shape, raw))
        if isinstance(value, np.ndarray):
            value = mx.array(value if ttype in (_F32, _F16) else value.astype(np.float32, copy=False))
        if arch == "gemma3" and gname.endswith("norm.weight"):
            # llama.cpp stores Gemma's RMSNorm weight as (w + 1); HF keeps w and
            # computes x * (1 + w). Applies to every norm incl. q/k and the final one.
            value = value.astype(mx.float32) - 1
        weights[name] = value if dtype is None else value.astype(dtype)
    if bits:
        default = max(set(bits.values()), key=list(bits.values()).count)
        quant = {"group_size": GROUP_SIZE, "bits": default}
        quant.update({m: {"group_size": GROUP_SIZE, "bits": b} for m, b in bits.items() if b != default})
        config["quantization"] = quant
        config["quantization_config"] = dict(quant)
    return weights, config, md

