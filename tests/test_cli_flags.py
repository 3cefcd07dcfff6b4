"""mlx-lm's command line works with the module name swapped; bad flags are one line."""

import os
import subprocess
import sys

import pytest

import test_cli as base

PROMPT = "What is the capital of France? Answer in one word."


def test_mlx_lm_command_line_gives_mlx_lm_output(float_dirs):
    """A script's `python -m mlx_lm.generate ...` line, module swapped: same stdout."""
    model = float_dirs["smollm2"]
    flags = ["--model", model, "--prompt", "-", "--max-tokens", 12, "--verbose", "F",
             "--extra-eos-token", ".", "--system-prompt", "Answer briefly.",
             "--chat-template-config", '{"enable_thinking": false}',
             "--min-tokens-to-keep", 2, "--xtc-threshold", 0.2, "--trust-remote-code",
             "--use-default-chat-template", "--seed", 3, "--kv-group-size", 64]
    ours = subprocess.run([*base.CLI, *map(str, flags)], capture_output=True, text=True,
                          timeout=600, input=PROMPT, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    ref = subprocess.run([sys.executable, "-m", "mlx_lm.generate", *map(str, flags)],
                         capture_output=True, text=True, timeout=600, input=PROMPT,
                         env=dict(os.environ, HF_HUB_OFFLINE="1"))
    assert ref.returncode == 0, ref.stderr
    assert ours.returncode == 0, ours.stderr
    assert "Paris" in ref.stdout and not ref.stdout.rstrip().endswith(".")  # '.' stopped it
    # mlx-lm 0.32 also prints a deprecation notice for `python -m mlx_lm.generate`.
    ref_out = "".join(l for l in ref.stdout.splitlines(True) if not l.startswith("Calling `python"))
    assert ours.stdout == ref_out
    assert "[summary]" not in ours.stderr  # --verbose False: only the response


def test_sampling_flags_and_verbose_true(float_dirs):
    """XTC, min-p with min_tokens_to_keep and a seed: reproducible, mlx-lm's verbose layout."""
    args = ["--model", float_dirs["smollm2"], "--prompt", "Tell me a story.", "--max-tokens", 8,
            "--temp", 1.0, "--min-p", 0.1, "--min-tokens-to-keep", 3, "--xtc-probability", 0.5,
            "--xtc-threshold", 0.1, "--seed", 7, "--verbose", "True", "--no-progress"]
    first, second = base.run_cli(*args), base.run_cli(*args)
    assert first.returncode == 0, first.stderr
    text = first.stdout.split("=" * 10)[1]
    assert text.strip() and text == second.stdout.split("=" * 10)[1]
    assert first.stdout.startswith("=" * 10 + "\n")
    for line in ("Prompt: ", "Generation: ", "Peak memory: "):
        assert line in first.stdout


@pytest.mark.parametrize("flag", [
    ["--image", "a.png"], ["-qa"],
])
def test_missing_features_are_one_line(flag):
    proc = base.run_cli("--prompt", "hi", *flag)
    base.assert_one_line_error(proc, f"{flag[0]}", code=2)
    assert "not supported" in proc.stderr and "usage:" not in proc.stderr


@pytest.mark.parametrize("args, fragment", [
    (["--max-tokens", "ten"], "invalid int value: 'ten'"),
    (["--nonsense"], "unrecognized arguments: --nonsense"),
    (["--prompt"], "expected one argument"),
    (["--seed", "-1"], "--seed must be in 0.."),
    (["--seed", str(2**64)], "--seed must be in 0.."),
    (["--batch-size", "0"], "--batch-size must be at least 1"),
    (["--xtc-threshold", "0.9"], "xtc_threshold"),
    (["--min-tokens-to-keep", "0"], "--min-tokens-to-keep must be at least 1"),
    (["--top-k", str(2**40)], "--top-k must be at most 2147483647"),
    (["--chat-template-config", "{oops"], "--chat-template-config is not valid JSON"),
    (["--chat-template-config", "[1, 2]"], "must be a JSON object"),
    (["--chat-template", "templates/missing.jinja"], "'templates/missing.jinja' does not exist"),
    (["--chat-template", "chatml.j2"], "'chatml.j2' does not exist"),
    (["--chat-template", "{% for m in messages %}{{ m.content }"], "Jinja syntax error on line 1"),
    (["--prompt", "-", "--prompt", "-"], "--prompt - (read stdin) can be given once"),
])
def test_bad_flag_values_are_one_line(args, fragment):
    proc = base.run_cli("--prompt", "hi", *args)
    base.assert_one_line_error(proc, fragment, code=2)
    assert len(proc.stderr.splitlines()) == 1 and "usage:" not in proc.stderr


def test_chat_template_failing_for_one_prompt_rejects_only_it(tmp_path, float_dirs):
    template = tmp_path / "strict.jinja"
    template.write_text(
        "{% for m in messages %}{% if 'forbidden' in m.content %}"
        "{{ raise_exception('no forbidden words') }}{% endif %}"
        "<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n")
    good, bad = tmp_path / "good.txt", tmp_path / "bad.txt"
    good.write_text(PROMPT)
    bad.write_text("Say something forbidden.")
    proc = base.run_cli("--model", float_dirs["smollm2"], "--prompts", good, bad,
                        "--chat-template", template, "--max-tokens", 8, "--jsonl", "-",
                        "--no-progress")
    base.assert_one_line_error(proc, "no forbidden words", code=1)
    assert [r["source"] for r in base.records(proc.stdout)] == [str(good)]
    assert "Paris" in base.records(proc.stdout)[0]["text"]


def test_huge_max_tokens_is_capped_at_the_context(float_dirs):
    proc = base.run_cli("--model", float_dirs["smollm2"], "--prompt", PROMPT,
                        "--max-tokens", 10**9, "--batch-size", 10**9, "--max-kv-size", 10**12,
                        "--extra-eos-token", ".", "--jsonl", "-", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    notes = [l for l in proc.stderr.splitlines() if l.startswith("note:")]
    assert len(notes) == 1 and "context of 8192 tokens" in notes[0]
    (rec,) = base.records(proc.stdout)
    assert rec["finish_reason"] == "stop" and "Paris" in rec["text"]
    peak = float(proc.stderr.split("peak memory: ")[1].split(" GB")[0])
    assert peak < 4  # nothing was reserved for 10**9 tokens


def test_broken_checkpoint_is_one_line_and_debug_shows_the_traceback(tmp_path, float_dirs):
    """A broken checkpoint: one line naming the stage, the weights and the missing ones
    (an expected error: no debug hint); the traceback only with MLX_LM_BATCHED_DEBUG=1."""
    import shutil

    import mlx.core as mx

    broken = tmp_path / "broken"
    shutil.copytree(float_dirs["smollm2"], broken)
    weights = mx.load(str(broken / "model.safetensors"))
    for k in [k for k in weights if ".layers.3." in k]:
        weights.pop(k)
    mx.save_safetensors(str(broken / "model.safetensors"), weights)
    proc = base.run_cli("--model", broken, "--prompt", "hi")
    base.assert_one_line_error(proc, "*.safetensors: missing 9 parameters: model.layers.3.", code=2)
    (line,) = base.error_lines(proc)
    assert "loading the model" in line and "MLX_LM_BATCHED_DEBUG" not in line
    debug = base.run_cli("--model", broken, "--prompt", "hi", env={"MLX_LM_BATCHED_DEBUG": "1"})
    assert debug.returncode == 2 and "Traceback" in debug.stderr
