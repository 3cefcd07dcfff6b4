"""mlx-lm's ``mlx_lm.lora`` is not part of this package. Importing it, or running it with
``python -m``, stops with one line naming the alternative."""

import sys

MESSAGE = ("mlx_lm_batched does not train adapters: use mlx_lm.lora; its adapters load here with --adapter-path (load(..., adapter_path=...))")

# Under ``python -m`` (this module, or one below this package being located, when
# sys.argv[0] is still "-m"): the line alone, no traceback.
if __name__ == "__main__" or sys.argv[:1] == ["-m"]:
    sys.exit(MESSAGE)
raise ImportError(MESSAGE)
