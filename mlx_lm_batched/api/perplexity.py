"""Perplexity of a model on token sequences (mlx-lm's ``perplexity`` module): the data
cut into rows of ``sequence_length`` tokens, each row scored in one forward pass (no
padding, so every row of a batch is a full sequence), the mean next-token cross entropy
exponentiated, with the standard error by the delta method.

The data comes from a local file in mlx-lm's dataset formats (``text``, chat
``messages``, ``prompt``/``completion`` records, one JSON object per line): a ``.jsonl``
file or a directory holding ``train.jsonl``. Hub dataset ids are not downloaded here."""

import json
import math
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np


def _records(data_path):
    path = Path(data_path)
    if path.is_dir():
        path = path / "train.jsonl"
    if not path.is_file():
        raise ValueError(f"--data-path '{data_path}' is not a .jsonl file or a directory with "
                         "train.jsonl (mlx_lm_batched reads no Hub datasets: save one locally)")
    with open(path, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    if not records:
        raise ValueError(f"--data-path '{data_path}' holds no records")
    return records


def record_tokens(tokenizer, record):
    """One record's tokens as mlx-lm's datasets make them: a ``prompt``/``completion``
    pair or ``messages`` through the chat template (with the record's ``tools``), or
    ``text`` encoded with the EOS token appended when it does not end the text."""
    tools = record.get("tools")
    if "prompt" in record and "completion" in record:
        messages = [{"role": "user", "content": record["prompt"]},
                    {"role": "assistant", "content": record["completion"]}]
        return list(tokenizer.apply_chat_template(messages, tools=tools))
    if "messages" in record:
        return list(tokenizer.apply_chat_template(record["messages"], tools=tools))
    if "text" in record:
        tokens = list(tokenizer.encode(record["text"]))
        if tokens[-1] != tokenizer.eos_token_id:
            tokens.append(tokenizer.eos_token_id)
        return tokens
    raise ValueError("unsupported record: expected 'text', 'messages', or 'prompt' and "
                     f"'completion' keys, got {sorted(record)}")


def load_data(tokenizer, data_path, num_samples, sequence_length):
    """``(rows, sequence_length)`` int array of the records' tokens, records taken in the
    order of ``np.random.permutation`` (seed it for a fixed sample) until
    ``num_samples`` rows are filled (-1: every record), the remainder dropped."""
    records = _records(data_path)
    order = np.random.permutation(len(records)).tolist()
    wanted = sequence_length * num_samples if num_samples > 0 else None
    tokens = []
    for i in order:
        if wanted is not None and len(tokens) >= wanted:
            break
        tokens.extend(record_tokens(tokenizer, records[i]))
    rows = len(tokens) // sequence_length
    if rows == 0:
        raise ValueError(f"the data holds {len(tokens)} tokens, fewer than one sequence of "
                         f"{sequence_length}")
    data = mx.array(tokens[: rows * sequence_length]).reshape(rows, sequence_length)
    return data[:num_samples] if num_samples > 0 else data


def eval_ppl(model, data, batch_size=8, progress=None):
    """``(perplexity, its standard error)`` of ``model`` on ``data`` ``(rows, L)``: every
    token after the first of each row predicted from the ones before it.
    ``progress(done, total)`` is called after each batch."""
    losses = []
    total = (len(data) + batch_size - 1) // batch_size
    for i, start in enumerate(range(0, len(data), batch_size)):
        batch = data[start : start + batch_size]
        logits = model(batch[:, :-1]).astype(mx.float32)
        loss = nn.losses.cross_entropy(logits, batch[:, 1:], reduction="none")
        mx.eval(loss)
        losses.append(loss.flatten())
        if progress is not None:
            progress(i + 1, total)
    losses = mx.concatenate(losses)
    ppl = math.exp(losses.mean().item())
    std = mx.sqrt(mx.var(losses, ddof=1)).item()
    return ppl, ppl * std / math.sqrt(losses.size)
