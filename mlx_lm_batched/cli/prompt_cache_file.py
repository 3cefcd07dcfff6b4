"""``--prompt-cache-file`` of ``generate``: a prefix cached by ``cache_prompt`` (ours or
mlx-lm 0.32's) that every prompt of the run continues.

As in mlx-lm, the file's metadata names the model (``--model`` may be omitted, a
different one is an error) and the tokenizer settings; with a chat template each
prompt becomes the part of its rendered conversation after the user message's
start (what ``cache_prompt`` left open with ``continue_final_message``)."""

import json

from .args import CliError, one_line

QUERY = "<query>"  # placeholder whose position in the rendered template marks the suffix


def load_cache_file(args):
    """``(cache, config)`` of ``--prompt-cache-file``: ``config`` is ``args`` (a
    ``RunConfig``) with ``cached_prefix`` (the tokens the cache holds), and ``model`` and
    ``eos_token`` from the file's metadata where the command line leaves them out."""
    from ..cache.files import load_prompt_cache
    from ..cache.row_caches import cache_length

    try:
        cache, metadata = load_prompt_cache(args.prompt_cache_file, return_metadata=True)
    except (OSError, ValueError) as e:
        raise CliError(f"--prompt-cache-file: {one_line(e)}") from None
    saved_model = metadata.get("model")
    changes = {}
    if args.model is None:
        if saved_model is None:
            raise CliError(f"--prompt-cache-file '{args.prompt_cache_file}' names no model: "
                           "pass --model")
        changes["model"] = saved_model
    elif saved_model is not None and args.model != saved_model:
        raise CliError(f"--model '{args.model}' differs from the model the prompt cache was made "
                       f"with ('{saved_model}')")
    saved_adapter = metadata.get("adapter_path")
    adapter = getattr(args, "adapter_path", None)
    if (saved_adapter or adapter) and saved_adapter != (None if adapter is None else str(adapter)):
        # The cached keys and values depend on the adapter: another one would continue
        # them silently wrong.
        raise CliError(f"--adapter-path '{adapter}' differs from the adapter the prompt cache "
                       f"was made with ('{saved_adapter}')")
    try:
        tokenizer_config = json.loads(metadata.get("tokenizer_config", "{}"))
    except ValueError:
        raise CliError("--prompt-cache-file: its tokenizer_config metadata is not JSON") from None
    if args.eos_token is None and isinstance(tokenizer_config, dict):
        changes["eos_token"] = tokenizer_config.get("eos_token")
    if len(cache) and getattr(cache, "padding", None) is not None and any(cache.padding):
        raise CliError("--prompt-cache-file holds a padded batch of rows; it must hold one prompt")
    n = cache_length(cache)
    if n == 0:
        raise CliError(f"--prompt-cache-file '{args.prompt_cache_file}' is empty")
    return cache, args.with_(cached_prefix=n, **changes)


def suffix_tokens(tokenizer, text, args, kwargs):
    """Token ids of one prompt continuing the cached prefix: mlx-lm's rule, the rendered
    conversation from where the user message's content starts."""
    if args.ignore_chat_template or not (tokenizer.has_chat_template or args.chat_template):
        return tokenizer.encode(text, add_special_tokens=False)
    messages = [{"role": "user", "content": text}]
    if args.system_prompt:
        messages.insert(0, {"role": "system", "content": args.system_prompt})
    prefill = args.prefill_response is not None
    if prefill:
        messages.append({"role": "assistant", "content": args.prefill_response})
    kwargs = dict(kwargs, add_generation_prompt=not prefill, continue_final_message=prefill)
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    messages[-1] = dict(messages[-1], content=QUERY)
    marked = tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    return tokenizer.encode(rendered[marked.index(QUERY):], add_special_tokens=False)
