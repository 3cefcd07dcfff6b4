"""Requests that arrive together with one long uncached prefix (``server/prefix_leaders.py``),
through a real server on SmolLM2: the first leads, the others wait for its prompt's blocks
and then prefill only their own tokens, reading the prefix in place; each answer is the
same as the prompt generated alone."""

import concurrent.futures as futures

from openai import OpenAI

from conftest import model_dir
from mlx_lm_batched import batch_generate, load
from server_harness import ServerProcess
from test_kv_blocks import B, smol, text  # noqa: F401  (smol: the fixture)

SHARED = 8 * B + 5  # the common prefix: 8 full blocks and a few tokens


def complete(server, prompt):
    client = OpenAI(base_url=server.url + "/v1", api_key="none")
    out = client.completions.create(model="m", prompt=prompt, max_tokens=8, temperature=0)
    return out.choices[0].text, out.usage.prompt_tokens_details.cached_tokens


def test_cold_requests_on_one_prefix_follow_a_leader(smol):  # noqa: F811
    _, ids = smol
    shared = text(ids, SHARED, 40)
    prompts = [shared + text(ids, 9 + 4 * i, 600 + 40 * i) for i in range(4)]
    path = model_dir("smollm2", dtype="float32")
    model, tokenizer = load(str(path))
    # Each prompt alone, in this process: nothing cached, nothing shared.
    alone = [batch_generate(model, tokenizer, [p], max_tokens=8).texts[0] for p in prompts]
    server = ServerProcess(path, "--served-model-name", "m")
    try:
        with futures.ThreadPoolExecutor(len(prompts)) as pool:
            together = list(pool.map(lambda p: complete(server, p), prompts))
        metrics = server.metrics()
    finally:
        server.stop()
    assert [t for t, _ in together] == alone
    cached = sorted(c for _, c in together)
    # One request computed the prefix; every other one started on its 8 blocks.
    assert cached[0] == 0 and all(c == 8 * B for c in cached[1:]), cached
    assert metrics['mlx_lm_batched_prefix_hit_tokens_total{source="memory"}'] >= 3 * 8 * B
