"""A checkpoint's own architecture file (``config.json``'s ``model_file``), mlx-lm's
opt-in: loading one runs that file's Python, so it happens only with
``trust_remote_code=True``; without it a config that names one is refused with one line.
"""

import importlib.util
from pathlib import Path


def model_file_classes(model_path, config, trust_remote_code):
    """``(Model, ModelArgs)`` of ``config['model_file']`` (a file in ``model_path``), or
    None when the config names no such file. Raises ``ValueError`` naming
    ``trust_remote_code`` when it is not set, and for a file that is missing or lacks
    the two names."""
    model_file = config.get("model_file")
    if model_file is None:
        return None
    if not trust_remote_code:
        raise ValueError(f"{model_path}: config.json names model_file {model_file!r}, a "
                         "Python file that builds the architecture; running it is off by "
                         "default: pass trust_remote_code=True if you trust this checkpoint")
    path = Path(model_path) / str(model_file)
    if not path.is_file():
        raise ValueError(f"{model_path}: model_file {model_file!r} does not exist")
    spec = importlib.util.spec_from_file_location(f"model_file_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [n for n in ("Model", "ModelArgs") if not hasattr(module, n)]
    if missing:
        raise ValueError(f"{path}: model_file defines no {' or '.join(missing)}")
    return module.Model, module.ModelArgs
