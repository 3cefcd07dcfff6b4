"""Random hybrid checkpoints for ``bench.py --hybrid``: a small-but-not-trivial model of
a recurrent/attention hybrid family, built with transformers' own config and model
classes, saved as a Hugging Face checkpoint (loadable by this package and by mlx-lm),
with the tokenizer (and vocabulary size) of a real model directory.

Needs torch and transformers (test oracles, not dependencies of the package).
"""

import hashlib
import json
import shutil
from pathlib import Path

# hidden 512, 8 layers: big enough that a decode step's matmuls, not Python, dominate
# (like a real model's), small enough for a 2-core CPU. The vocabulary is the tokenizer's.
CONFIGS = {
    # Gated delta-rule linear attention (3 of every 4 layers) + gated full attention, MoE.
    "qwen3_next": dict(
        hidden_size=512, num_hidden_layers=8, intermediate_size=1024,
        num_attention_heads=8, num_key_value_heads=2, head_dim=64,
        linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=64,
        linear_value_head_dim=64, linear_conv_kernel_dim=4, full_attention_interval=4,
        num_experts=8, num_experts_per_tok=2, moe_intermediate_size=256,
        shared_expert_intermediate_size=512, max_position_embeddings=4096),
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja")


def _config(model_type, vocab_size):
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, vocab_size=vocab_size, **CONFIGS[model_type])


def build_checkpoint(model_type, tokenizer_dir, out_root="/tmp", seed=0):
    """Directory of a random ``model_type`` checkpoint with ``tokenizer_dir``'s tokenizer
    (built once per settings; later calls reuse it). Returns its path."""
    if model_type not in CONFIGS:
        raise ValueError(f"--hybrid must be one of {sorted(CONFIGS)}, got {model_type!r}")
    tokenizer_dir = Path(tokenizer_dir)
    if not (tokenizer_dir / "tokenizer.json").exists():
        raise FileNotFoundError(f"--model {tokenizer_dir}: no tokenizer.json there (the hybrid "
                                "bench takes the tokenizer of a converted model directory)")
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    key = hashlib.sha256(json.dumps([model_type, CONFIGS[model_type], vocab, seed],
                                    sort_keys=True).encode()).hexdigest()[:12]
    out = Path(out_root) / f"bench-hybrid-{model_type}-{key}"
    if (out / "model.safetensors").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = _config(model_type, vocab)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    # Also the flat RoPE keys transformers 4 wrote: mlx-lm 0.32 reads only those.
    cfg = json.loads((tmp / "config.json").read_text())
    for name, value in (cfg.get("rope_parameters") or {}).items():
        if name in ("rope_theta", "partial_rotary_factor"):
            cfg.setdefault(name, value)
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).exists():
            shutil.copy(tokenizer_dir / name, tmp / name)
    tmp.rename(out)  # complete checkpoints only: a killed build leaves no half directory
    return out
