"""Tensor and pipeline parallelism over 2 local ranks (``mlx.launch --backend ring -n 2``)
against the single-process model. Tensor: real SmolLM2 (9 heads, 3 KV heads: uneven KV
groups) float32 and 4-bit, real Gemma 3 (1 KV head: replicated, its query heads split),
and tiny random DeepSeek V3 (MLA + MoE experts + shared experts) and Qwen 2 MoE (GQA with
3 KV heads, experts, shared expert) checkpoints. Pipeline: real SmolLM2 and Gemma 3
float32 split by layers. Each run is one ``tests/dist_worker.py`` per rank; rank 0
compares and writes a JSON result."""

import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import arch_harness
import mlx_lm_oracle
from conftest import model_dir
from test_arch_minicpm3_minimax import MINIMAX
from test_arch_mlxlm_oracle import BAICHUAN_M1, normalised_head
from test_arch_recurrent import (FALCON_H1, GRANITE_HYBRID, JAMBA, KIMI_LINEAR, LFM2, MAMBA,
                                 NEMOTRON_H, QWEN3_5, QWEN3_NEXT, RECURRENT_GEMMA)
from test_arch_muse_spark_kimi_k3 import KIMI_K3

WORKER = Path(__file__).parent / "dist_worker.py"
TIMEOUT = 240
def launcher():
    """``mlx.launch`` on 2 local ring ranks, starting at a port free now (not the fixed
    default, which a concurrent run could hold)."""
    port = str(_free_ports(1)[0])
    return [LAUNCH, "-n", "2", "--backend", "ring", "--starting-port", port, "--"]


# The mlx wheel's launcher, beside this interpreter (a venv need not be on PATH).
_BESIDE = Path(sys.executable).with_name("mlx.launch")
LAUNCH = str(_BESIDE) if _BESIDE.exists() else shutil.which("mlx.launch") or "mlx.launch"


