"""Entry points of ``python -m mlx_lm_batched.<module>``: the Ctrl-C handler goes in
before anything heavy is imported, so an interrupt while MLX loads prints one line, and
a missing default model (no ``--model``, no demo wheel) ends in one ``error:`` line."""

import os
import signal
import sys


def _quiet_interrupt(signum, frame):
    sys.stderr.write("error: interrupted while starting\n")
    sys.stderr.flush()
    os._exit(130)


def run_generate():
    """``python -m mlx_lm_batched.generate``: run the command line and exit with its code.
    ``cli.generate.main`` installs its own handler once it starts; this one covers the
    imports before it (a SIGINT ignored by the shell, as for ``cmd &``, stays ignored)."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _quiet_interrupt)
    from .generate import main

    raise SystemExit(_exit_code(main))


def run_main(name):
    """``python -m mlx_lm_batched.<name>`` for the other command lines (``chat``,
    ``cache_prompt``, ``benchmark``, ``run_batch``): quiet Ctrl-C during the imports,
    then ``cli.<name>.main()``'s exit code."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _quiet_interrupt)
    import importlib

    module = importlib.import_module(f"{__package__}.{name}")
    raise SystemExit(_exit_code(module.main))


# What a command line returns for bad input (``cli.args.EXIT_BAD_INPUT``; not imported
# here: this module runs before anything heavy is loaded).
EXIT_BAD_INPUT = 2


def _exit_code(main):
    """``main()``'s exit code; the default model's missing wheel (which a command meets
    only when it needs that model, deep inside its run) becomes one line and exit 2."""
    from ..loading.demo_models import DemoModelMissing

    try:
        return main()
    except DemoModelMissing as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_BAD_INPUT
