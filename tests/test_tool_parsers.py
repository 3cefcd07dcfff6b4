"""Tool-call and reasoning parsing per family, on the real chat template of a model of
each family (tests/data/chat_templates/, each naming its source; LongCat's is the one
hand-written exception), rendered as transformers renders it, whole and split across
tokens at every position."""

import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest
from mlx_lm import tokenizer_utils as mlx_lm_tokenizer_utils
from mlx_lm.tool_parsers import longcat as mlx_lm_longcat
from transformers.utils.chat_template_utils import render_jinja_template

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
TOOLS = [{"type": "function", "function": {
             "name": "get_weather", "description": "Current weather in a city.",
             "parameters": {"type": "object", "required": ["city"], "properties": {
                 "city": {"type": "string", "description": "City name."},
                 "days": {"type": "integer", "description": "Days ahead."}}}}},
         {"type": "function", "function": {
             "name": "search", "description": "Search the web.",
             "parameters": {"type": "object", "required": ["query"], "properties": {
                 "query": {"type": "string", "description": "What to look for."},
                 "limit": {"type": "array", "items": {"type": "integer"},
                           "description": "First and last result."}}}}}]
CONTENT, REASONING = "Let me check.", "The user wants the weather."
# What each family's API puts in a call's id, where its template writes it into the turn
# (Mistral insists on 9 alphanumerics; Kimi's ids name the function).
CALL_IDS = {"mistral": ["a1B2c3D4e", "f5G6h7I8j"],
            "kimi_k2": ["functions.get_weather:0", "functions.search:1"]}
# LiteRT-LM's FunctionGemma template takes argument values already written in the
# model's value syntax (its runtime formats them before rendering).
ARGUMENT_TEXT = {"function_gemma": lambda v: (f"<escape>{v}<escape>" if isinstance(v, str)
                                              else json.dumps(v, separators=(",", ":")))}
# The tokens an assistant turn ends on after its calls (generation stops there).
TURN_ENDS = ("<|im_end|>", "</s>", "[e~[", "<|tool_response>", "<start_function_response>")


def render(template, messages, **kwargs):
    """The template rendered as transformers' apply_chat_template renders it (thinking on:
    the turn then holds its reasoning where the model writes it)."""
    rendered, _ = render_jinja_template([messages], tools=TOOLS, chat_template=template,
                                        bos_token="<s>", eos_token="</s>",
                                        enable_thinking=True, **kwargs)
    return rendered[0]


def assistant_turn(name):
    format_value = ARGUMENT_TEXT.get(name, lambda v: v)
    calls = [{"type": "function", "function": {
                 "name": n, "arguments": {k: format_value(v) for k, v in a.items()}}}
             for n, a in CALLS]
    for call, call_id in zip(calls, CALL_IDS.get(name, [])):
        call["id"] = call_id
    # reasoning_content is what OpenAI-style clients send back; LFM2 reads `thinking`.
    return {"role": "assistant", "content": CONTENT, "reasoning_content": REASONING,
            "thinking": REASONING, "tool_calls": calls}


def model_output(name, template):
    """``(prompt, text)``: the generation prompt and what the model is trained to emit
    after it (the assistant turn as the template renders it, its end token excluded)."""
    user = [{"role": "user", "content": "Weather in Paris?"}]
    prompt = render(template, user, add_generation_prompt=True)
    full = render(template, user + [assistant_turn(name)])
    assert full.startswith(prompt), name
    text = full[len(prompt):].rstrip("\n")
    for end in TURN_ENDS:
        text = text.removesuffix(end)
    return prompt, text


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


