"""The server sharded over 2 ring ranks (``mlx.launch -n 2 --backend ring``) on real
SmolLM2 (float32; 9 heads and 3 KV heads, split unevenly), queried with the ``openai``
client: concurrent greedy requests (streamed or not, with a stop string, with stop token
ids, with a prefix cache hit) and a seeded sampled one give the text of the same prompt
generated alone in this process; SIGTERM on rank 0 drains and stops both ranks cleanly; a
killed follower ends rank 0 with a clear error."""

import concurrent.futures as futures
import json
import os
import re
import signal
import subprocess
import sys

import mlx.core as mx
import openai
import pytest

from mlx_lm_batched import generate, load, stream_generate
from mlx_lm_batched.server.sampling import SeededSampler
from server_harness import ServerProcess
from distributed_harness import free_ports, launcher

STORY = "Once upon a time, in a small village by the sea,"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
HAIKU = [{"role": "user", "content": "Write a haiku about rain."}]
STOP_S = 60  # SIGTERM to exit, and a killed follower to rank 0's exit


@pytest.fixture(scope="module")
def oracle(float_dirs):
    return load(str(float_dirs["smollm2"]))


def solo(oracle, prompt, max_tokens):
    model, tokenizer = oracle
    if isinstance(prompt, list):
        prompt = tokenizer.apply_chat_template(prompt, add_generation_prompt=True)
    return generate(model, tokenizer, prompt, max_tokens=max_tokens)


@pytest.fixture(scope="module")
def server(float_dirs):
    srv = ServerProcess(float_dirs["smollm2"], "--log-level", "info", launcher=launcher())
    yield srv
    if srv.proc.poll() is None:  # a failed test: end the launcher and its ranks
        srv.proc.kill()
        srv.proc.wait()


def rank0_pid(srv):
    found = re.search(r"tensor parallel over 2 ranks, rank 0 is pid (\d+)", srv.output())
    assert found, srv.output()
    return int(found.group(1))


@pytest.mark.slow
def test_concurrent_requests_equal_one_process(server, oracle):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
    model_id = client.models.list().data[0].id
    story = solo(oracle, STORY, 10)
    stop = story.split()[2]  # a stop string inside the greedy text: the row leaves early
    story_ids = [r.token for r in stream_generate(*oracle, STORY, max_tokens=10)]
    # A stop token inside the greedy tokens (its text is not output).
    cut = next(i for i in range(2, len(story_ids)) if story_ids[i] not in story_ids[:i])
    stop_id, story_to_stop_id = story_ids[cut], oracle[1].decode(story_ids[:cut])

    def complete(prompt, n, stream=False, **kw):
        out = client.completions.create(model=model_id, prompt=prompt, max_tokens=n,
                                        temperature=0, stream=stream, **kw)
        return "".join(c.choices[0].text for c in out if c.choices) if stream else out.choices[0].text

    def chat(messages, n, stream=False):
        out = client.chat.completions.create(model=model_id, messages=messages, max_tokens=n,
                                             temperature=0, stream=stream)
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in out if c.choices)
        return out.choices[0].message.content

    jobs = {
        "story": (lambda: complete(STORY, 10), story),
        "story, streamed, stop string": (lambda: complete(STORY, 10, True, stop=[stop]),
                                         story[: story.index(stop)]),
        # A row with stop sequences of its own: the followers' copy must stop with it.
        "story, stop token ids": (lambda: complete(STORY, 10, extra_body={
            "ignore_eos": True, "stop_token_ids": [stop_id]}), story_to_stop_id),
        "france, streamed": (lambda: complete("The capital of France is", 4, True),
                             solo(oracle, "The capital of France is", 4)),
        "question chat": (lambda: chat(QUESTION, 8), solo(oracle, QUESTION, 8)),
        "haiku chat, streamed": (lambda: chat(HAIKU, 6, True), solo(oracle, HAIKU, 6)),
        # Sampled on rank 0 only; rank 1 must feed the same tokens to its heads' caches.
        "seeded sample": (lambda: client.completions.create(
            model=model_id, prompt=STORY, max_tokens=6, temperature=0.9, seed=3).choices[0].text,
            generate(*oracle, STORY, max_tokens=6, sampler=SeededSampler(3, 0.9))),
    }
    with futures.ThreadPoolExecutor(len(jobs)) as pool:
        running = {name: pool.submit(call) for name, (call, _) in jobs.items()}
        got = {name: f.result() for name, f in running.items()}
    for name, (_, expected) in jobs.items():
        assert got[name] == expected, (name, got[name], expected)
    # The question's cache went to the prefix cache on every rank: this one continues it.
    again = client.chat.completions.create(model=model_id, messages=QUESTION, max_tokens=8,
                                           temperature=0)
    assert again.choices[0].message.content == got["question chat"]
    assert again.usage.prompt_tokens_details.cached_tokens > 0


