"""Tensor and pipeline parallelism on the real models over 2 local ranks (``mlx.launch
--backend ring -n 2``) against the single-process model. Tensor: SmolLM2 (9 heads, 3 KV
heads: uneven KV groups) float32 and 4-bit, Gemma 3 (1 KV head: replicated, its query heads
split). Pipeline: SmolLM2 and Gemma 3 float32 split by layers. All of these run in one
launch of ``tests/dist_worker.py`` per rank, one check after the other; rank 0 compares
and writes a JSON result per check. Also: a rank that dies or stalls, and the generate CLI
under ``mlx.launch``."""

import json
import subprocess
import sys

import pytest

from conftest import model_dir, subprocess_env
from distributed_harness import (TIMEOUT, assert_tensor_parallel_result, launch, launch_by_hand,
                                 launcher, run_group)


# name: (model, convert options, rank 0's query heads after sharding and before, mode)
TENSOR = {
    # KV heads [0, 2) of 3: uneven groups
    "smollm2-float32": ("smollm2", dict(dtype="float32"), [6, 9], "tensor"),
    # 1 KV head, replicated; queries split
    "gemma3-float32": ("gemma3", dict(dtype="float32"), [2, 4], "tensor"),
    # 4-bit: split in whole quantization groups (MLX's CPU quantized matmul is slow: no joins)
    "smollm2-4bit": ("smollm2", dict(quantize=True, q_bits=4, q_group_size=64), [6, 9],
                     "tensor-quick"),
}
PIPELINE = {  # name: (model, layers, mode), float32
    "smollm2": ("smollm2", 30, "pipeline"),  # tied embeddings: on the first and the last stage
    # sliding-window layers (rotating caches) on both stages
    "gemma3": ("gemma3", 18, "pipeline-quick"),
}
PIPELINE_CHECKS = ["padded logits", "greedy tokens", "rows joining BatchGenerator",
                   "greedy tokens, rotating caches"]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """Every tensor and pipeline check above in one 2-rank launch (``dist_worker.py plan``):
    each rank imports the package and joins the ring once, not once per check.
    ``(results by plan name, the launch's output)``."""
    plan = [[f"tensor {name}", mode, str(model_dir(model, **options))]
            for name, (model, options, _, mode) in TENSOR.items()]
    plan += [[f"pipeline {name}", mode, str(model_dir(model, dtype="float32"))]
             for name, (model, _, mode) in PIPELINE.items()]
    path = tmp_path_factory.mktemp("plan") / "plan.json"
    path.write_text(json.dumps(plan))
    data, out, _ = launch("plan", path, timeout=len(plan) * TIMEOUT)
    assert data is not None, out[-3000:]
    assert sorted(data) == sorted(name for name, _, _ in plan)
    return data, out


@pytest.mark.slow
@pytest.mark.parametrize("name", TENSOR)
def test_tensor_parallel_real_models(name, launched):
    data, out = launched
    assert_tensor_parallel_result(data[f"tensor {name}"], out, TENSOR[name][2], TENSOR[name][3])


@pytest.mark.slow
@pytest.mark.parametrize("name", PIPELINE)
def test_pipeline_parallel_real_models(name, launched):
    _, layers, mode = PIPELINE[name]
    data = launched[0][f"pipeline {name}"]
    assert "failure" not in data, data.get("failure")
    half = layers // 2
    # Each rank holds half the blocks, and caches for those only.
    assert data["layers"] == [[0, half, half], [half, layers, layers - half], layers]
    assert data["passed"] == (PIPELINE_CHECKS if mode == "pipeline" else PIPELINE_CHECKS[:2])
    mine, whole = data["bytes"]
    assert mine < whole  # rank 0 materialised only its share of the weights


LOST = ("[rank 0] error: lost a peer of the distributed group",
        # A send queued in the background (mx.async_eval) may fail on MLX's ring thread
        # without raising in Python ("Failing pending tasks"): then the watchdog ends the
        # run (seen in pipeline mode, and once in tensor mode on a loaded machine).
        "[rank 0] error: no progress from the distributed group for 10 s")


@pytest.mark.slow
@pytest.mark.parametrize("mode,message", [
    ("die", LOST),
    ("stall", "[rank 0] error: no progress from the distributed group for 10 s"),
    ("pipeline-die", LOST),
])
def test_lost_rank_makes_the_other_exit_with_a_clear_error(mode, message, tmp_path):
    status, out, seconds = launch_by_hand(mode, model_dir("smollm2", dtype="float32"),
                                          tmp_path, timeout=150)
    assert status == 1, out[-3000:]
    messages = message if isinstance(message, tuple) else (message,)
    assert any(m in out for m in messages), out[-3000:]
    assert not (tmp_path / "result.json").exists()  # rank 0 did not carry on as if all was well


@pytest.fixture(scope="module")
def cli_prompts(tmp_path_factory):
    """Prompt files, the CLI arguments and the single-process run's result."""
    d = tmp_path_factory.mktemp("cli")
    for name, text in (("a.txt", "The capital of France is"), ("b.txt", "Write a haiku.")):
        (d / name).write_text(text)
    args = ["-m", "mlx_lm_batched.generate", "--model", str(model_dir("smollm2", dtype="float32")),
            "--prompts", "a.txt", "b.txt", "--max-tokens", "6", "--no-progress"]
    return d, args, run_group([sys.executable, *args], TIMEOUT, cwd=d)


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--distributed", "pipeline"]])
def test_cli_under_mlx_launch_prints_once_and_matches_one_process(cli_prompts, flags):
    cwd, args, solo = cli_prompts
    ranks = run_group([*launcher(), sys.executable, *args, *flags], TIMEOUT, cwd=cwd)
    assert solo[0] == 0 and ranks[0] == 0, ranks[2][-2000:]
    assert solo[1].count("==== a.txt ====") == 1
    assert ranks[1] == solo[1]  # rank 1 printed nothing, rank 0 the same texts
    assert ranks[2].count("[summary]") == 1


@pytest.mark.parametrize("mode,message", [
    ("tensor", "--distributed tensor: tensor parallelism needs more than one rank"),
    ("pipeline", "--distributed pipeline: pipeline parallelism needs more than one rank"),
])
def test_cli_distributed_flag_errors(mode, message):
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.generate", "--prompt", "hi",
                           "--distributed", mode], capture_output=True, text=True, timeout=60,
                          env=subprocess_env())
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