def run_group(cmd, timeout, **kwargs):
    """Run ``cmd`` in a session of its own; on timeout kill the whole session (the launcher
    and its ranks), so no rank outlives the test."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)), **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return proc.returncode, out, err


def launch(mode, directory, timeout=TIMEOUT):
    """Run the worker on 2 ring ranks; ``(result dict or None, output, seconds)``."""
    with tempfile.TemporaryDirectory() as d:
        result = Path(d) / "result.json"
        cmd = [*launcher(), sys.executable, str(WORKER), mode, str(directory), str(result)]
        tic = time.monotonic()
        _, out, err = run_group(cmd, timeout)
        data = json.loads(result.read_text()) if result.exists() else None
        return data, out + err, time.monotonic() - tic


def assert_tensor_parallel_exact(directory, heads, mode="tensor"):
    data, out, _ = launch(mode, directory)
    assert data is not None, out[-3000:]
    assert "failure" not in data, data.get("failure")
    assert data["size"] == 2
    checks = ["padded logits", "greedy tokens", "rows joining BatchGenerator"]
    assert data["passed"] == (checks if mode == "tensor" else checks[:2])
    assert data["heads"] == heads  # rank 0's query heads after sharding, and before


@pytest.mark.parametrize("name,options,heads,mode", [
    ("smollm2", dict(dtype="float32"), [6, 9], "tensor"),  # KV heads [0, 2) of 3: uneven groups
    ("gemma3", dict(dtype="float32"), [2, 4], "tensor"),  # 1 KV head, replicated; queries split
    # 4-bit: split in whole quantization groups (MLX's CPU quantized matmul is slow: no joins)
    ("smollm2", dict(quantize=True, q_bits=4, q_group_size=64), [6, 9], "tensor-quick"),
])
def test_tensor_parallel_real_models(name, options, heads, mode):
    assert_tensor_parallel_exact(model_dir(name, **options), heads, mode)


PIPELINE_CHECKS = ["padded logits", "greedy tokens", "rows joining BatchGenerator",
                   "greedy tokens, rotating caches"]


@pytest.mark.parametrize("name,layers,mode", [
    ("smollm2", 30, "pipeline"),  # tied embeddings: on the first and the last stage
    ("gemma3", 18, "pipeline-quick"),  # sliding-window layers (rotating caches) on both stages
])
def test_pipeline_parallel_real_models(name, layers, mode):
    data, out, _ = launch(mode, model_dir(name, dtype="float32"))
    assert data is not None, out[-3000:]
    assert "failure" not in data, data.get("failure")
    half = layers // 2
    # Each rank holds half the blocks, and caches for those only.
    assert data["layers"] == [[0, half, half], [half, layers, layers - half], layers]
    assert data["passed"] == (PIPELINE_CHECKS if mode == "pipeline" else PIPELINE_CHECKS[:2])
    mine, whole = data["bytes"]
    assert mine < whole  # rank 0 materialised only its share of the weights


TINY = {
    "deepseek_v3": (dict(vocab_size=arch_harness.VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=3,
                         max_position_embeddings=256, kv_lora_rank=16, q_lora_rank=24,
                         qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12,
                         moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                         n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1),
                    [2, 3]),
    "qwen2_moe": (dict(vocab_size=arch_harness.VOCAB, hidden_size=48, intermediate_size=96,
                       num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=3,
                       max_position_embeddings=256, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=48),
                  [4, 6]),
}


@pytest.mark.parametrize("model_type", sorted(TINY))
def test_tensor_parallel_tiny_moe_and_mla(model_type, tmp_path):
    config, heads = TINY[model_type]
    hf = arch_harness.build_hf_model(model_type, config)
    arch_harness.save_hf_model(hf, tmp_path, "transformers5")
    _tiny_tokenizer(tmp_path)
    assert_tensor_parallel_exact(tmp_path, heads)


# Tiny recurrent and hybrid checkpoints (configs of tests/test_arch_recurrent.py and
# test_arch_minicpm3_minimax.py), some reshaped so 2 ranks split them unevenly or share a
# group: name -> (model_type, config, rank 0's state-cache shapes after a prefill of 2 rows
# (None: only "smaller than whole")).
RECURRENT = {
    # 6 heads in 3 B/C groups: rank 0 gets 2 whole groups (4 heads), rank 1 one.
    "mamba2": ("mamba2", dict(MAMBA, hidden_size=48, num_heads=6, head_dim=16, n_groups=3),
               [[2, 3, 96], [2, 4, 16, 8]] * 2),  # conv: 4*16 x + 2*8 B + 2*8 C channels
    # Gated delta (fused projections) + gated attention + MoE with a shared expert; one
    # key head (replicated on both ranks), its 3 value heads split 2 / 1.
    "qwen3_next": ("qwen3_next", dict(QWEN3_NEXT, linear_num_key_heads=1,
                                      linear_num_value_heads=3), [[2, 3, 32], [2, 2, 8, 8]] * 2),
    # Separate projections; 2 key heads with 2 value heads each: one key head per rank.
    "qwen3_5": ("qwen3_5_text", QWEN3_5, [[2, 3, 32], [2, 2, 8, 8]] * 2),
    "lfm2": ("lfm2", LFM2, [[2, 2, 32]] * 2),  # short conv by channels
    # Mamba-2, attention, ReLU² MLP and latent MoE blocks (latent projections whole).
    "nemotron_h": ("nemotron_h", dict(NEMOTRON_H, moe_latent_size=32), [[2, 3, 48], [2, 4, 8, 8]]),
    "minimax": ("minimax", MINIMAX, [[2, 2, 16, 16]] * 2),  # lightning: 4 heads split 2 / 2
    # One B/C group of 8 heads: split 4 / 4, the gated norm sums over the ranks.
    "granitemoehybrid": ("granitemoehybrid", dict(GRANITE_HYBRID, mamba_n_groups=1), None),
    "falcon_h1": ("falcon_h1", dict(FALCON_H1, mamba_rms_norm=True), None),
    "mamba": ("mamba", MAMBA, [[2, 3, 64], [2, 64, 8]] * 2),  # Mamba 1: by channels
    "kimi_linear": ("kimi_linear", KIMI_LINEAR, None),
    "recurrent_gemma": ("recurrent_gemma", RECURRENT_GEMMA, None),
    "jamba": ("jamba", JAMBA, None),
    # 4-bit conversions (groups of 32): every projection splits on whole groups.
    "mamba2-q4": ("mamba2", dict(MAMBA, num_heads=8, head_dim=16, n_groups=2), None),
    "lfm2-q4": ("lfm2", LFM2, [[2, 2, 32]] * 2),
    # Key/value convolution per KV head (mlx-lm's module as the builder): 2 KV heads on
    # every layer, one per rank, with its taps.
    "baichuan_m1": ("baichuan_m1", dict(BAICHUAN_M1, num_swa_attention_heads=4,
                                        num_swa_key_value_heads=2), [[2, 1, 16]] * 6),
    # KDA (full-rank gates) by heads, latent attention with per-feature gates, attention
    # residuals and a latent MoE (mlx-lm's module as the builder): 4 heads split 2 / 2.
    "kimi_k3": ("kimi_k3", KIMI_K3, [[2, 3, 96], [2, 2, 16, 16]] * 3),
}
# Families transformers has no model for: mlx-lm's module builds and saves the checkpoint.
MLX_LM_BUILT = {"baichuan_m1": normalised_head, "kimi_k3": lambda model: None}


def test_tensor_parallel_recurrent_and_hybrid_models(tmp_path):
    """One launch for every family: padded logits, greedy tokens and rows joining a
    running BatchGenerator equal one process; each rank's state caches hold its heads."""
    from mlx_lm_batched import convert

    models = tmp_path / "models"
    for name, (model_type, config, _) in RECURRENT.items():
        directory = tmp_path / name if name.endswith("-q4") else models / name
        if model_type in MLX_LM_BUILT:
            ref = mlx_lm_oracle.build_mlx_lm_model(model_type, config)
            MLX_LM_BUILT[model_type](ref)
            directory.mkdir(parents=True)
            mlx_lm_oracle.save_mlx_lm_model(ref, dict(config, model_type=model_type), directory,
                                            "transformers5")
        else:
            arch_harness.save_hf_model(arch_harness.build_hf_model(model_type, config),
                                       directory, "transformers5")
        _tiny_tokenizer(directory)
        if name.endswith("-q4"):
            convert(str(directory), str(models / name), quantize=True, q_group_size=32, q_bits=4)
    data, out, _ = launch("many", models, timeout=TIMEOUT)
    assert data is not None, out[-3000:]
    assert data["size"] == 2 and sorted(data["models"]) == sorted(RECURRENT)
    for name, (_, _, shapes) in RECURRENT.items():
        entry = data["models"][name]
        assert "failure" not in entry, f"{name}: {entry['failure']}"
        assert entry["passed"] == ["padded logits", "greedy tokens", "rows joining BatchGenerator"]
        sharded, whole = entry["states"]
        assert len(sharded) == len(whole) > 0, name
        for a, b in zip(sharded, whole):  # same kinds of arrays, this rank's part of each
            assert len(a) == len(b) and a[0] == b[0] and 0 < math.prod(a) < math.prod(b), name
        if shapes is not None:
            assert sharded == shapes, name