@pytest.mark.slow
def test_sigterm_on_rank_0_drains_and_stops_both_ranks_cleanly(server, oracle):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=300, max_retries=0)
    stream = iter(client.completions.create(model=client.models.list().data[0].id, prompt=STORY,
                                            max_tokens=6, temperature=0, stream=True))
    text = next(stream).choices[0].text  # the row is decoding now
    os.kill(rank0_pid(server), signal.SIGTERM)
    text += "".join(c.choices[0].text for c in stream if c.choices)
    assert text == solo(oracle, STORY, 6)  # the request in flight finished
    server.proc.wait(STOP_S)  # the launcher ends once both ranks have
    out = server.output()
    assert "exited with code" not in out and "was killed" not in out, out
    assert "error" not in out.lower(), out


def test_distributed_tensor_needs_several_ranks():
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.server", "--distributed", "tensor"],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == 2, proc.stderr
    assert "--distributed tensor: tensor parallelism needs more than one rank" in proc.stderr


@pytest.mark.slow
def test_killed_follower_ends_rank_0_with_a_clear_error(float_dirs, tmp_path):
    # Both ranks by hand (what mlx.launch does), so no launcher cleans up after rank 1.
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{p}"] for p in free_ports(2)]))
    # MLX's ring backend sometimes fails the pending collective without raising ("Too
    # many send/recv errors"); the watchdog then ends rank 0 (20 s without progress).
    env = {"MLX_HOSTFILE": str(hostfile), "PYTHONPATH": os.pathsep.join(sys.path),
           "PYTHONFAULTHANDLER": "1", "MLX_LM_BATCHED_DIST_TIMEOUT": "20"}
    port_args = ["--model", str(float_dirs["smollm2"]), "--log-level", "warning"]
    follower = subprocess.Popen([sys.executable, "-m", "mlx_lm_batched.server", *port_args],
                                env={**os.environ, **env, "MLX_RANK": "1"},
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rank0 = None
    try:
        rank0 = ServerProcess(float_dirs["smollm2"], env={**env, "MLX_RANK": "0"})
        follower.kill()  # idle: rank 0 notices at its next ping
        try:
            rank0.proc.wait(STOP_S)
        except subprocess.TimeoutExpired:  # a hang: SIGABRT shows where (faulthandler)
            rank0.proc.send_signal(signal.SIGABRT)
            rank0.proc.wait()
            pytest.fail(f"rank 0 still runs {STOP_S} s after its follower died:\n{rank0.output()}")
        assert rank0.proc.returncode == 1, rank0.output()
        out = rank0.output()
        assert ("[rank 0] error: lost a peer of the distributed group" in out
                or "[rank 0] error: no progress from the distributed group for 20 s" in out), out
    finally:
        for proc in (follower, rank0 and rank0.proc):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def _one_row_cache(n_tokens, heads):
    from mlx_lm_batched.cache.kv import KVCache

    cache = KVCache()
    x = mx.zeros((1, heads, n_tokens, 8))
    cache.update_and_fetch(x, x)
    return [cache]


def test_follower_prefix_cache_keeps_what_rank_0_keeps():
    """Rank 0 evicts by its bytes; a follower holds fewer KV heads (other byte counts) and
    evicts only by the entry counts rank 0 sends: both must keep the same prefixes."""
    from mlx_lm_batched.sched.prefix_cache import LRUPromptCache
    from mlx_lm_batched.server.replay import Follower

    model = object()  # the stores key entries by model identity only
    entry = 2 * 2 * 8 * 4  # bytes per token of rank 0's caches (2 heads, keys and values)
    rank0 = LRUPromptCache(max_size=3, max_bytes=entry * 20)
    follower = Follower(model, group=None)
    seqs = {"a": list(range(1, 6)), "b": list(range(10, 18)), "c": list(range(20, 24)),
            "a+": list(range(1, 9)), "d": list(range(30, 40)), "e": list(range(40, 43))}
    script = ["a", "b", "c", "fetch a", "a+", "d", "fetch c", "e"]
    for uid, step in enumerate(script):
        if step.startswith("fetch"):
            prompt = seqs[step.split()[1]] + [99]
            cache, rest = rank0.fetch_nearest_cache(model, prompt)
            if cache is not None:
                follower._op_fetch(uid, prompt, len(prompt) - len(rest))
            continue
        tokens = seqs[step]
        rank0.insert_cache(model, tokens, _one_row_cache(len(tokens), 2))
        follower._finished = {uid: (_one_row_cache(len(tokens), 1), tokens)}
        follower._op_store(uid, len(tokens), len(rank0))
        assert len(follower.store) == len(rank0), step
    assert rank0.nbytes > 2 * follower.store.nbytes - 1  # the byte counts did differ
    for name, tokens in seqs.items():  # the same fetches hit the same prefixes
        hits = [len(tokens) + 1 - len(s.fetch_nearest_cache(model, tokens + [99])[1])
                for s in (rank0, follower.store)]
        assert hits[0] == hits[1], (name, hits)


class _Ops:
    """A recorder without a group: keeps rank 0's ops as the followers would receive
    them (through JSON); prefix-cache hits are not part of this test."""

    def __init__(self):
        self.ops = []

    def add(self, *op):
        self.ops.append(json.loads(json.dumps(list(op))))

    def cache_ref(self, cache):
        assert cache is None
        return None

    def send(self, step, shutdown=False):
        pass


def test_follower_replays_the_rows_rank_0_inserted(float_models):
    """Rank 0's requests (a stop sequence of its own, max_tokens, several segments) reach a
    follower as ops; both generators then step the same rows to the same finish."""
    from conftest import corpus_prompts
    from mlx_lm_batched.sched.generator import BatchGenerator
    from mlx_lm_batched.sched.request import Request
    from mlx_lm_batched.server.replay import Follower, ReplayGenerator

    model, tok = float_models["smollm2"]
    group = mx.distributed.init()  # one rank: its token hook keeps its own (greedy) tokens
    a, b = corpus_prompts(tok, [9, 6])
    eos = [[t] for t in tok.eos_token_ids]
    plain = BatchGenerator(model, max_tokens=8, stop_tokens=eos)
    (uid,) = plain.insert([a])
    alone = [r.token for _ in range(8) for r in plain.next()[1]]
    stop_at = next(i for i in range(2, len(alone)) if alone[i] not in alone[:i])
    recorder = _Ops()
    rank0 = ReplayGenerator(model, group, recorder, max_tokens=8, stop_tokens=eos)
    follower = Follower(model, group)
    uids = rank0.insert_requests([
        Request.of(a, stop_sequences=[[alone[stop_at]]]),
        Request((b[:3], b[3:]), max_tokens=4)])
    for op in recorder.ops:
        getattr(follower, "_op_" + op[0])(*op[1:])
    assert uids == [0, 1]
    got = {"rank 0": [], "follower": []}
    for _ in range(12):
        for name, gen in (("rank 0", rank0), ("follower", follower.gen)):
            got[name] += [(r.uid, r.token, r.finish_reason) for r in gen.next()[1]]
    assert got["rank 0"] == got["follower"]
    rows = {u: [(t, f) for v, t, f in got["rank 0"] if v == u] for u in uids}
    assert rows[0] == [(t, None) for t in alone[:stop_at]] + [(alone[stop_at], "stop")]
    assert len(rows[1]) == 4 and rows[1][-1][1] == "length"
