"""``--kv-bits`` end to end: the command line for many prompts and the server, whose KV
byte budget counts the quantized bytes (a request too large for float KV fits)."""

import json

from conftest import corpus_prompts
from mlx_lm_batched import batch_generate, load
from server_harness import ServerProcess
from test_cli import run_cli
from test_server_errors import kv_bytes_per_token


def test_cli_kv_bits_equals_the_python_api(tmp_path, float_dirs):
    d = float_dirs["smollm2"]
    model, tok = load(str(d))
    prompts = ["The lighthouse keeper", "Rivers carry"]
    jsonl = tmp_path / "out.jsonl"
    proc = run_cli("--model", d, "-p", prompts[0], "-p", prompts[1], "--max-tokens", 5, "--kv-bits", 4,
                   "--kv-group-size", 32, "--quantized-kv-start", 0, "--ignore-chat-template",
                   "--jsonl", jsonl, "--no-progress")
    assert proc.returncode == 0, proc.stderr
    texts = [json.loads(line)["text"] for line in jsonl.read_text().splitlines()]
    want = batch_generate(model, tok, prompts, max_tokens=5, kv_bits=4, kv_group_size=32,
                          quantized_kv_start=0).texts
    assert sorted(texts) == sorted(want)
    bad = run_cli("--model", d, "--prompt", "hi", "--kv-bits", 7)
    assert bad.returncode == 2 and "--kv-bits" in bad.stderr and "Traceback" not in bad.stderr


def test_server_kv_bits_budget_counts_quantized_bytes(float_dirs):
    d = float_dirs["smollm2"]
    # 100 float slots of budget: 4-bit (+ scales, biases per 64) slots are 5/32 of those.
    srv = ServerProcess(d, "--kv-bits", 4, "--max-kv-bytes", kv_bytes_per_token(d) * 100)
    try:
        model, tok = load(str(d))
        prompt = corpus_prompts(tok, [300])[0]
        code, body, _ = srv.post("/v1/completions", {"prompt": prompt, "max_tokens": 4,
                                                     "temperature": 0})
        assert code == 200, body
        want = batch_generate(model, tok, [prompt], max_tokens=4, kv_bits=4,
                              quantized_kv_start=0).texts[0]
        assert body["choices"][0]["text"] == want
        code, body, _ = srv.post("/v1/completions", {"prompt": prompt * 3, "max_tokens": 4})
        assert code == 400 and body["error"]["param"] == "max_tokens", body
    finally:
        srv.stop()
