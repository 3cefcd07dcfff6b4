"""Nothing lost: output paths are checked before the model loads, outputs are written
as each prompt finishes, and Ctrl-C keeps every finished prompt."""

import os
import signal
import subprocess
import time

import test_cli as base


def test_bad_output_paths_fail_before_the_model_loads(tmp_path):
    """A model that does not exist would be the error if the model loaded first."""
    missing_model = tmp_path / "no-such-model"
    a_file = tmp_path / "taken"
    a_file.write_text("x")
    good_dir = tmp_path / "good"
    cases = [
        (["--output-dir", a_file], "exists and is not a directory"),
        (["--output-dir", "/dev/null/out"], "--output-dir '/dev/null/out' is not writable"),
        (["--jsonl", tmp_path / "nodir" / "r.jsonl"], "cannot write --jsonl"),
        (["--jsonl", tmp_path], "is a directory"),
        (["--output-dir", good_dir, "--jsonl", "/dev/null/r.jsonl"], "cannot write --jsonl"),
    ]
    for args, fragment in cases:
        proc = base.run_cli("--model", missing_model, "--prompt", "hi", *args)
        base.assert_one_line_error(proc, fragment, code=2)
        assert "no-such-model" not in proc.stderr
    assert os.listdir(good_dir) == []  # created, checked, nothing generated


def wait_for(predicate, proc, timeout=300):
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.2)
    return False


def popen_cli(*args):
    """The CLI as a terminal starts it: SIGINT at its default, even where this test runs
    with SIGINT ignored (a background job of a non-interactive shell), which the CLI,
    like Python, rightly keeps ignored."""
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    return subprocess.Popen([*base.CLI, *map(str, args)], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def mlx_loaded(pid):
    """Whether the process has mapped MLX's library (it is inside the heavy imports)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            return "libmlx" in f.read()
    except OSError:
        return False


def test_ctrl_c_while_starting_prints_one_line():
    # From the moment MLX's library is mapped (inside `import mlx.core`: a
    # KeyboardInterrupt there aborts the process) through the model load.
    for delay in (0.0, 0.3, 1.0):
        proc = popen_cli("--prompt", "hi", "--max-tokens", 4)
        # Past interpreter start-up (before it Python's own handler prints a traceback).
        # Without /proc, a second is enough.
        if os.path.exists(f"/proc/{proc.pid}/maps"):
            assert wait_for(lambda: mlx_loaded(proc.pid), proc, timeout=120)
        else:
            time.sleep(1.0)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, (delay, err)
        assert "Traceback" not in err
        (line,) = err.splitlines()
        assert line.startswith("error: interrupted while "), line


def test_ctrl_c_during_generation_keeps_finished_prompts(tmp_path, float_dirs):
    short = tmp_path / "short.txt"
    short.write_text("Say hi.")
    longer = tmp_path / "story.txt"
    longer.write_text("Write a very long story about a lighthouse keeper and the sea.")
    longest = tmp_path / "essay.txt"
    longest.write_text("Write a long essay about the history of lighthouses around the world.")
    out_dir, jsonl = tmp_path / "out", tmp_path / "r.jsonl"
    # Batches of one: the shortest prompt runs first and finishes (EOS or 24 tokens)
    # while the others have not; each later one needs far more steps than it gets.
    proc = popen_cli("--model", float_dirs["smollm2"], "--prompts", longest, longer, short,
                     "--batch-size", 1, "--max-tokens", 24, "--output-dir", out_dir,
                     "--jsonl", jsonl, "--no-progress")
    first = out_dir / "short.out.txt"
    assert wait_for(first.exists, proc), proc.communicate()[1]
    proc.send_signal(signal.SIGINT)
    sent = time.time()
    out, err = proc.communicate(timeout=120)
    assert time.time() - sent < 30  # within a decode step or a prefill chunk (loaded CI CPU)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    (line,) = base.error_lines(subprocess.CompletedProcess([], 130, out, err))
    assert line.startswith("error: interrupted while generating") and "of 3 prompts finished" in line
    recs = base.records(jsonl.read_text())
    done = int(line.split("error: interrupted while generating: ")[1].split(" of")[0])
    assert 1 <= done < 3 and len(recs) == done
    assert recs[0]["source"] == str(short) and recs[0]["text"] == first.read_text()
    assert sorted(os.listdir(out_dir)) == sorted(os.path.basename(r["output"]) for r in recs)
