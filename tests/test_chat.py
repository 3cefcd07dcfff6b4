"""``python -m mlx_lm_batched.chat`` driven through a pseudo-terminal, as a user types."""

import os
import pty
import re
import select
import subprocess
import sys
import time

from conftest import model_dir

STATS = re.compile(r"\[prompt: (\d+) new tokens, (\d+) reused from the cache.*?"
                   r"generation: (\d+) tokens")


class Pty:
    """A child process on a pseudo-terminal: ``expect`` reads until a text shows up."""

    def __init__(self, args):
        master, slave = pty.openpty()
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, env=env,
                                     close_fds=True)
        os.close(slave)
        self.fd, self.seen = master, ""

    def expect(self, text, timeout=240):
        end = time.monotonic() + timeout
        while text not in self.seen:
            left = end - time.monotonic()
            assert left > 0, f"timed out waiting for {text!r}; got {self.seen[-2000:]!r}"
            ready, _, _ = select.select([self.fd], [], [], left)
            if ready:
                try:
                    chunk = os.read(self.fd, 4096)
                except OSError:  # the child closed the terminal
                    chunk = b""
                assert chunk, f"child ended before {text!r}; got {self.seen[-2000:]!r}"
                self.seen += chunk.decode("utf-8", "replace")
        before, _, self.seen = self.seen.partition(text)
        return before

    def send(self, line):
        os.write(self.fd, (line + "\n").encode())

    def close(self):
        """Kill the child if it still runs and close the terminal."""
        if self.proc.poll() is None:
            self.proc.kill()
        os.close(self.fd)


def test_chat_repl_reuses_the_conversation_cache():
    smol = model_dir("smollm2", dtype="float32")
    chat = Pty([sys.executable, "-m", "mlx_lm_batched.chat", "--model", str(smol),
                "--max-tokens", "12", "--system-prompt", "You are terse."])
    try:
        chat.expect(">> ")
        chat.send("Name a color.")
        first = STATS.search(chat.expect(">> "))
        new1, reused1, gen1 = map(int, first.groups())
        assert reused1 == 0 and new1 > 10 and gen1 >= 1

        chat.send("Another one?")
        reply = chat.expect(">> ")
        new2, reused2, _ = map(int, STATS.search(reply).groups())
        # Only the new turn is prefilled: the system prompt, the first question and
        # (all but at most its closing tokens) the first reply come from the cache.
        assert reused2 >= new1 + gen1 - 2, (reused2, new1, gen1)
        assert new2 < 20, new2

        chat.send("h")
        assert "'r' reset" in chat.expect(">> ")
        chat.send("r")
        assert "reset" in chat.expect(">> ")
        chat.send("Name a color.")
        new3, reused3, gen3 = map(int, STATS.search(chat.expect(">> ")).groups())
        assert (new3, reused3) == (new1, 0)  # a fresh conversation: nothing reused
        chat.send("q")
        chat.expect("bye")
        assert chat.proc.wait(timeout=60) == 0
    finally:
        chat.close()


def test_chat_rejects_bad_flags_in_one_line():
    proc = subprocess.run([sys.executable, "-m", "mlx_lm_batched.chat", "--max-kv-size", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: --max-kv-size must be at least 1, got 0"]
