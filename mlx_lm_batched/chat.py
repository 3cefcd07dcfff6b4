"""mlx-lm's ``mlx_lm.chat``: ``python -m mlx_lm_batched.chat`` runs the chat REPL
(``cli/chat.py``)."""

if __name__ == "__main__":
    from .cli.entry import run_main

    run_main("chat")

from .cli.chat import build_parser as setup_arg_parser, main

__all__ = ["main", "setup_arg_parser"]