def test_the_templates_are_the_real_ones_and_say_where_they_come_from():
    for path in sorted(TEMPLATES.glob("*.jinja")):
        first = path.read_text().splitlines()[0]
        assert first.startswith("{#- Source: ") or first.startswith("{#- Hand-written"), path
    hand_written = [p.stem for p in TEMPLATES.glob("*.jinja")
                    if p.read_text().startswith("{#- Hand-written")]
    assert hand_written == ["longcat"]  # no real LongCat template in the stored corpus


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_parses_its_template_markup_whole_and_split(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    assert detect_family(template).name == name
    # ... and mlx-lm's own inference picks the same parser for the template.
    oracle = SimpleNamespace(chat_template=template, get_vocab=dict)
    assert mlx_lm_tokenizer_utils._infer_tool_parser(oracle) == name
    prompt, text = model_output(name, template)
    think = detect_think_markers(template)
    in_reasoning = think is not None and prompt.rstrip().endswith(think[0])
    # What the template put in the turn is what the parser must give back.
    want_content = CONTENT if CONTENT in text else ""
    want_reasoning = REASONING if REASONING in text else ""
    family = get_family(name)
    rng = random.Random(0)
    splits = [[text], list(text)]  # whole, and one character per token
    cuts = sorted(rng.sample(range(1, len(text)), 12))
    splits.append([text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])])
    for pieces in splits:
        parser = ChatOutputParser(family, think, in_reasoning=in_reasoning)
        content, reasoning, calls = run_stream(parser, pieces)
        assert content.strip() == want_content, (name, content)
        assert reasoning.strip() == want_reasoning, (name, reasoning)
        assert as_pairs(calls) == CALLS, (name, calls)
        assert [c["index"] for c in calls] == [0, 1]
        assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)


def test_the_real_templates_carry_answer_text_and_reasoning_beside_their_calls():
    """Guards the test above against passing vacuously: most real templates render the
    answer text and the reasoning of a tool-calling turn, so the parser must split them."""
    outputs = {n: model_output(n, (TEMPLATES / f"{n}.jinja").read_text())[1] for n in FAMILIES}
    with_content = sorted(n for n, t in outputs.items() if CONTENT in t)
    with_reasoning = sorted(n for n, t in outputs.items() if REASONING in t)
    assert with_content == sorted(set(FAMILIES) - {"mistral"})  # Mistral drops the text
    assert with_reasoning == ["gemma4", "glm47", "json_tools", "kimi_k2", "minimax_m2",
                              "pythonic"]


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


@pytest.mark.parametrize("pair", [("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"),
                                  ("<|think:start|>", "<|think:end|>")])
def test_reasoning_markers_are_the_tokenizer_wrappers(pair):
    # The reasoning split finds the pairs mlx-lm's tokenizer wrapper finds (one list for
    # both layers): in a vocabulary, and in a template that writes them.
    vocab = {"a": 0, pair[0]: 1, pair[1]: 2}
    theirs = mlx_lm_tokenizer_utils._infer_thinking(SimpleNamespace(get_vocab=lambda: vocab))
    assert detect_think_markers(None, vocab) == theirs[:2] == pair
    assert detect_think_markers(f"{{% if r %}}{pair[0]}{{{{ r }}}}{pair[1]}{{% endif %}}") == pair


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


def test_longcat_reads_json_and_key_value_calls_as_mlx_lm_does():
    family = get_family("longcat")
    text = ("Sure.<longcat_tool_call>get_weather\n<longcat_arg_key>city</longcat_arg_key>\n"
            "<longcat_arg_value>Paris</longcat_arg_value>\n<longcat_arg_key>days</longcat_arg_key>"
            "<longcat_arg_value>3</longcat_arg_value>\n</longcat_tool_call>")
    for pieces in ([text], list(text)):
        content, _, calls = run_stream(ChatOutputParser(family), pieces)
        assert (content, as_pairs(calls)) == ("Sure.", [("get_weather", {"city": "Paris", "days": 3})])
    body = text.split("<longcat_tool_call>")[1].split("</longcat_tool_call>")[0]
    assert mlx_lm_longcat.parse_tool_call(body) == {"name": "get_weather",
                                                    "arguments": {"city": "Paris", "days": 3}}


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
