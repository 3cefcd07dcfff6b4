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

from ..models.context import context_length
from ..sched import capabilities
from .args import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_SOME_FAILED,
    CliError,
    build_parser,
    check_args,
    one_line,
    run_features,
    say,
)
from .model import (
    FALLBACK_CONTEXT,
    blas_name,
    join_group,
    load_model,
    set_stop_tokens,
    tokenize_prompts,
)
from .output_files import Outputs

DEBUG_ENV = "MLX_LM_BATCHED_DEBUG"


def read_stdin():
    """The text of ``--prompt -`` (check_args allows it once)."""
    return sys.stdin.read()


def read_prompts(args):
    """``(sources, texts, inline_numbers, errors)``; unreadable or empty prompts go to ``errors``."""
    sources, texts, numbers, errors = [], [], [], []
    for i, text in enumerate(args.prompt):
        source = f"--prompt #{i + 1}"
        if text == "-":
            text, source = read_stdin(), "stdin"
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


class Run:
    """State of one CLI run, kept so that an error or Ctrl-C can report what finished."""

    def __init__(self):
        self.stage = "reading the arguments"
        self.outputs = None
        self.total = 0


def run(args, state):
    """Everything after argument parsing; returns the exit code."""
    args = check_args(args)  # from here on a read-only RunConfig
    state.stage = "checking the sampling values"
    from ..sampling.samplers import make_sampler

    sampling = dict(temp=args.temp, top_p=0.0 if args.top_p == 1.0 else args.top_p,
                    min_p=args.min_p, min_tokens_to_keep=args.min_tokens_to_keep, top_k=args.top_k,
                    xtc_probability=args.xtc_probability, xtc_threshold=args.xtc_threshold)
    try:
        make_sampler(**sampling)
    except (ValueError, TypeError) as e:
        raise CliError(f"invalid sampling value: {one_line(e)}") from None
    state.stage = "joining the distributed group"
    args = join_group(args)
    refused = capabilities.refusal(run_features(args, args.group), "cli")
    if refused:
        raise CliError(refused)
    state.stage = "reading the prompts"
    sources, texts, numbers, errors = read_prompts(args)
    for e in errors:
        say(e)
    if not texts:
        raise CliError("no usable prompts")
    prefix = None
    if args.prompt_cache_file is not None:
        state.stage = "reading the prompt cache file"
        from .prompt_cache_file import load_cache_file

        prefix, args = load_cache_file(args)
    state.stage = "opening the outputs"
    outputs = state.outputs = Outputs(args.output_dir, args.jsonl, args.verbose)

    if args.seed is not None:
        import mlx.core as mx

        mx.random.seed(args.seed)
    model_path = args.model
    if not model_path:
        from ..loading.demo_models import smollm2_gguf_path

        model_path = smollm2_gguf_path()
    state.stage = f"loading the model '{model_path}'"
    model, tokenizer, weights = load_model(model_path, args, args.adapter_path)
    draft = None
    if args.draft_model:
        state.stage = f"loading the draft model '{args.draft_model}'"
        draft = load_model(args.draft_model, args)[0]
    state.stage = "setting the stop tokens"
    set_stop_tokens(tokenizer, args)
    sampler = make_sampler(**sampling, xtc_special_tokens=tokenizer.encode("\n", add_special_tokens=False)
                           + sorted(tokenizer.eos_token_ids))

    state.stage = "preparing the prompts"
    limit = context_length(model)
    context = limit or FALLBACK_CONTEXT
    keep, prompts, limits, capped = tokenize_prompts(tokenizer, sources, texts, context, args, errors)
    if not prompts:
        raise CliError("no usable prompts")
    if capped:
        say(f"--max-tokens {args.max_tokens} capped so that prompt and output fit the model's "
            f"context of {context} tokens" + ("" if limit else " (assumed: the config names none)"),
            prefix="note:")
    if args.max_kv_size is not None:
        # A window covering the whole context is no limit; capping keeps the size an int32.
        args = args.with_(max_kv_size=min(args.max_kv_size, context))
    outputs.assign([sources[k] for k in keep], [numbers[k] for k in keep])
    state.total = len(prompts)
    state.stage = "generating"
    from .generate_plan import generate_plan

    plan = generate_plan(args, model, tokenizer, prompts, limits, sampler, prefix, draft)
    if args.group is None:
        stats = generate_all(args, model, plan, outputs)
    else:  # a lost or stalled rank ends the run with an error instead of a hang
        from ..parallel.group import STEP_TIMEOUT, guard_collectives

        with guard_collectives(STEP_TIMEOUT, args.group) as guard:
            stats = generate_all(args, model, plan, outputs, guard.tick)
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


def generate_all(args, model, plan, outputs, tick=None):
    """Generate every request of ``plan`` (a :class:`~..api.batch_plan.BatchPlan`); each
    is handed to ``outputs`` the moment it finishes. ``tick`` (optional) is called
    after every generated token."""
    from ..api.batch import stream_batch_plan
    from ..sched.stats import BatchStats

    tokenizer = plan.tokenizer
    prompts = [r.prompt for r in plan.requests]
    tokens = [[] for _ in prompts]
    stats = BatchStats()
    bar = None
    if not args.no_progress and args.verbose is not False:
        from tqdm import tqdm

        bar = tqdm(total=len(prompts), unit="prompt", file=sys.stderr, desc="generating",
                   mininterval=0.5, leave=False)
    start = time.perf_counter()
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        # From here Ctrl-C raises KeyboardInterrupt between decode steps and prefill
        # chunks; main() reports it after the finished prompts were written.
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        for r in stream_batch_plan(model, plan, stats):
            if tick is not None:
                tick()
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

    def exit_now(signum, frame):
        # Until generation starts there is nothing to keep, and a KeyboardInterrupt
        # raised inside a C extension's import (mlx.core) aborts the process instead.
        say(f"interrupted while {state.stage}")
        os._exit(EXIT_INTERRUPTED)

    if previous is not signal.SIG_IGN:  # as Python does: an ignored SIGINT stays ignored
        signal.signal(signal.SIGINT, exit_now)
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
