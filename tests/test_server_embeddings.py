"""``/v1/embeddings`` with the official ``openai`` client on real SmolLM2 (float32), and
``/tokenizer_info``: each vector is the same bits as the text embedded alone (in any
batch) and equals transformers' hidden states pooled the same way; token-id inputs,
base64, ``dimensions`` (refused without Matryoshka dimensions, cut and renormalized with
them), a sentence-transformers pooling config (last token), errors as OpenAI's error
object."""

import base64
import concurrent.futures as futures
import json
import os

import numpy as np
import openai
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

from server_harness import ServerProcess

TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.", "a",
         "Embeddings are vectors that represent text; similar texts have nearby vectors."]
HF_TOL = 1e-5  # against transformers in float32


@pytest.fixture(scope="module")
def server(float_dirs):
    srv = ServerProcess(float_dirs["smollm2"], "--max-batch", 8)
    yield srv
    assert srv.stop() == 0, srv.output()


@pytest.fixture(scope="module")
def matryoshka_dir(float_dirs, tmp_path_factory):
    """SmolLM2 as a sentence-transformers checkpoint: last-token pooling, Normalize, and
    ``is_matryoshka`` in its config (weights linked, not copied)."""
    src, out = float_dirs["smollm2"], tmp_path_factory.mktemp("smol-embedding")
    for name in os.listdir(src):
        if name != "config.json":
            os.symlink(src / name, out / name)
    config = json.loads((src / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "is_matryoshka": True}))
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"}]))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": config["hidden_size"], "pooling_mode_lasttoken": True,
        "pooling_mode_mean_tokens": False, "pooling_mode_cls_token": False}))
    return out


@pytest.fixture(scope="module")
def hf(float_dirs):
    path = str(float_dirs["smollm2"])
    return AutoModel.from_pretrained(path, dtype=torch.float32).eval(), AutoTokenizer.from_pretrained(path)


def hidden(hf, text):
    model, tokenizer = hf
    with torch.no_grad():
        return model(torch.tensor([tokenizer.encode(text)])).last_hidden_state[0].numpy()


def unit(v):
    return v / np.linalg.norm(v)


def vectors(response):
    return [np.array(d.embedding, dtype=np.float32) for d in response.data]


def test_batch_equals_alone_and_transformers(client, server, hf):
    model = client.models.list().data[0].id
    together = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert [d.index for d in together.data] == list(range(len(TEXTS)))
    counts = [len(hf[1].encode(t)) for t in TEXTS]
    assert together.usage.prompt_tokens == together.usage.total_tokens == sum(counts)
    for text, got in zip(TEXTS, vectors(together)):
        alone = vectors(client.embeddings.create(model=model, input=text, encoding_format="float"))[0]
        assert got.shape == (576,) and abs(np.linalg.norm(got) - 1) < 1e-5
        assert np.array_equal(got, alone), text  # the same bits as the text alone
        assert np.abs(got - unit(hidden(hf, text).mean(axis=0))).max() <= HF_TOL, text
    # The same request twice: the same bits.
    again = client.embeddings.create(model=model, input=TEXTS, encoding_format="float")
    assert all(np.array_equal(a, b) for a, b in zip(vectors(together), vectors(again)))
    # Other batches (another order, other counts, a longer text among them): each row is
    # still the bits of its text alone.
    longer = TEXTS[3] * 4
    solo = dict(zip(TEXTS, vectors(together)))
    solo[longer] = vectors(client.embeddings.create(model=model, input=longer,
                                                    encoding_format="float"))[0]
    for batch in ([TEXTS[2], longer, TEXTS[0]], TEXTS[::-1] + [TEXTS[1]]):
        got = vectors(client.embeddings.create(model=model, input=batch, encoding_format="float"))
        assert all(np.array_equal(v, solo[text]) for text, v in zip(batch, got)), batch


