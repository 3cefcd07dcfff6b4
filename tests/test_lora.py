"""LoRA and DoRA adapters (mlx-lm's format): equal to mlx-lm's on the same weights, fused,
from the CLIs, and several adapters per row of one batch.

Adapters are made with mlx-lm's own utilities on the SmolLM2 fixture
(``linear_to_lora_layers``, random non-zero ``lora_b`` and DoRA magnitudes, saved as its
trainer saves them: the trainable parameters and ``adapter_config.json``)."""

import json
import os
import subprocess
import sys

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from mlx_lm_batched import load
from mlx_lm_batched.loading.adapters import attach_adapters, load_adapters
from mlx_lm_batched.sched.generator import BatchGenerator

PROMPTS = ["The capital of France is", "Once upon a time, a small robot", "def add(a, b):"]
TOKENS = 6


def make_adapter(model_dir, out, kind, seed, keys=("self_attn.q_proj", "self_attn.v_proj",
                                                  "mlp.down_proj"), rank=4, num_layers=3):
    """An mlx-lm adapter directory: mlx-lm's LoRA/DoRA layers with random non-zero weights."""
    import mlx_lm
    from mlx_lm.tuner.utils import linear_to_lora_layers

    model, _ = mlx_lm.load(str(model_dir))
    model.freeze()
    params = {"rank": rank, "scale": 8.0, "dropout": 0.0, "keys": list(keys)}
    linear_to_lora_layers(model, num_layers, params, use_dora=(kind == "dora"))
    mx.random.seed(seed)
    update = []
    for name, v in tree_flatten(model.trainable_parameters()):
        if name.endswith("lora_b"):
            update.append((name, 0.2 * mx.random.normal(v.shape)))
        elif name.endswith(".m"):
            update.append((name, v * (1 + 0.3 * mx.random.normal(v.shape))))
    model.load_weights(update, strict=False)
    os.makedirs(out, exist_ok=True)
    mx.save_safetensors(os.path.join(out, "adapters.safetensors"),
                        dict(tree_flatten(model.trainable_parameters())))
    with open(os.path.join(out, "adapter_config.json"), "w") as f:
        json.dump({"fine_tune_type": kind, "num_layers": num_layers, "lora_parameters": params}, f)
    return str(out)


@pytest.fixture(scope="module")
def smol_dir(float_dirs):
    return float_dirs["smollm2"]


