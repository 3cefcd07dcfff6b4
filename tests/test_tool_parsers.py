"""Tool-call and reasoning parsing per family, on the tool-call markup of each family's
chat template (tests/data/chat_templates/, rendered with Jinja as transformers does)
and on that output split across tokens at every position."""

import json
import random
from pathlib import Path

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mlx_lm_batched.tool_parsers import (
    FAMILIES,
    ChatOutputParser,
    TextStateMachine,
    detect_family,
    detect_think_markers,
    get_family,
    select_family,
)

TEMPLATES = Path(__file__).parent / "data" / "chat_templates"
CALLS = [("get_weather", {"city": "Paris", "days": 3}),
         ("search", {"query": "Eiffel Tower {height}", "limit": [1, 2]})]


def render(template, messages, **kwargs):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda x, ensure_ascii=False: json.dumps(x, ensure_ascii=ensure_ascii)
    return env.from_string(template).render(messages=messages, **kwargs)


def model_output(template, content, calls):
    """What the model is trained to emit after the generation prompt (its turn's end
    token excluded: generation stops on it)."""
    user = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = render(template, user, add_generation_prompt=True)
    tool_calls = [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]
    full = render(template, user + [{"role": "assistant", "content": content,
                                     "tool_calls": tool_calls}])
    assert full.startswith(prompt.rstrip("\n"))
    return full[len(prompt.rstrip("\n")):].removesuffix("<|im_end|>\n")


def run_stream(parser, pieces):
    content, reasoning, calls = "", "", []
    for piece in pieces:
        for out in (parser.feed(piece),):
            content += out["content"]
            reasoning += out["reasoning_content"]
            calls += out["tool_calls"]
    out = parser.finish()
    return content + out["content"], reasoning + out["reasoning_content"], calls + out["tool_calls"]


def as_pairs(calls):
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_parses_its_template_markup_whole_and_split(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    assert detect_family(template).name == name  # auto-selected as mlx-lm does
    text = model_output(template, "Let me check.", CALLS)
    family = get_family(name)
    rng = random.Random(0)
    splits = [[text], list(text)]  # whole, and one character per token
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    splits.append([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])])
    for pieces in splits:
        content, reasoning, calls = run_stream(ChatOutputParser(family), pieces)
        assert content.strip() == "Let me check.", (name, content)
        assert reasoning == ""
        assert as_pairs(calls) == CALLS, (name, calls)
        assert [c["index"] for c in calls] == [0, 1]
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_no_partial_markup_reaches_the_content_while_streaming():
    parser = ChatOutputParser(get_family("json_tools"))
    text = 'Sure <tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'
    seen = ""
    for ch in text:
        seen += parser.feed(ch)["content"]
        assert "<" not in seen  # '<', '<tool', ... are held back, never sent
    assert seen == "Sure "


def test_reasoning_is_split_streamed_and_opened_by_the_prompt():
    think = detect_think_markers("{% if x %}<think>{% endif %}</think>")
    family = get_family("json_tools")
    text = ('<think>The user wants weather.</think>\n\nChecking.<tool_call>\n'
            '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    for pieces in ([text], list(text)):
        content, reasoning, calls = run_stream(ChatOutputParser(family, think), pieces)
        assert (reasoning, content.strip()) == ("The user wants weather.", "Checking.")
        assert as_pairs(calls) == [("get_weather", {"city": "Paris"})]
    # A template that ends its generation prompt with <think> (DeepSeek-R1, Qwen3 thinking):
    out = ChatOutputParser(None, think, in_reasoning=True).parse("Plan.</think>Answer.")
    assert (out["reasoning_content"], out["content"]) == ("Plan.", "Answer.")
    # Without think markers the text is the answer, tags and all.
    assert ChatOutputParser().parse("<think>a</think>b")["content"] == "<think>a</think>b"


def test_a_block_that_is_not_a_call_stays_in_the_content():
    family = get_family("json_tools")
    text = "A <tool_call>not json</tool_call> B"
    assert run_stream(ChatOutputParser(family), list(text)) == (text, "", [])
    # cut off by max_tokens inside a block: the open markup comes back as text
    content, _, calls = run_stream(ChatOutputParser(family), ['x <tool_call>{"name": "f"'])
    assert (content, calls) == ('x <tool_call>{"name": "f"', [])


def test_mistral_calls_run_to_the_end_and_split_on_each_marker():
    family = get_family("mistral")
    text = '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{"y": "z"}'
    _, _, calls = run_stream(ChatOutputParser(family), list(text))
    assert as_pairs(calls) == [("a", {"x": 1}), ("b", {"y": "z"})]
    legacy = '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}]'
    assert as_pairs(ChatOutputParser(family).parse(legacy)["tool_calls"]) == [("a", {"x": 1})]


def test_selection_by_name_and_errors():
    assert select_family("<tool_call>{{ tool_call.name }}", "pythonic").name == "pythonic"
    assert select_family("{{ messages }}") is None
    with pytest.raises(ValueError, match="unknown tool parser 'nope'; known: function_gemma"):
        select_family("", "nope")


def test_text_state_machine_has_mlx_lm_interface():
    from mlx_lm_batched.generate import TextStateMachine as from_generate

    assert from_generate is TextStateMachine
    sm = TextStateMachine({"normal": [("<think>", "reasoning"), ("<tool_call>", "tool")],
                           "reasoning": [("</think>", "normal")],
                           "tool": [("</tool_call>", "normal")]})
    state = sm.make_state()
    state, text, name = TextStateMachine.step(state, "a<thi")
    assert (text, name) == ("a", "normal")
    state, segments = TextStateMachine.split(state, "nk>b</think>c<tool")
    assert segments == [("normal", ""), ("reasoning", "b"), ("normal", "c")]
    state, rest, name = TextStateMachine.flush(state)
    assert (rest, name) == ("<tool", "normal")
