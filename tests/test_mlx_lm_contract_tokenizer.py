"""The tokenizer wrapper's reasoning and tool-call properties match mlx-lm 0.32's on real
tokenizers: SmolLM2's as shipped, with each family's real chat template (tests/data),
and with reasoning tokens added. mlx-lm is the oracle only."""

import json
import shutil
from pathlib import Path

import mlx_lm.tokenizer_utils as lm_tok
import pytest

from mlx_lm_batched.tokenizer_utils import load as load_tokenizer

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
PROPERTIES = ("has_thinking", "think_start", "think_end", "think_start_tokens",
              "think_end_tokens", "has_tool_calling", "tool_call_start", "tool_call_end",
              "tool_call_start_tokens", "tool_call_end_tokens", "structural_markers",
              "response_transitions", "response_initial_state")
# One call in each family's own markup, as the model writes it between the markers.
CALLS = {
    "json_tools": '{"name": "get_weather", "arguments": {"city": "Paris"}}',
    "qwen3_coder": "<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>",
    "pythonic": '[get_weather(city="Paris")]',
}


def tokenizer_dir(float_dirs, tmp_path, template=None, add_tokens=()):
    """A copy of SmolLM2's tokenizer files, with ``template`` as its chat template and
    ``add_tokens`` added as special tokens."""
    src, out = Path(float_dirs["smollm2"]), tmp_path / "tok"
    out.mkdir()
    for f in src.iterdir():
        if f.suffix in (".json", ".jinja", ".txt", ".model") and "safetensors" not in f.name:
            shutil.copy(f, out / f.name)
    (out / "chat_template.jinja").unlink(missing_ok=True)
    if template is not None or add_tokens:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(out))
        if add_tokens:
            tok.add_special_tokens({"additional_special_tokens": list(add_tokens)})
        if template is not None:
            tok.chat_template = template
        tok.save_pretrained(str(out))
    return out


def same_properties(ours, theirs):
    for name in PROPERTIES:
        assert getattr(ours, name) == getattr(theirs, name), name


def test_plain_tokenizer_has_no_markup(float_dirs, tmp_path):
    path = tokenizer_dir(float_dirs, tmp_path)
    ours, theirs = load_tokenizer(path), lm_tok.load(path)
    same_properties(ours, theirs)
    assert not ours.has_thinking and ours.tool_parser is None


@pytest.mark.parametrize("family", sorted(p.stem for p in TEMPLATES.glob("*.jinja")))
def test_tool_markup_from_real_templates(float_dirs, tmp_path, family):
    path = tokenizer_dir(float_dirs, tmp_path, (TEMPLATES / f"{family}.jinja").read_text())
    ours, theirs = load_tokenizer(path), lm_tok.load(path)
    same_properties(ours, theirs)
    assert ours.has_tool_calling
    if family in CALLS:
        expected = theirs.tool_parser(CALLS[family], None)
        got = ours.tool_parser(CALLS[family], None)
        assert json.loads(json.dumps(got)) == json.loads(json.dumps(expected))
        assert got["name"] == "get_weather"


@pytest.mark.parametrize("pair", [("<think>", "</think>"), ("<|channel>", "<channel|>")])
def test_reasoning_markers_from_the_vocabulary(float_dirs, tmp_path, pair):
    path = tokenizer_dir(float_dirs, tmp_path, add_tokens=pair)
    ours, theirs = load_tokenizer(path), lm_tok.load(path)
    same_properties(ours, theirs)
    assert ours.has_thinking
    text = "a <think> b </think> c <think> d" if pair[0] == "<think>" else "x"
    tokens = ours.encode(text, add_special_tokens=False)
    for name in ("find_think_start", "rfind_think_start", "find_think_end", "rfind_think_end"):
        assert getattr(ours, name)(tokens) == getattr(theirs, name)(tokens), name
    if pair[0] == "<think>":
        assert ours.think_start_id == theirs.think_start_id
        assert ours.rfind_think_start(tokens) > ours.find_think_start(tokens) >= 0
    else:  # multi-token markers: mlx-lm's error, one line naming the alternative
        with pytest.raises(ValueError, match="think_start_tokens"):
            ours.think_start_id


def test_the_vocabulary_is_read_once_per_wrapper(float_dirs, tmp_path, monkeypatch):
    # Loading (tool-call markup), the reasoning and structural markers, add_eos_token and
    # the server's reasoning split all read one listing of the vocabulary.
    from transformers import AutoTokenizer

    from mlx_lm_batched.server.tool_calls import chat_output

    path = tokenizer_dir(float_dirs, tmp_path, (TEMPLATES / "json_tools.jinja").read_text(),
                         add_tokens=("<think>", "</think>"))
    cls = type(AutoTokenizer.from_pretrained(str(path)))
    reads = []
    listing = cls.get_vocab
    monkeypatch.setattr(cls, "get_vocab", lambda self: reads.append(1) or listing(self))
    ours = load_tokenizer(path)
    for _ in range(2):
        assert ours.has_tool_calling and ours.has_thinking and ours.structural_markers == ()
        ours.add_eos_token("</think>")
        assert chat_output(ours, [{"role": "user", "content": "hi"}], None, None, {}).think == (
            "<think>", "</think>")
    assert len(reads) == 1
    assert ours.vocab == listing(ours._tokenizer) and ours.vocab["</think>"] in ours.eos_token_ids


@pytest.mark.parametrize("family", ["json_tools", "pythonic", "mistral"])
def test_text_state_machine_for_a_tokenizer_follows_mlx_lms(float_dirs, tmp_path, family):
    """``make_text_state_machine`` over a reasoning + tool-call tokenizer splits streamed
    text exactly as mlx-lm's (same emitted text and states, chunk by chunk)."""
    import random
    import sys

    import mlx_lm.generate  # noqa: F401

    from mlx_lm_batched.generate import make_text_state_machine

    lm_make = sys.modules["mlx_lm.generate"].make_text_state_machine
    path = tokenizer_dir(float_dirs, tmp_path, (TEMPLATES / f"{family}.jinja").read_text(),
                         add_tokens=("<think>", "</think>"))
    ours, theirs = load_tokenizer(path), lm_tok.load(path)
    start, end = ours.tool_call_start, ours.tool_call_end
    text = (f"<think>plan it{start}x{end}</think>Answer STOP here {start}"
            f'{{"name": "f"}}{end} tail <thi')
    machines = [make_text_state_machine(ours, ["STOP"]), lm_make(theirs, ["STOP"])]
    states = [m.make_state() for m in machines]
    rng = random.Random(family)
    at, outputs = 0, ([], [])
    while at < len(text):
        chunk = text[at:at + rng.randint(1, 5)]
        at += len(chunk)
        for i, m in enumerate(machines):
            states[i], emitted, name = m.step(states[i], chunk)
            outputs[i].append((emitted, name))
    assert outputs[0] == outputs[1]
    flushed = [m.flush(s)[1:] for m, s in zip(machines, states)]
    # A call without an end marker (Mistral's) runs to the end of the text.
    assert flushed[0] == flushed[1] == (("<thi", "normal") if end else ("", "tool"))
    assert {name for _, name in outputs[0]} >= {"reasoning", "tool", "normal"}
