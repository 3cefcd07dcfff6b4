"""``python -m mlx_lm_batched.perplexity``: a model's perplexity on a local dataset, with
mlx-lm 0.32's flags and report (``api/perplexity.py``)."""

import time

from .args import EXIT_OK, CliError, Parser, one_line, run_command


def build_parser():
    """mlx-lm 0.32's ``perplexity`` flags."""
    p = Parser(prog="python -m mlx_lm_batched.perplexity",
               description="Evaluate perplexity of MLX models")
    p.add_argument("--model", required=True, help="model directory, Hugging Face repo id or "
                   ".gguf file")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for mlx-lm compatibility (no remote code is ever run)")
    p.add_argument("--batch-size", type=int, default=8, help="rows per forward pass")
    p.add_argument("--sequence-length", type=int, default=512, help="tokens per row")
    p.add_argument("--num-samples", type=int, default=256,
                   help="rows to evaluate (-1 for all available)")
    p.add_argument("--data-path", default="allenai/tulu-3-sft-mixture",
                   help="a .jsonl file or a directory with train.jsonl in mlx-lm's dataset "
                   "formats (Hub datasets are not downloaded here)")
    p.add_argument("--seed", type=int, default=123, help="random seed for the data sample")
    return p


def run(args):
    for name in ("batch_size", "sequence_length"):
        if getattr(args, name) < (2 if name == "sequence_length" else 1):
            raise CliError(f"--{name.replace('_', '-')} is too small: {getattr(args, name)}")
    import mlx.core as mx
    import numpy as np

    from ..api.perplexity import eval_ppl, load_data
    from ..loading.load import load
    from ..loading.save import get_total_parameters

    np.random.seed(args.seed)
    mx.random.seed(args.seed)
    print(f"Loading model from {args.model}...")
    try:
        model, tokenizer = load(args.model)
    except Exception as e:
        raise CliError(f"loading the model '{args.model}' failed: {one_line(e)}") from None
    print(f"Model loaded: {get_total_parameters(model) / 1e6:.1f}M parameters")
    print("\nLoading dataset...")
    print(f"  Sequence length: {args.sequence_length}")
    try:
        data = load_data(tokenizer, args.data_path, args.num_samples, args.sequence_length)
    except (ValueError, OSError) as e:
        raise CliError(one_line(e)) from None
    print(f"  Loaded {len(data)} samples")
    print(f"\nEvaluating perplexity with batch size {args.batch_size}...")
    start = time.time()

    def progress(done, total):
        print(f"  Processed {done}/{total} batches...", end="\r", flush=True)

    ppl, se = eval_ppl(model, data, args.batch_size, progress)
    print()
    seconds = time.time() - start
    print("\n" + "=" * 60)
    print("EVALUATION RESULTS")
    print("=" * 60)
    print(f"Model: {args.model}")
    print(f"Perplexity: {ppl:.3f} ± {se:.3f}")
    print(f"Evaluation time: {seconds:.2f} seconds")
    print(f"Peak memory: {mx.get_peak_memory() / 1e9:.2f} GB")
    print(f"Tokens per second: {data.shape[0] * (data.shape[1] - 1) / seconds:.0f}")
    print("\nDataset statistics:")
    print(f"  Total samples: {len(data)}")
    print(f"  Total tokens: {data.size}")
    return EXIT_OK


def main(argv=None):
    """Run the command line; returns the exit code (one ``error:`` line on bad input)."""
    return run_command(build_parser, run, argv)