@pytest.fixture(scope="module")
def adapters(smol_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("adapters")
    return {"lora": make_adapter(smol_dir, root / "lora", "lora", 1),
            "dora": make_adapter(smol_dir, root / "dora", "dora", 2,
                                 keys=("self_attn.k_proj", "mlp.up_proj"), rank=2)}


def greedy(model, tokenizer, prompt, n=TOKENS):
    """mlx-lm's or our generate_step driven greedily: n tokens."""
    from mlx_lm.generate import generate_step

    out = []
    for (tok, _), _ in zip(generate_step(mx.array(tokenizer.encode(prompt)), model), range(n)):
        out.append(int(tok))
    return out


def _quantize(model):
    nn.quantize(model, group_size=64, bits=4,
                class_predicate=lambda p, m: isinstance(m, nn.Linear) and m.weight.shape[1] % 64 == 0)
    return model


@pytest.mark.parametrize("kind,quantized", [("lora", False), ("dora", False), ("lora", True),
                                            ("dora", True)])
def test_adapter_equals_mlx_lm(smol_dir, adapters, kind, quantized):
    """Logits and greedy tokens equal mlx-lm's ``load(..., adapter_path=...)`` (float and
    4-bit base weights), and the adapter changes the model."""
    import mlx_lm
    from mlx_lm.tuner.utils import load_adapters as mlx_lm_load_adapters

    path = adapters[kind]
    if quantized:
        ref, tok = mlx_lm.load(str(smol_dir))
        mlx_lm_load_adapters(_quantize(ref), path)
        ours, _ = load(str(smol_dir))
        load_adapters(_quantize(ours), path)
    else:
        ref, tok = mlx_lm.load(str(smol_dir), adapter_path=path)
        ours, _ = load(str(smol_dir), adapter_path=path)
    base, _ = load(str(smol_dir))
    x = mx.array([tok.encode(PROMPTS[0])])
    a, b = ref(x), ours(x)
    assert mx.abs(a - b).max().item() < 2e-3
    assert mx.abs(a - base(x)).max().item() > 0.5  # the adapter matters
    assert greedy(ours, tok, PROMPTS[1]) == greedy(ref, tok, PROMPTS[1])


def test_rows_with_different_adapters_equal_each_alone(smol_dir, adapters):
    """One batch: rows on the LoRA adapter, the DoRA adapter and none, joining at
    different steps; each row's tokens and logprobs equal its adapter's model alone."""
    model, tok = load(str(smol_dir))
    attach_adapters(model, [adapters["lora"], adapters["dora"]])
    solo = {0: load(str(smol_dir))[0], 1: load(str(smol_dir), adapter_path=adapters["lora"])[0],
            2: load(str(smol_dir), adapter_path=adapters["dora"])[0]}
    rows = [(PROMPTS[0], 1), (PROMPTS[1], 0), (PROMPTS[2], 2), (PROMPTS[0], 2), (PROMPTS[1], 1)]
    gen = BatchGenerator(model, max_tokens=TOKENS, prefill_batch_size=3)
    uids = gen.insert([tok.encode(p) for p, _ in rows[:3]], adapters=[a for _, a in rows[:3]])
    got = {}
    step = 0
    while True:
        if step == 2:  # rows joining the running batch
            uids += gen.insert([tok.encode(p) for p, _ in rows[3:]],
                               adapters=[a for _, a in rows[3:]])
        _, responses = gen.next()
        step += 1
        if not responses and step > 2 and not gen._rows:
            break
        for r in responses:
            got.setdefault(r.uid, []).append((r.token, r.logprobs))
    for uid, (prompt, slot) in zip(uids, rows):
        ref = BatchGenerator(solo[slot], max_tokens=TOKENS)
        (ruid,) = ref.insert([tok.encode(prompt)])
        want = []
        while len(want) < TOKENS:
            want += [(r.token, r.logprobs) for r in ref.next()[1] if r.uid == ruid]
        assert [t for t, _ in got[uid]] == [t for t, _ in want], (prompt, slot)
        for (_, lp), (_, rlp) in zip(got[uid], want):
            assert mx.abs(lp - rlp).max().item() < 1e-3


def test_bad_adapters_are_refused(smol_dir, adapters, tmp_path):
    model, tok = load(str(smol_dir))
    with pytest.raises(ValueError, match="no adapter_config.json"):
        load_adapters(model, str(tmp_path))
    gen = BatchGenerator(model)
    with pytest.raises(ValueError, match="slot 1 is not one of this model's 1"):
        gen.insert([tok.encode("hi")], adapters=[1])
    bad = tmp_path / "bad"
    make_adapter(smol_dir, bad, "lora", 3)
    cfg = json.loads((bad / "adapter_config.json").read_text())
    cfg["lora_parameters"] = {"rank": 4, "alpha": 16}
    (bad / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="'scale', not 'alpha'"):
        load(str(smol_dir), adapter_path=str(bad))


def run_module(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("kind", ["dora"])  # DoRA's fuse holds LoRA's and rescales it
def test_fuse_writes_a_model_equal_here_and_in_mlx_lm(smol_dir, adapters, kind, tmp_path):
    """``python -m mlx_lm_batched.fuse`` (mlx-lm's flags): the fused directory loads here
    and in mlx-lm with equal logits, equal to the unfused adapter's."""
    import mlx_lm

    out = tmp_path / "fused"
    proc = run_module("mlx_lm_batched.fuse", "--model", str(smol_dir), "--adapter-path",
                      adapters[kind], "--save-path", str(out))
    assert proc.returncode == 0, proc.stderr
    ours, tok = load(str(out))
    ref, _ = mlx_lm.load(str(out))
    unfused, _ = load(str(smol_dir), adapter_path=adapters[kind])
    x = mx.array([tok.encode(PROMPTS[2])])
    a = ours(x)
    assert mx.abs(a - ref(x)).max().item() < 1e-4
    assert mx.abs(a - unfused(x)).max().item() < 2e-3


def test_fuse_refuses_gguf_export_in_one_line(smol_dir, adapters, tmp_path):
    proc = run_module("mlx_lm_batched.fuse", "--model", str(smol_dir), "--adapter-path",
                      adapters["lora"], "--save-path", str(tmp_path / "f"), "--export-gguf")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "error: --export-gguf is not supported by mlx_lm_batched yet: save the fused model "
        "and convert it with llama.cpp's convert_hf_to_gguf.py"]


def test_cli_generate_many_prompts_with_an_adapter(smol_dir, adapters, tmp_path):
    """``generate --adapter-path`` for several prompts equals the Python API on the model
    loaded with the adapter (itself equal to mlx-lm's, above)."""
    from mlx_lm_batched import batch_generate
    from test_cli import run_cli

    out = tmp_path / "out.jsonl"
    proc = run_cli("--model", smol_dir, "--adapter-path", adapters["dora"], "-p", PROMPTS[0],
                   "-p", PROMPTS[1], "--max-tokens", 5, "--ignore-chat-template", "--jsonl", out,
                   "--no-progress")
    assert proc.returncode == 0, proc.stderr
    records = sorted((json.loads(line) for line in out.read_text().splitlines()),
                     key=lambda r: r["index"])
    model, tok = load(str(smol_dir), adapter_path=adapters["dora"])
    want = batch_generate(model, tok, PROMPTS[:2], max_tokens=5).texts
    assert [r["text"] for r in records] == want
    base, _ = load(str(smol_dir))
    assert batch_generate(base, tok, PROMPTS[:2], max_tokens=5).texts != want
    bad = run_cli("--model", smol_dir, "--adapter-path", str(tmp_path), "-p", "hi")
    assert bad.returncode == 2 and "no adapter_config.json" in bad.stderr
    assert "Traceback" not in bad.stderr


def test_cache_prompt_with_an_adapter_equals_mlx_lm_and_keys_on_it(smol_dir, adapters, tmp_path):
    """``cache_prompt --adapter-path`` saves the cache mlx-lm's saves with the adapter; the
    file records the adapter, and continuing it under another adapter is refused."""
    from test_cli import run_cli

    mine, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    text = "Here is a note about rivers and the sea."
    for module, path in (("mlx_lm_batched.cache_prompt", mine), ("mlx_lm.cache_prompt", theirs)):
        proc = run_module(module, "--model", str(smol_dir), "--adapter-path", adapters["lora"],
                          "--prompt", text, "--prompt-cache-file", str(path))
        assert proc.returncode == 0, proc.stderr[-2000:]
    from mlx_lm_batched.models.cache import load_prompt_cache

    a, b = mx.load(str(mine)), mx.load(str(theirs))
    assert sorted(a) == sorted(b)
    assert load_prompt_cache(str(mine), return_metadata=True)[1]["adapter_path"] == adapters["lora"]
    for k in a:  # mlx-lm saves its whole preallocated buffer; the tokens come first
        theirs_k = b[k][tuple(slice(0, n) for n in a[k].shape)]
        assert mx.abs(a[k] - theirs_k).max().item() < 1e-3, k
    ok = run_cli("--prompt-cache-file", mine, "--adapter-path", adapters["lora"], "-p", "Why?",
                 "-m", 3)
    assert ok.returncode == 0, ok.stderr
    refused = run_cli("--prompt-cache-file", mine, "-p", "Why?", "-m", 3)
    assert refused.returncode == 2 and "differs from the adapter" in refused.stderr


def test_chat_with_an_adapter(smol_dir, adapters):
    """``chat --adapter-path`` answers with the adapter's model (the Python API's text)."""
    from mlx_lm_batched import generate
    from test_chat import Pty

    model, tok = load(str(smol_dir), adapter_path=adapters["lora"])
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name a color."}],
                                     add_generation_prompt=True, tokenize=False)
    want = generate(model, tok, prompt, max_tokens=6)
    chat = Pty([sys.executable, "-m", "mlx_lm_batched.chat", "--model", str(smol_dir),
                "--adapter-path", adapters["lora"], "--max-tokens", "6"])
    try:
        chat.expect(">> ")
        chat.send("Name a color.")
        reply = chat.expect(">> ")
        assert want.strip() and want.strip() in reply.replace("\r\n", "\n"), (want, reply)
        chat.send("q")
        assert chat.proc.wait(timeout=60) == 0
    finally:
        chat.close()


