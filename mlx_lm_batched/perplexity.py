"""mlx-lm's ``mlx_lm.perplexity`` is not part of this package. Importing it, or running it with
``python -m``, stops with one line naming the alternative."""

import sys

MESSAGE = ("mlx_lm_batched has no perplexity command: use mlx_lm.perplexity (models converted here load there)")

# Under ``python -m`` (this module, or one below this package being located, when
# sys.argv[0] is still "-m"): the line alone, no traceback.
if __name__ == "__main__" or sys.argv[:1] == ["-m"]:
    sys.exit(MESSAGE)
raise ImportError(MESSAGE)
