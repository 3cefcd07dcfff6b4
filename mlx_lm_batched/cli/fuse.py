"""``python -m mlx_lm_batched.fuse``: fold a LoRA/DoRA adapter into a model's weights and
save the result as a model directory (mlx-lm's ``fuse`` flags)."""

import argparse

from ..loading.adapters import fuse_adapters
from ..loading.dequantize import dequantize_model
from ..loading.load import load
from ..loading.save import save


def build_parser():
    """The argument parser (mlx-lm's flags)."""
    p = argparse.ArgumentParser(description="Fuse fine-tuned adapters into the base model.")
    p.add_argument("--model", default="mlx_model", help="local model directory or Hugging Face repo")
    p.add_argument("--save-path", default="fused_model", help="where to save the fused model")
    p.add_argument("--adapter-path", default="adapters", help="the adapter directory "
                   "(adapter_config.json + adapters.safetensors)")
    p.add_argument("--upload-repo", default=None, help="not supported (no uploads)")
    p.add_argument("--dequantize", action="store_true", help="save a dequantized model")
    p.add_argument("--export-gguf", action="store_true", help="not supported yet")
    p.add_argument("--gguf-path", default="ggml-model-f16.gguf", help="not supported yet")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for mlx-lm compatibility: no code is run from a repository")
    return p


def main(argv=None):
    """Fuse and save; returns the exit code (1 with one error line on bad input)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.export_gguf:
        parser.exit(1, "error: --export-gguf is not supported by mlx_lm_batched yet: save "
                       "the fused model and convert it with llama.cpp's convert_hf_to_gguf.py\n")
    if args.upload_repo:
        parser.exit(1, "error: --upload-repo is not supported: upload the saved directory "
                       "with huggingface-cli upload\n")
    try:
        model, tokenizer, config = load(args.model, adapter_path=args.adapter_path,
                                        return_config=True)
        fuse_adapters(model, dequantize=args.dequantize)
        if args.dequantize:
            dequantize_model(model)
            config.pop("quantization", None)
            config.pop("quantization_config", None)
        save(args.save_path, args.model, model, tokenizer, config, donate_model=False)
    except (ValueError, OSError, NotImplementedError, TypeError) as e:
        parser.exit(1, f"error: {e}\n")
    print(f"[fuse] wrote {args.save_path}")
    return 0