def test_server_serves_several_adapters_in_one_batch(smol_dir, adapters):
    """``--adapters NAME=PATH ...``: ``/v1/models`` lists them; concurrent requests on the
    base model and each adapter (one running batch) each equal that adapter's model
    alone; a prefix cached under one adapter is never reused under another."""
    from concurrent.futures import ThreadPoolExecutor

    import openai
    from mlx_lm_batched import batch_generate
    from server_harness import ServerProcess

    # KV blocks of 4 tokens: the short prompts here span whole blocks, so they are cached.
    srv = ServerProcess(smol_dir, "--served-model-name", "smol", "--kv-block-size", 4,
                        "--adapters", f"lo={adapters['lora']}", f"do={adapters['dora']}")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120,
                               max_retries=0)
        assert [m.id for m in client.models.list().data] == ["smol", "lo", "do"]
        jobs = [(name, p) for p in PROMPTS[:2] for name in ("smol", "lo", "do")]

        def complete(job):
            r = client.completions.create(model=job[0], prompt=job[1], max_tokens=TOKENS,
                                          temperature=0)
            return r.model, r.choices[0].text, r.usage

        with ThreadPoolExecutor(len(jobs)) as pool:
            got = list(pool.map(complete, jobs))
        _, tok = load(str(smol_dir))
        for name, path in (("smol", None), ("lo", adapters["lora"]), ("do", adapters["dora"])):
            model = load(str(smol_dir), adapter_path=path)[0]
            want = batch_generate(model, tok, PROMPTS[:2], max_tokens=TOKENS).texts
            mine = [text for (n, _), (m, text, _) in zip(jobs, got) if n == name]
            assert [m for (n, _), (m, _, _) in zip(jobs, got) if n == name] == [name, name]
            assert mine == want, name
        # The same prompt again on each name: cached under its own adapter only.
        again = [complete((name, PROMPTS[0])) for name in ("smol", "lo", "do")]
        assert [t for _, t, _ in again] == [t for (n, p), (_, t, _) in zip(jobs, got)
                                            if p == PROMPTS[0]]
        assert again[1][2].prompt_tokens_details.cached_tokens > 0  # reused under lo
        fresh = complete(("lo", "A prompt no other adapter has seen before, with words"))
        other = complete(("do", "A prompt no other adapter has seen before, with words"))
        assert fresh[2].prompt_tokens_details.cached_tokens == 0
        assert other[2].prompt_tokens_details.cached_tokens == 0  # lo's cache is not do's
        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="nope", prompt="hi", max_tokens=1)
    finally:
        srv.stop()


