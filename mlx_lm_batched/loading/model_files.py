"""Where a model's files are and what its JSON files say: a local directory or a Hugging
Face hub snapshot (``get_model_path``), ``config.json`` (``load_config``) and the EOS of
``generation_config.json``, each failure one ``ModelLoadError`` line naming the path."""

import json
import os
import warnings
from pathlib import Path

HUB_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.py",
    "tokenizer.model",
    "*.tiktoken",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]


class ModelLoadError(ValueError):
    """A model path, repo or file that cannot be loaded; the message says why."""


def get_model_path(path_or_hf_repo, revision=None):
    """Local directory for a model: the path itself, or a hub snapshot.

    Honours ``HF_HUB_OFFLINE``: an uncached repo then fails with a clear error
    instead of a network attempt.
    """
    path = Path(os.path.expanduser(path_or_hf_repo))
    if path.exists():
        return path
    if path_or_hf_repo.startswith((".", "/", "~")) or path_or_hf_repo.count("/") != 1:
        raise ModelLoadError(f"model path '{path_or_hf_repo}' does not exist")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(
            snapshot_download(path_or_hf_repo, revision=revision, allow_patterns=HUB_PATTERNS)
        )
    except LocalEntryNotFoundError:
        offline = os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0")
        why = "HF_HUB_OFFLINE is set" if offline else "the hub could not be reached"
        raise ModelLoadError(
            f"'{path_or_hf_repo}' is not a local path and is not in the Hugging Face cache ({why})"
        ) from None
    except HfHubHTTPError as e:
        raise ModelLoadError(f"cannot download '{path_or_hf_repo}': {str(e).splitlines()[0]}") from None


def load_config(model_path):
    """The model's ``config.json`` as a dict (``ModelLoadError`` naming the file if
    it is missing, unreadable, not JSON or not a JSON object)."""
    path = Path(model_path) / "config.json"
    if not path.exists():
        raise ModelLoadError(f"no config.json in '{model_path}': not a model directory")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f, object_hook=_untag_float)
    except (OSError, ValueError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ModelLoadError(f"cannot read '{path}': {one_line(e)}") from None
    if not isinstance(config, dict):
        raise ModelLoadError(f"'{path}' must hold a JSON object, got {type(config).__name__}")
    return config


# transformers writes a non-finite float as {"__float__": "Infinity"} (config.json stays
# JSON for every parser; e.g. Mamba-2's time_step_limit): read back as the float.
_FLOAT_TAGS = {"Infinity": float("inf"), "-Infinity": float("-inf"), "NaN": float("nan")}


def _untag_float(obj):
    if len(obj) == 1 and obj.get("__float__") in _FLOAT_TAGS:
        return _FLOAT_TAGS[obj["__float__"]]
    return obj


def one_line(error):
    """An exception's message on one line (callers often print only the first)."""
    return " ".join(str(error).split()) or type(error).__name__


def generation_eos(model_path):
    """``eos_token_id`` of ``generation_config.json``, or None (absent, or unusable:
    then a warning names the file and config.json's EOS is used)."""
    path = Path(model_path) / "generation_config.json"
    if not path.exists():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        warnings.warn(f"ignoring '{path}': {one_line(e)}", stacklevel=3)
        return None
    return data.get("eos_token_id") if isinstance(data, dict) else None


def hf_repo_to_path(hf_repo):
    """mlx-lm's name: the local snapshot directory of a Hugging Face repo."""
    return get_model_path(hf_repo)
