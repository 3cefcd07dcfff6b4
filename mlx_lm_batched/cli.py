"""``python -m mlx_lm_batched.generate``: generate for many prompts at once.

Never a traceback: every failure ends in one ``error:`` line and an exit code
(0 ok, 1 some prompts rejected, 2 nothing could run, 130 interrupted); set
``MLX_LM_BATCHED_DEBUG=1`` to also print the traceback of an unexpected error.
A bad prompt (missing or empty file, too long, a chat template that fails on it)
is reported and skipped; the others still run. Outputs are checked before the
model loads and written as each prompt finishes, so Ctrl-C keeps finished work.
"""

import os
import signal
import sys
import time

from .cli_args import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    CliError,
    build_parser,
    check_args,
)
from .cli_output import Outputs

DEBUG_ENV = "MLX_LM_BATCHED_DEBUG"
MAX_MESSAGE = 500  # characters of an error message kept on its one line
FALLBACK_CONTEXT = 131072  # when a config names no context length
# Prefill chunk size on the CPU: rows x columns x parameters per chunk. A chunk runs
# to its end before Ctrl-C is seen. Measured on SmolLM2-135M (float32, OpenBLAS, 2 cores
# shared ~5x): Ctrl-C during a 2,700-token prefill exited 3.7 s after the signal with
# 128-token chunks, 5.4 s with 256, 13-18 s with 512; prompt tokens/s was the same for
# 128 and 512-token chunks (and lower at 2048). 256 tokens of a 135M model: ~1 s idle.
CPU_CHUNK_WORK = 256 * 135e6
MIN_CPU_CHUNK = 16


def one_line(exc):
    """An exception as one line: all its lines joined (they often hold the details)."""
    text = " ".join(str(exc).split())
    if not text:
        return exc.__class__.__name__
    if len(text) > MAX_MESSAGE:
        text = text[: MAX_MESSAGE - 3] + "..."
    return text


def say(message, prefix="error:"):
    print(f"{prefix} {message}", file=sys.stderr, flush=True)


def read_stdin_once(cache={}):
    if "text" not in cache:
        cache["text"] = sys.stdin.read()
    return cache["text"]


def read_prompts(args):
    """``(sources, texts, inline_numbers, errors)``; unreadable or empty prompts go to ``errors``."""
    sources, texts, numbers, errors = [], [], [], []
    for i, text in enumerate(args.prompt):
        source = f"--prompt #{i + 1}"
        if text == "-":
            text, source = read_stdin_once(), "stdin"
        else:
            # mlx-lm unescapes these in --prompt; scripts rely on it.
            text = text.replace("\\n", "\n").replace("\\t", "\t")
        if not text.strip():
            errors.append(f"{source} is empty")
            continue
        sources.append(source)
        texts.append(text)
        numbers.append(i + 1)
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
        numbers.append(None)
    return sources, texts, numbers, errors


def make_prompt_tokens(tokenizer, text, args):
    """Token ids of one prompt, through the chat template unless it is ignored."""
    from .tokenizer_utils import encode_prompt

    if args.ignore_chat_template or not (tokenizer.has_chat_template or args.chat_template):
        return encode_prompt(tokenizer, text)
    messages = [{"role": "user", "content": text}]
    if args.system_prompt:
        messages.insert(0, {"role": "system", "content": args.system_prompt})
    prefill = args.prefill_response is not None
    if prefill:
        messages.append({"role": "assistant", "content": args.prefill_response})
    kwargs = dict(args.chat_template_kwargs)
    if args.chat_template:
        kwargs["chat_template"] = args.chat_template
    kwargs.update(add_generation_prompt=not prefill, continue_final_message=prefill)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return encode_prompt(tokenizer, rendered)


def context_length(model):
    """The model's context in tokens, from its config (``None`` when it names none)."""
    margs = getattr(model, "args", None)
    for key in ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"):
        value = getattr(margs, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def is_quantized(model):
    import mlx.nn as nn

    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) or hasattr(m, "dequantized")
               for _, m in model.named_modules())


