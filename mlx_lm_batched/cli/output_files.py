"""Durable CLI outputs: checked before the model loads, written as each prompt finishes.

``--output-dir`` gets one file per prompt (written to a temporary name, then
renamed, so a file is either complete or absent); ``--jsonl`` one record per
prompt, flushed as it is written. Without either, texts go to stdout in prompt
order, each as soon as it and the prompts before it are done.
"""

import json
import os
import sys
import tempfile

from .args import CliError


def prepare_output_dir(path):
    """Create ``--output-dir`` and prove it is writable, or raise :class:`CliError`."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise CliError(f"--output-dir '{path}' exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise CliError(f"--output-dir '{path}' is not writable: {e.strerror or e}") from None


def open_jsonl(path):
    """Open ``--jsonl`` for writing (``-`` is stdout), or raise :class:`CliError`."""
    if path == "-":
        return sys.stdout
    if os.path.isdir(path):
        raise CliError(f"--jsonl '{path}' is a directory")
    try:
        return open(path, "w", encoding="utf-8")
    except OSError as e:
        raise CliError(f"cannot write --jsonl '{path}': {e.strerror or e}") from None


def _natural_name(source, inline_number):
    if inline_number is not None:
        return f"prompt-{inline_number}.out.txt"
    return os.path.splitext(os.path.basename(source))[0] + ".out.txt"


def output_names(sources, inline_numbers):
    """Unique output file names, in prompt order.

    A prompt file ``q.txt`` gives ``q.out.txt``; the N-th ``--prompt`` gives
    ``prompt-N.out.txt``. Names wanted by several prompts get ``-2``, ``-3``, ...
    in prompt order (skipping names already taken), so reruns name alike.
    """
    wanted = [_natural_name(s, n) for s, n in zip(sources, inline_numbers)]
    taken = {w for w in wanted if wanted.count(w) == 1}
    seen, names = set(), []
    for w in wanted:
        if wanted.count(w) == 1:
            names.append(w)
            continue
        name, k = w, 1
        while name in taken or name in seen:
            k += 1
            name = w[: -len(".out.txt")] + f"-{k}.out.txt"
        seen.add(name)
        names.append(name)
    return names


class Outputs:
    """Where finished prompts go; open it before loading the model."""

    def __init__(self, output_dir=None, jsonl=None, verbose=None):
        self.output_dir = output_dir
        self.verbose = verbose
        if output_dir:
            prepare_output_dir(output_dir)
        self.jsonl = open_jsonl(jsonl) if jsonl else None
        self.to_stdout = not output_dir and not jsonl
        self.names = []
        self.sources = []
        self._pending = {}  # finished texts waiting for earlier prompts (stdout only)
        self._next = 0
        self.written = 0

    def assign(self, sources, inline_numbers):
        """Fix the prompts (in order) and their output file names."""
        self.sources = list(sources)
        self.names = output_names(sources, inline_numbers) if self.output_dir else []

    def path(self, i):
        return os.path.join(self.output_dir, self.names[i]) if self.output_dir else None

    def finish(self, i, text, prompt_tokens, generation_tokens, finish_reason):
        """Write prompt ``i``'s output file and JSONL record now (flushed)."""
        if self.output_dir:
            path = self.path(i)
            tmp = path + ".partial"
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        if self.jsonl is not None:
            record = {"index": i, "source": self.sources[i], "output": self.path(i), "text": text,
                      "prompt_tokens": prompt_tokens, "generation_tokens": generation_tokens,
                      "finish_reason": finish_reason}
            self.jsonl.write(json.dumps(record, ensure_ascii=False) + "\n")
            self.jsonl.flush()
        if self.to_stdout:
            self._pending[i] = text
            while self._next in self._pending:
                self._print(self._next, self._pending.pop(self._next))
                self._next += 1
        self.written += 1

    def _print(self, i, text):
        if self.verbose is False:
            print(text)
        elif self.verbose:
            print("=" * 10)
            print(text)
            print("=" * 10)
        else:
            print(f"==== {self.sources[i]} ====")
            print(text)
        sys.stdout.flush()

    def flush_pending(self):
        """Print finished texts still waiting for an unfinished earlier prompt."""
        for i in sorted(self._pending):
            self._print(i, self._pending.pop(i))

    def close(self):
        if self.jsonl is not None and self.jsonl is not sys.stdout:
            self.jsonl.close()