def test_token_ids_and_base64(client, hf):
    model = client.models.list().data[0].id
    ids = [hf[1].encode(t) for t in TEXTS[:2]]
    by_text = client.embeddings.create(model=model, input=TEXTS[:2], encoding_format="float")
    by_ids = client.embeddings.create(model=model, input=ids, encoding_format="float")
    assert all(np.array_equal(a, b) for a, b in zip(vectors(by_text), vectors(by_ids)))
    one = client.embeddings.create(model=model, input=ids[0], encoding_format="float")
    alone = client.embeddings.create(model=model, input=TEXTS[0], encoding_format="float")
    assert np.array_equal(vectors(one)[0], vectors(alone)[0])
    # base64: little-endian float32, the same values (the client asks for it by default).
    raw = client.with_raw_response.embeddings.create(model=model, input=TEXTS[:2],
                                                     encoding_format="base64")
    data = json.loads(raw.text)["data"]
    for d, expected in zip(data, vectors(by_text)):
        assert np.array_equal(np.frombuffer(base64.b64decode(d["embedding"]), "<f4"), expected)
    assert np.array_equal(vectors(client.embeddings.create(model=model, input=TEXTS[:2]))[1],
                          vectors(by_text)[1])


def test_bad_requests(client, server):
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model, input="x", dimensions=64)
    assert e.value.body["param"] == "dimensions" and "Matryoshka" in e.value.body["message"]
    for body, param in [({"input": ""}, "input"), ({"input": []}, "input"),
                        ({"input": [[1, 2], [10**6]]}, "input"),
                        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": 3}, "input")]:
        code, err, _ = server.post("/v1/embeddings", body)
        assert code == 400 and err["error"]["param"] == param, (body, err)
    code, err, _ = server.post("/v1/embeddings", {"input": "x", "model": "nope"})
    assert code == 404 and err["error"]["code"] == "model_not_found"


def test_embeddings_beside_generation(client):
    """Embedding work runs on the engine thread between batch steps."""
    model = client.models.list().data[0].id
    expected = vectors(client.embeddings.create(model=model, input=TEXTS, encoding_format="float"))
    with futures.ThreadPoolExecutor(3) as pool:
        chat = pool.submit(client.chat.completions.create, model=model, max_tokens=24,
                           messages=[{"role": "user", "content": "Count to ten."}])
        embedded = [pool.submit(client.embeddings.create, model=model, input=TEXTS,
                                encoding_format="float") for _ in range(2)]
        assert chat.result().choices[0].message.content
        for job in embedded:
            assert all(np.array_equal(a, b) for a, b in zip(vectors(job.result()), expected))


def test_tokenizer_info(server, hf):
    code, info, _ = server.get("/tokenizer_info")
    tokenizer = hf[1]
    assert code == 200
    assert info["chat_template"] == tokenizer.chat_template
    for kind in ("bos", "eos", "pad", "unk"):
        assert info[f"{kind}_token"] == getattr(tokenizer, f"{kind}_token")
        assert info[f"{kind}_token_id"] == getattr(tokenizer, f"{kind}_token_id")
    assert info["eos_token_ids"] == [tokenizer.eos_token_id]
    # The tokenizer sets no limit (1e30): the served context is the limit.
    assert info["model_max_length"] == info["max_model_len"] == 8192
    assert info["tokenizer_class"]


def test_pooling_config_and_dimensions(matryoshka_dir, hf):
    srv = ServerProcess(matryoshka_dir, "--max-batch", 4)
    try:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        full = vectors(client.embeddings.create(model=model, input=TEXTS, encoding_format="float"))
        for text, got in zip(TEXTS, full):
            assert np.abs(got - unit(hidden(hf, text)[-1])).max() <= HF_TOL, text
        cut = client.embeddings.create(model=model, input=TEXTS, dimensions=64,
                                       encoding_format="float")
        for got, whole, text in zip(vectors(cut), full, TEXTS):
            assert got.shape == (64,) and abs(np.linalg.norm(got) - 1) < 1e-5
            assert np.abs(got - unit(unit(hidden(hf, text)[-1])[:64])).max() <= HF_TOL
            assert np.abs(got - unit(whole[:64])).max() <= 1e-6
        with pytest.raises(openai.BadRequestError) as e:
            client.embeddings.create(model=model, input="x", dimensions=4096)
        assert e.value.body["param"] == "dimensions"
    finally:
        assert srv.stop() == 0, srv.output()