def prefill_step(args, model, rows):
    """``--prefill-step-size``, or a default: 2048 on a GPU; on the CPU a chunk of a few
    seconds (a prefill chunk cannot be interrupted, so Ctrl-C waits for it)."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    if args.prefill_step_size is not None:
        return args.prefill_step_size
    if mx.default_device() != mx.cpu:
        return 2048
    params = sum(v.size for _, v in tree_flatten(model.parameters()))
    return max(MIN_CPU_CHUNK, min(2048, int(CPU_CHUNK_WORK / max(params, 1) / max(rows, 1))))


def blas_name():
    from . import _blas

    describe = getattr(_blas, "describe", None)
    if describe is not None:
        return describe()
    return _blas.loaded_path or "MLX's bundled BLAS"


class Run:
    """State of one CLI run, kept so that an error or Ctrl-C can report what finished."""

    def __init__(self):
        self.stage = "reading the arguments"
        self.outputs = None
        self.total = 0


def run(args, state):
    """Everything after argument parsing; returns the exit code."""
    check_args(args)
    state.stage = "checking the sampling values"
    from .sample_utils import make_sampler

    sampling = dict(temp=args.temp, top_p=0.0 if args.top_p == 1.0 else args.top_p,
                    min_p=args.min_p, min_tokens_to_keep=args.min_tokens_to_keep, top_k=args.top_k,
                    xtc_probability=args.xtc_probability, xtc_threshold=args.xtc_threshold)
    try:
        make_sampler(**sampling)
    except (ValueError, TypeError) as e:
        raise CliError(f"invalid sampling value: {one_line(e)}") from None
    state.stage = "reading the prompts"
    sources, texts, numbers, errors = read_prompts(args)
    for e in errors:
        say(e)
    if not texts:
        raise CliError("no usable prompts")
    state.stage = "opening the outputs"
    outputs = state.outputs = Outputs(args.output_dir, args.jsonl, args.verbose)

    import mlx.core as mx

    from .demo_models import smollm2_gguf_path
    from .utils import dequantize_model, load

    if args.seed is not None:
        mx.random.seed(args.seed)
    model_path = args.model if args.model else smollm2_gguf_path()
    state.stage = f"loading the model '{model_path}'"
    model, tokenizer = load(model_path, trust_remote_code=args.trust_remote_code)
    quantized = is_quantized(model)
    dequantize = args.dequantize if args.dequantize is not None else mx.default_device() == mx.cpu
    if quantized and dequantize:
        dequantize_model(model)
    weights = "float" if not quantized else "dequantized" if dequantize else "quantized"
    if quantized and args.dequantize is None:
        weights += " (default on " + ("the CPU)" if dequantize else "a GPU)")

    state.stage = "setting the stop tokens"
    try:
        if args.eos_token is not None:
            tokenizer.eos_token_ids = set()
            tokenizer.add_eos_token(args.eos_token)
        for token in args.extra_eos_token:
            tokenizer.add_eos_token(token)
    except ValueError as e:
        raise CliError(f"--eos-token/--extra-eos-token: {one_line(e)}") from None
    sampler = make_sampler(**sampling, xtc_special_tokens=tokenizer.encode("\n", add_special_tokens=False)
                           + sorted(tokenizer.eos_token_ids))

    state.stage = "preparing the prompts"
    limit = context_length(model)
    context = limit or FALLBACK_CONTEXT
    keep, prompts, limits, capped = [], [], [], False
    for k, (source, text) in enumerate(zip(sources, texts)):
        try:
            ids = make_prompt_tokens(tokenizer, text, args)
        except Exception as e:  # a template may raise for one prompt: reject that one only
            msg = f"prompt {source}: the chat template failed: {one_line(e)}"
            say(msg)
            errors.append(msg)
            continue
        room = context - len(ids)
        if not ids or room < 1:
            msg = (f"prompt {source} is empty after tokenization" if not ids else
                   f"prompt {source} has {len(ids)} tokens, over the model's context of {context}")
            say(msg)
            errors.append(msg)
            continue
        wanted = room if args.max_tokens == -1 else args.max_tokens
        capped |= args.max_tokens != -1 and wanted > room
        keep.append(k)
        prompts.append(ids)
        limits.append(min(wanted, room))
    if not prompts:
        raise CliError("no usable prompts")
    if capped:
        say(f"--max-tokens {args.max_tokens} capped so that prompt and output fit the model's "
            f"context of {context} tokens" + ("" if limit else " (assumed: the config names none)"),
            prefix="note:")
    if args.max_kv_size is not None:
        # A window covering the whole context is no limit; capping keeps the size an int32.
        args.max_kv_size = min(args.max_kv_size, context)
    outputs.assign([sources[k] for k in keep], [numbers[k] for k in keep])
    state.total = len(prompts)
    rows = min(args.batch_size, len(prompts))
    state.stage = "generating"
    stats = generate_all(args, model, tokenizer, prompts, limits, sampler, outputs,
                         prefill_step(args, model, rows))
    outputs.close()
    if args.verbose:
        print(f"Prompt: {stats.prompt_tokens} tokens, {stats.prompt_tps:.3f} tokens-per-sec")
        print(f"Generation: {stats.generation_tokens} tokens, {stats.generation_tps:.3f} tokens-per-sec")
        print(f"Peak memory: {stats.peak_memory:.3f} GB")
    if args.verbose is not False:
        say(f"{len(prompts)} prompts | prompt: {stats.prompt_tokens} tokens, "
            f"{stats.prompt_tps:.1f} tok/s | generation: {stats.generation_tokens} tokens, "
            f"{stats.generation_tps:.1f} tok/s | peak memory: {stats.peak_memory:.3f} GB | "
            f"weights: {weights} | BLAS: {blas_name()}", prefix="[summary]")
    return EXIT_SOME_FAILED if errors else EXIT_OK


def generate_all(args, model, tokenizer, prompts, limits, sampler, outputs, step_size):
    """Generate every prompt; each is handed to ``outputs`` the moment it finishes."""
    # generate before batch: batch.py imports generate.py, which imports batch.py last.
    from .generate import BatchStats, stream_batch_generate

    tokens = [[] for _ in prompts]
    stats = BatchStats()
    bar = None
    if not args.no_progress and args.verbose is not False:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), unit="prompt", file=sys.stderr, desc="generating",
                   mininterval=0.5, leave=False)
    start = time.perf_counter()
    try:
        for r in stream_batch_generate(model, tokenizer, prompts, limits, sampler=sampler,
                                       completion_batch_size=args.batch_size,
                                       prefill_step_size=step_size, max_kv_size=args.max_kv_size,
                                       stats=stats, logprobs=False):
            if r.finish_reason != "stop":
                tokens[r.index].append(r.token)
            if r.finish_reason is None:
                continue
            outputs.finish(r.index, tokenizer.decode(tokens[r.index]), len(prompts[r.index]),
                           len(tokens[r.index]), r.finish_reason)
            if bar is not None:
                rate = sum(map(len, tokens)) / max(time.perf_counter() - start, 1e-9)
                bar.set_postfix(tok_s=f"{rate:.1f}", refresh=False)
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return stats


def _finished(state):
    done = state.outputs.written if state.outputs is not None else 0
    return done, f"{done} of {state.total} prompts finished and were written"


def main(argv=None):
    """Run the CLI; returns the process exit code. Never raises (except SystemExit
    for --help)."""
    state = Run()
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN:  # as Python does: an ignored SIGINT stays ignored
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        args = build_parser().parse_args(argv)
        return run(args, state)
    except CliError as e:
        say(e)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        if state.outputs is not None:
            state.outputs.flush_pending()
        done, text = _finished(state)
        say(f"interrupted while {state.stage}" + (f": {text}" if state.total else ""))
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early (`... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_SOME_FAILED if _finished(state)[0] else EXIT_BAD_INPUT
    except Exception as e:  # anything unexpected: one line, traceback on request
        if os.environ.get(DEBUG_ENV, "") not in ("", "0"):
            import traceback

            traceback.print_exc()
        expected = isinstance(e, FileNotFoundError) or type(e).__name__ == "ModelLoadError"
        hint = "" if expected or os.environ.get(DEBUG_ENV, "") not in ("", "0") else \
            f" (set {DEBUG_ENV}=1 to see the traceback)"
        kind = "" if isinstance(e, (ValueError, FileNotFoundError)) else f"{e.__class__.__name__}: "
        done, text = _finished(state)
        say(f"{state.stage} failed: {kind}{one_line(e)}" + (f" [{text}]" if done else "") + hint)
        return EXIT_SOME_FAILED if done else EXIT_BAD_INPUT
    finally:
        if state.outputs is not None:
            try:
                state.outputs.close()
            except OSError:
                pass
        if previous is not None:  # None: a handler not installed from Python
            signal.signal(signal.SIGINT, previous)