def test_gemma3_rows_with_and_without_an_adapter(float_dirs, tmp_path):
    """Gemma 3 (sliding-window layers): the adapter equals mlx-lm's, and a batch mixing
    the adapter's rows and base rows equals each alone."""
    import mlx_lm

    d = float_dirs["gemma3"]
    path = make_adapter(d, tmp_path / "g", "lora", 4, keys=("self_attn.o_proj", "mlp.gate_proj"))
    ref, tok = mlx_lm.load(str(d), adapter_path=path)
    alone, _ = load(str(d), adapter_path=path)
    model, _ = load(str(d))
    attach_adapters(model, [path])
    base, _ = load(str(d))
    # mlx-lm's Gemma differs from ours already without adapters (it rounds the embedding
    # scale sqrt(hidden_size) to bf16; we keep it in the compute dtype), so its greedy
    # tokens are the oracle here, and the logits are checked against the adapter folded
    # into the weights (fuse).
    assert greedy(alone, tok, PROMPTS[1]) == greedy(ref, tok, PROMPTS[1])
    from mlx_lm_batched.loading.adapters import fuse_adapters

    fused = fuse_adapters(load(str(d), adapter_path=path)[0])
    x = mx.array([tok.encode(PROMPTS[0])])
    assert mx.abs(fused(x) - alone(x)).max().item() < 2e-3
    gen = BatchGenerator(model, max_tokens=4)
    uids = gen.insert([tok.encode(p) for p in PROMPTS[:2]], adapters=[1, 0])
    got = {}
    while gen._rows:
        for r in gen.next()[1]:
            got.setdefault(r.uid, []).append(r.token)
    for uid, p, solo in zip(uids, PROMPTS[:2], (alone, base)):
        ref_gen = BatchGenerator(solo, max_tokens=4)
        (ruid,) = ref_gen.insert([tok.encode(p)])
        want = []
        while ref_gen._rows:
            want += [r.token for r in ref_gen.next()[1] if r.uid == ruid]
        assert got[uid] == want, p