def _tiny_tokenizer(directory):
    """A byte-level tokenizer so ``load`` finds one (the worker feeds token ids)."""
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(arch_harness.VOCAB)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, "t0")),
                                  eos_token="t1", unk_token="t0")
    tok.save_pretrained(directory)


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def launch_by_hand(mode, directory, tmp_path, timeout):
    """Start the 2 ring ranks ourselves (what ``mlx.launch`` does: a hostfile and
    ``MLX_RANK``), so a dying rank is not cleaned up by the launcher: rank 0 must notice
    on its own. Returns rank 0's ``(exit status, output, seconds)``."""
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in _free_ports(2)]))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), MLX_HOSTFILE=str(hostfile))
    cmd = [sys.executable, str(WORKER), mode, str(directory), str(tmp_path / "result.json")]
    tic = time.monotonic()
    ranks = [subprocess.Popen(cmd, env=dict(env, MLX_RANK=str(r)), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(2)]
    try:
        out, _ = ranks[0].communicate(timeout=timeout)
        return ranks[0].returncode, out, time.monotonic() - tic
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
            p.communicate()


@pytest.mark.parametrize("mode,message", [
    ("die", "[rank 0] error: lost a peer of the distributed group"),
    ("stall", "[rank 0] error: no progress from the distributed group for 10 s"),
    # A send queued in the background (mx.async_eval) may fail on MLX's ring thread without
    # raising in Python ("Failing pending tasks"): then the watchdog ends the run.
    ("pipeline-die", ("[rank 0] error: lost a peer of the distributed group",
                      "[rank 0] error: no progress from the distributed group for 10 s")),
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
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_head_ranges_cover_every_query_head_once():
    from mlx_lm_batched.parallel.tensor import head_ranges

    # SmolLM2 (9 heads, 3 KV) over 2 ranks: whole KV groups, uneven.
    assert [head_ranges(9, 3, 2, r) for r in range(2)] == [((0, 6), (0, 2)), ((6, 9), (2, 3))]
    # Gemma 3 270M (4 heads, 1 KV) over 2 ranks: the KV head on both, query heads split.
    assert [head_ranges(4, 1, 2, r) for r in range(2)] == [((0, 2), (0, 1)), ((2, 4), (0, 1))]
    for heads, kv, size in ((8, 2, 4), (8, 2, 3), (12, 4, 8), (6, 3, 5), (32, 8, 3)):
        ranges = [head_ranges(heads, kv, size, r) for r in range(size)]
        queries = [h for (qa, qb), _ in ranges for h in range(qa, qb)]
        assert sorted(set(queries)) == list(range(heads)) and all(qb > qa for (qa, qb), _ in ranges)
        for (qa, qb), (ka, kb) in ranges:  # each rank holds the KV heads of its queries
            assert {q // (heads // kv) for q in range(qa, qb)} == set(range(ka, kb))
    with pytest.raises(ValueError, match="at most 4 ranks"):
        head_ranges(4, 1, 5, 0)


class _TwoRanks:
    """Stands in for rank 0 of a 2-rank group where sharding needs no collective."""

    def size(self):
        return 2

    def rank(self):
        return 0


def test_a_layer_the_sharder_does_not_know_is_named():
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.layers.mlp import MLP

    class OddBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = MLP(8, 16)
            self.mixer = nn.Linear(8, 8)

    model = nn.Module()
    model.layers = [OddBlock()]
    with pytest.raises(ValueError, match=r"cannot shard layer 'layers\.0\.mixer' of OddBlock"):
        shard_model(model, _TwoRanks())


def test_quantized_layer_split_off_group_boundaries_is_refused():
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.layers.attention import Attention

    model = nn.Module()
    model.attn = Attention(128, 6, 2, 64)  # rank 0 gets 3 heads = 192 columns of o_proj
    nn.quantize(model, group_size=128, bits=4)
    with pytest.raises(ValueError, match=r"'attn.o_proj'.*quantization groups of 128"):
        shard_model(model, _TwoRanks())


def _one_layer(name, layer):
    import mlx.nn as nn

    block = nn.Module()
    setattr(block, name, layer)
    model = nn.Module()
    model.layers = [block]
    return model


def _quantized(model, group_size=32):
    import mlx.nn as nn

    nn.quantize(model, group_size=group_size, bits=4)
    return model


def _kimi_one_head():
    from mlx_lm_batched.layers.gated_delta import KimiDeltaAttention

    return _one_layer("self_attn", KimiDeltaAttention(64, 1, 16, 4, 1e-6))


def _mamba2_one_head():
    from mlx_lm_batched.models.mamba2 import Mamba2Mixer

    return _one_layer("mixer", Mamba2Mixer(64, 1, 16, 8, 1, 4, 1e-6))


def _gated_delta_4bit():
    from mlx_lm_batched.layers.gated_delta import GatedDeltaNet

    return _quantized(_one_layer("linear_attn", GatedDeltaNet(64, 2, 4, 8, 8, 4, 1e-6)))


def _short_conv_4bit():
    from mlx_lm_batched.layers.ssm import ShortConv

    return _quantized(_one_layer("conv", ShortConv(64, 3)), group_size=64)


@pytest.mark.parametrize("make,message", [
    # Fewer heads than ranks.
    (_kimi_one_head, r"cannot shard 'layers\.0\.self_attn': 1 heads over 2 ranks"),
    (_mamba2_one_head, r"cannot shard 'layers\.0\.mixer': 1 heads in 1 groups over 2 ranks"),
    # A 4-bit out_proj whose split (2 value heads of 8 = 16 columns) is not a whole group.
    (_gated_delta_4bit, r"'layers\.0\.linear_attn\.out_proj': input columns \[0, 16\) are "
                        r"not whole quantization groups of 32"),
    # 64 channels in one quantization group of 64: nothing for the second rank.
    (_short_conv_4bit, r"cannot shard 'layers\.0\.conv': 64 channels over 2 ranks in blocks of 64"),
])
def test_recurrent_layers_that_cannot_split_are_named(make, message):
    from mlx_lm_batched.parallel.shard import shard_model

    with pytest.raises(ValueError, match=message):
        shard_model(make(), _TwoRanks())


def test_quantized_mamba2_mixer_shards_in_whole_groups():
    """8 heads in 2 groups, 4-bit in groups of 32: rank 0 keeps group 0 (4 heads)."""
    import mlx.nn as nn

    from mlx_lm_batched.parallel.shard import shard_model
    from mlx_lm_batched.models.mamba2 import Mamba2Mixer
    from mlx_lm_batched.parallel.sharded_layers import QuantizedShardedToAllLinear

    model = _quantized(_one_layer("mixer", Mamba2Mixer(64, 8, 16, 8, 2, 4, 1e-6)))
    shard_model(model, _TwoRanks())
    mixer = model.layers[0].mixer
    assert mixer.sizes == (64, 8, 1, 4, 16)  # channels, state, groups, heads, head size
    assert type(mixer.in_proj) is nn.QuantizedLinear
    assert mixer.in_proj.weight.shape[0] == 64 + 64 + 2 * 8 + 4  # gate, x, B, C, dt
    assert type(mixer.out_proj) is QuantizedShardedToAllLinear
    assert mixer.out_proj.scales.shape == (64, 2)  # 64 of 128 input columns: 2 groups
    assert mixer.conv1d.weight.shape[0] == 64 + 2 * 8 and mixer.norm.groups == 1


class _Rank:
    """Stands in for rank ``rank`` of a group of ``size`` where no collective runs
    (setting a pipeline stage up communicates nothing)."""

    def __init__(self, size, rank):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


def _tiny_llama(layers, tied=True, vocab=64):
    from mlx_lm_batched.models import llama

    return llama.Model(llama.ModelArgs(model_type="llama", hidden_size=32, num_hidden_layers=layers,
                                       intermediate_size=64, num_attention_heads=4, vocab_size=vocab,
                                       num_key_value_heads=2, tie_word_embeddings=tied))


def test_pipeline_stages_keep_only_their_layers_and_parts():
    from mlx_lm_batched.parallel.pipeline import ZeroHead, pipeline_model

    first = pipeline_model(_tiny_llama(5), _Rank(2, 0))
    assert (first.stage.start, first.stage.stop) == (0, 2) and len(first.layers) == 2
    assert "embed_tokens" in first.model and "norm" not in first.model
    assert isinstance(first.lm_head, ZeroHead) and len(first.make_cache()) == 2
    last = pipeline_model(_tiny_llama(5), _Rank(2, 1))
    assert (last.stage.start, last.stage.stop) == (2, 5) and len(last.make_cache()) == 3
    assert "embed_tokens" in last.model and "lm_head" not in last  # tied: the head is the embedding
    untied = pipeline_model(_tiny_llama(5, tied=False), _Rank(2, 1))
    assert "embed_tokens" not in untied.model and "lm_head" in untied
    middle = pipeline_model(_tiny_llama(5), _Rank(3, 1))
    assert "embed_tokens" not in middle.model and isinstance(middle.lm_head, ZeroHead)
    assert (middle.stage.start, middle.stage.stop, middle.stage.vocab) == (2, 3, 64)


def test_pipeline_split_by_bytes_counts_the_embedding_and_head():
    from mlx_lm_batched.parallel.pipeline import layer_ranges, stage_ranges

    assert layer_ranges([1] * 30, 2) == [(0, 15), (15, 30)]
    assert layer_ranges([1] * 7, 3) == [(0, 2), (2, 5), (5, 7)]
    assert layer_ranges([1, 1, 1, 1], 2, first_extra=2) == [(0, 1), (1, 4)]
    # A large untied vocabulary: the first stage (embedding) and the last (head) take fewer blocks.
    model = _tiny_llama(8, tied=False, vocab=2048)
    assert stage_ranges(model, 3, "layers") == [(0, 3), (3, 5), (5, 8)]
    assert stage_ranges(model, 3, "bytes") == [(0, 1), (1, 7), (7, 8)]


def test_pipeline_refusals_name_the_problem():
    import mlx.nn as nn

    from mlx_lm_batched.parallel.pipeline import pipeline_model
    from mlx_lm_batched.utils import sharded_load

    with pytest.raises(ValueError, match="cannot split 1 layers into 2 pipeline stages"):
        pipeline_model(_tiny_llama(1), _Rank(2, 0))
    with pytest.raises(TypeError, match="needs a model built from the shared CausalLM"):
        pipeline_model(nn.Linear(2, 2), _Rank(2, 0))
    with pytest.raises(ValueError, match="split must be one of layers, bytes"):
        pipeline_model(_tiny_llama(2), _Rank(2, 0), split="heads")
    with pytest.raises(ValueError, match="pipeline_group and tensor_group cannot both"):
        sharded_load("unused", pipeline_group=_Rank(2, 0), tensor_group=_Rank(2, 0))
