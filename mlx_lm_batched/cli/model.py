"""The CLI's model side: loading (dequantized or not), stop tokens, prompt tokens
through the chat template, the context cap and the prefill chunk size."""

from .args import CliError, one_line, say

FALLBACK_CONTEXT = 131072  # when a config names no context length
# Prefill chunk size on the CPU: rows x columns x parameters per chunk. A chunk runs
# to its end before Ctrl-C is seen. Measured on SmolLM2-135M (float32, OpenBLAS, 2 cores
# shared ~5x): Ctrl-C during a 2,700-token prefill exited 3.7 s after the signal with
# 128-token chunks, 5.4 s with 256, 13-18 s with 512; prompt tokens/s was the same for
# 128 and 512-token chunks (and lower at 2048). 256 tokens of a 135M model: ~1 s idle.
CPU_CHUNK_WORK = 256 * 135e6
MIN_CPU_CHUNK = 16


def load_model(model_path, args, adapter_path=None):
    """``(model, tokenizer, weights)``; ``weights`` says, for the summary, whether a
    quantized model was kept as stored (the default, as ``load`` and the server keep it)
    or dequantized (``--dequantize``): ``loading.dequantize.weights_for_device``. The
    choice never depends on the number of prompts, so a prompt gets the same tokens alone
    as with others, and as from the Python API. ``adapter_path``: an
    adapter directory applied to the model (``load``'s argument; not with
    ``--distributed``)."""
    from ..loading.dequantize import DequantizeDoesNotFit
    from ..parallel.load import load_for_device

    group = getattr(args, "group", None)
    if adapter_path and group is not None:
        raise CliError("--adapter-path cannot be combined with --distributed yet: fuse the "
                       "adapter first (python -m mlx_lm_batched.fuse)")
    try:
        return load_for_device(model_path, args.dequantize, group,
                               getattr(args, "distributed", "auto"),
                               trust_remote_code=args.trust_remote_code, adapter_path=adapter_path)
    except DequantizeDoesNotFit as e:  # load's own errors keep the "loading the model" stage
        raise CliError(one_line(e)) from None


def join_group(config):
    """``--distributed``: ``config`` with its ``group`` (None: a single process). On ranks
    other than 0 stdout and stderr go to /dev/null and no output files are written: rank
    0 does the I/O. Every rank gets rank 0's seed, so sampling agrees."""
    import os
    import sys

    from ..parallel.group import group_for, shared_seed

    try:
        group = group_for(getattr(config, "distributed", "auto"))
    except (ValueError, NotImplementedError) as e:
        raise CliError(f"--distributed {config.distributed}: {one_line(e)}") from None
    if group is None:
        return config.with_(group=None)
    changes = {"group": group, "seed": shared_seed(group, config.seed)}
    if group.rank() != 0:
        null = os.open(os.devnull, os.O_WRONLY)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
            os.dup2(null, stream.fileno())
        changes.update(output_dir=None, jsonl=None, no_progress=True)
    return config.with_(**changes)


def set_stop_tokens(tokenizer, args):
    """Apply ``--eos-token`` (replaces the stop set) and ``--extra-eos-token`` (adds)."""
    try:
        if args.eos_token is not None:
            tokenizer.eos_token_ids = set()
            tokenizer.add_eos_token(args.eos_token)
        for token in args.extra_eos_token:
            tokenizer.add_eos_token(token)
    except ValueError as e:
        raise CliError(f"--eos-token/--extra-eos-token: {one_line(e)}") from None


def make_prompt_tokens(tokenizer, text, args):
    """Token ids of one prompt, through the chat template unless it is ignored."""
    from ..tokenization.tokenizer import encode_prompt

    if args.ignore_chat_template or not (tokenizer.has_chat_template or args.chat_template):
        if getattr(args, "cached_prefix", 0):  # the cached prefix holds the BOS already
            return tokenizer.encode(text, add_special_tokens=False)
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
    if getattr(args, "cached_prefix", 0):
        from .prompt_cache_file import suffix_tokens

        return suffix_tokens(tokenizer, text, args, kwargs)
    kwargs.update(add_generation_prompt=not prefill, continue_final_message=prefill)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return encode_prompt(tokenizer, rendered)


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
    step = max(MIN_CPU_CHUNK, min(2048, int(CPU_CHUNK_WORK / max(params, 1) / max(rows, 1))))
    group = getattr(args, "group", None)
    if group is not None:
        # Every rank must cut the prompt into the same chunks (each chunk runs the
        # collectives once), though each holds a different share of the parameters.
        step = mx.distributed.all_min(mx.array(step), group=group, stream=mx.cpu).item()
    return step


def blas_name():
    from .. import _blas

    describe = getattr(_blas, "describe", None)
    if describe is not None:
        return describe()
    return _blas.loaded_path or "MLX's bundled BLAS"


def tokenize_prompts(tokenizer, sources, texts, context, args, errors):
    """Token ids and max_tokens per usable prompt: ``(kept indices, prompts, limits,
    capped)``. A prompt its chat template fails on, or that fills the context, is
    reported, appended to ``errors`` and skipped. ``max_tokens`` is capped so that
    prompt and output fit ``context`` (``capped`` says whether it was)."""
    keep, prompts, limits, capped = [], [], [], False
    for k, (source, text) in enumerate(zip(sources, texts)):
        try:
            ids = make_prompt_tokens(tokenizer, text, args)
        except Exception as e:  # a template may raise for one prompt: reject that one only
            msg = f"prompt {source}: the chat template failed: {one_line(e)}"
            say(msg)
            errors.append(msg)
            continue
        room = context - len(ids) - getattr(args, "cached_prefix", 0)
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
    return keep, prompts, limits, capped
