"""``python -m mlx_lm_batched.server --dequantize``: a quantized model served as floats (float32
on the CPU), giving the greedy tokens of ``load(path, dequantize=True)``; the startup log names
the weights' form. Without the flag the server keeps the weights as stored (mlx_lm.server's
behaviour), so its outputs equal ``load(path)``'s, as the other server tests check."""

import openai

from mlx_lm_batched import generate, load
from mlx_lm_batched.demo_models import smollm2_gguf_path
from server_harness import ServerProcess

STORY = "Once upon a time, in a lighthouse by the sea,"


def test_dequantized_server_gives_the_dequantized_models_tokens():
    gguf = smollm2_gguf_path()
    model, tokenizer = load(str(gguf), dequantize=True)
    expected = generate(model, tokenizer, STORY, max_tokens=16)
    srv = ServerProcess(gguf, "--dequantize", "--log-level", "info")
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", timeout=120,
                               max_retries=0)
        out = client.completions.create(model=client.models.list().data[0].id, prompt=STORY,
                                        max_tokens=16, temperature=0)
        assert out.choices[0].text == expected
        assert "(context 8192 tokens; weights: dequantized; KV memory: " in srv.output(), srv.output()
    finally:
        assert srv.stop() == 0, srv.output()
