"""Random flags thrown at the CLI: never a traceback, never a signal death, exit 0/1/2.

Seeded, so a failure replays. Every case ends with a valid model, prompt and
``--max-tokens 2``; the garbage before them decides whether it runs (argparse takes
the last value of a repeated flag, so the cheap ending wins).
"""

import random

import pytest

import test_cli as base
from mlx_lm_batched.cli.args import MAX_MESSAGE

# A CLI process per case: left out of the quick run (-m "not slow").
pytestmark = pytest.mark.slow

CASES = 40
GARBAGE = ["", "-", "--", "nan", "inf", "-inf", "1e309", "-1", "0", "1", "2", "0.5", "-0.5",
           "999999999999999999999", str(2**63), str(-(2**64)), "True", "F", "x", "é☃", "{}", "[]",
           '{"a": 1}', "{%", "{{ x }}", "a/b.jinja", "/dev/null", ".", "\n", "\\n", "%s", "' or 1"]
FLAGS = ["--max-tokens", "-m", "--temp", "--top-p", "--top-k", "--min-p", "--min-tokens-to-keep",
         "--xtc-probability", "--xtc-threshold", "--seed", "--batch-size", "--max-kv-size",
         "--prefill-step-size", "--chat-template", "--chat-template-config", "--system-prompt",
         "--prefill-response", "--extra-eos-token", "--eos-token", "--verbose", "--prompts",
         "--prompt", "-p", "--output-dir", "--jsonl", "--kv-bits", "--draft-model", "--image",
         "--dequantize", "--no-dequantize", "--ignore-chat-template", "--no-progress",
         "--trust-remote-code", "--bogus", "-z"]


def random_args(rng):
    args = []
    for _ in range(rng.randint(1, 3)):
        args.append(rng.choice(FLAGS))
        for _ in range(rng.choice([0, 1, 1, 1, 2])):
            args.append(rng.choice(GARBAGE) if rng.random() < 0.8 else str(rng.randint(-5, 5)))
    return args


@pytest.mark.parametrize("case", range(CASES))
def test_random_flags_never_crash(case, tmp_path, float_dirs):
    rng = random.Random(1000 + case)
    args = random_args(rng)
    tail = ["--model", float_dirs["smollm2"], "--prompt", "Hi.", "--max-tokens", "2",
            "--no-progress"]
    proc = base.run_cli(*args, *tail, cwd=tmp_path, timeout=300)
    assert proc.returncode >= 0, (args, proc.returncode)  # not killed by a signal
    assert "Traceback" not in proc.stderr, (args, proc.stderr)
    assert proc.returncode in (0, 1, 2), (args, proc.returncode, proc.stderr)
    if proc.returncode == 2:
        errors = base.error_lines(proc)
        # One bounded line each (the message part is capped by cli_args.MAX_MESSAGE).
        assert errors and all(len(e) < MAX_MESSAGE + 200 for e in errors), (args, proc.stderr)
