"""``python -m mlx_lm_batched <command> [flags]``: mlx-lm's ``python -m mlx_lm`` (its
``mlx_lm`` console command) dispatcher. ``python -m mlx_lm_batched generate --prompt hi``
runs ``python -m mlx_lm_batched.generate --prompt hi``; mlx-lm's commands this package
does not have (training, quantization methods, Hub tools, ``evaluate``) stop with one
line naming the alternative."""

import importlib
import sys

# Commands of cli/ (run as ``python -m mlx_lm_batched.<command>`` runs them).
CLI = ("benchmark", "cache_prompt", "chat", "convert", "fuse", "generate", "perplexity",
       "run_batch")
# mlx-lm's commands this package refuses: importing the module says why, in one line.
ABSENT = {"lora": "lora", "manage": "manage", "upload": "upload", "share": "share",
          "awq": "quant", "dwq": "quant", "dynamic_quant": "quant", "gptq": "quant"}
COMMANDS = sorted(CLI + ("server",) + tuple(ABSENT))
EVALUATE = ("mlx_lm_batched has no evaluate command (lm-eval harness): use mlx_lm.evaluate; "
            "models converted here load there")


def main(argv=None):
    """Run ``argv[0]``'s command with the rest of ``argv`` (default ``sys.argv[1:]``)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: python -m mlx_lm_batched <command> [flags]; commands: "
              f"{', '.join(COMMANDS)}. Pass --help to a command for its flags.")
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name == "--version":
        from . import __version__

        print(__version__)
        return 0
    if name == "evaluate":
        sys.exit(EVALUATE)
    if name not in COMMANDS:
        sys.exit(f"error: unknown command '{name}' (commands: {', '.join(COMMANDS)})")
    sys.argv = [f"mlx_lm_batched.{name}"] + rest  # the command parses sys.argv[1:]
    if name in ABSENT:
        try:
            importlib.import_module(f"{__package__}.{ABSENT[name]}")
        except ImportError as e:
            sys.exit(str(e))
    if name == "server":
        return importlib.import_module(f"{__package__}.server.__main__").main()
    from .cli.entry import run_main

    run_main(name)  # quiet Ctrl-C while loading, then cli.<name>.main()'s exit code


if __name__ == "__main__":
    raise SystemExit(main())
