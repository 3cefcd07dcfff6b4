"""Entry points of ``python -m mlx_lm_batched.<module>``: the Ctrl-C handler goes in
before anything heavy is imported, so an interrupt while MLX loads prints one line."""

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

    raise SystemExit(main())


def run_main(name):
    """``python -m mlx_lm_batched.<name>`` for the other command lines (``chat``,
    ``cache_prompt``, ``benchmark``, ``run_batch``): quiet Ctrl-C during the imports,
    then ``cli.<name>.main()``'s exit code."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _quiet_interrupt)
    import importlib

    module = importlib.import_module(f"{__package__}.{name}")
    raise SystemExit(module.main())
