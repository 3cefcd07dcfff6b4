"""Every tool-call family streams its calls while they are generated: the call's id and
name first, then its arguments as JSON fragments that join to the whole call's
arguments. Checked on each family's real chat template (the assistant turn it renders,
as in test_tool_parsers), cut at every character and at random places, and on harder
texts in each family's format (strings holding the syntax's own delimiters, several
calls in a block, calls cut off by the end of the output) against the whole-text parse.
"""

import json
import random
import time

import pytest

from mlx_lm_batched.tool_parsers import FAMILIES, ChatOutputParser, detect_think_markers, get_family
from test_tool_parsers import CALLS, CONTENT, REASONING, TEMPLATES, model_output


def streamed(parser, pieces):
    """``(content, reasoning, {index: [(feed number, delta), ...]})`` of ``pieces`` fed
    one at a time (the last feed number is the end of the output)."""
    results = [parser.feed(p) for p in pieces] + [parser.finish()]
    calls = {}
    for n, r in enumerate(results):
        for delta in r["tool_calls"]:
            calls.setdefault(delta["index"], []).append((n, delta))
    return ("".join(r["content"] for r in results),
            "".join(r["reasoning_content"] for r in results), calls)


def joined(deltas):
    """``(name, arguments as parsed JSON)`` of one call's deltas, checking their shape:
    the first carries the id, type and name, the others only argument text."""
    first = deltas[0][1]
    assert first["id"].startswith("call_") and first["type"] == "function", first
    assert all(set(d) == {"index", "function"} and set(d["function"]) == {"arguments"}
               for _, d in deltas[1:]), deltas
    return first["function"]["name"], json.loads("".join(d["function"]["arguments"]
                                                         for _, d in deltas))


def test_every_family_has_a_stream():
    assert sorted(n for n, f in FAMILIES.items() if f.stream is None) == []


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_streams_its_template_calls(name):
    template = (TEMPLATES / f"{name}.jinja").read_text()
    prompt, text = model_output(name, template)
    think = detect_think_markers(template)
    in_reasoning = think is not None and prompt.rstrip().endswith(think[0])
    family = get_family(name)
    whole = ChatOutputParser(family, think, in_reasoning).parse(text)
    cuts = sorted(random.Random(1).sample(range(1, len(text)), 12))
    splits = [[text], list(text), [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]]
    for pieces in splits:
        parser = ChatOutputParser(family, think, in_reasoning, stream_calls=True)
        content, reasoning, calls = streamed(parser, pieces)
        assert (content, reasoning) == (whole["content"], whole["reasoning_content"]), name
        assert sorted(calls) == [0, 1] and parser.count == 2
        assert [joined(calls[i]) for i in (0, 1)] == CALLS, (name, calls)
    # One character per feed: each call opens, then its arguments grow over further feeds
    # (JSON text piece by piece, or one parameter at a time), all before the output ends.
    for index, deltas in calls_per_char(family, think, in_reasoning, text).items():
        feeds = sorted({n for n, _ in deltas})
        assert len(feeds) >= 3, (name, index, deltas)
        assert feeds[-1] < len(text), (name, index)  # not held until finish()
    # the template's answer text and reasoning really are in the turn (where it puts them)
    assert CONTENT in whole["content"] or name == "mistral"
    assert bool(whole["reasoning_content"]) == (REASONING in text)


def calls_per_char(family, think, in_reasoning, text):
    parser = ChatOutputParser(family, think, in_reasoning, stream_calls=True)
    return streamed(parser, list(text))[2]


# Harder texts in each family's own format: what the whole parse reads, the stream must
# send (and what it keeps as content, it must keep).
CASES = [
    ("qwen3_coder", 'A<tool_call>\n<function=f>\n<parameter=code>\nif a < b:\n    x = "<p>"\n'
                    '</parameter>\n<parameter=opts>\n{"k": [1, 2]}\n</parameter>\n</function>\n'
                    '<function=g>\n<parameter=n>\n5\n</parameter>\n</function>\n</tool_call>'),
    # a parameter without its closing tag ends at the next one
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</parameter>\n"
                    "</function>\n</tool_call>"),
    ("pythonic", '<|tool_call_start|>[f(a="x, y)", b=[1, (2, 3)], c={\'k\': None, '
                 '"q": \'it\\\'s\'}), mod.g()]<|tool_call_end|>rest'),
    ("gemma4", '<|tool_call>call:f{s:<|"|>a, b} c:d<|"|>,o:{x:1,y:<|"|>{z}<|"|>},l:[1,2],'
               't:true}<tool_call|>'),
    ("function_gemma", "<start_function_call>call:f{s:<escape>a, b}<escape>,n:-2.5}"
                       "<end_function_call>"),
    ("minimax_m2", '<minimax:tool_call>\n<invoke name="f">\n<parameter name="a">1</parameter>\n'
                   '<parameter name="b">x y</parameter>\n</invoke>\n<invoke name="g">\n</invoke>\n'
                   '</minimax:tool_call>'),
    ("glm47", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>[1]</arg_value>\n</tool_call>"
              "<tool_call>g</tool_call>"),  # a call without arguments comes whole
    ("longcat", '<longcat_tool_call>{"name": "a", "arguments": {"x": 1}}</longcat_tool_call>'),
    ("mistral", '[TOOL_CALLS]a[CALL_ID]abc123456[ARGS]{"x": "}"}[TOOL_CALLS]b[ARGS]{}'),
    # the older list form; an element written with "parameters" comes whole
    ("mistral", '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, '
                '{"name": "b", "parameters": {"y": 2}}]'),
    ("kimi_k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.a:0"
                '<|tool_call_argument_begin|>{"x": "<|"}<|tool_call_end|><|tool_call_begin|>'
                "functions.b:1<|tool_call_argument_begin|>{}<|tool_call_end|>"
                "<|tool_calls_section_end|>"),
    # cut off by the end of the output inside a parameter: the whole parse keeps the
    # partial value, and the stream closes the arguments with it
    ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\nx\n</parameter>\n"
                    "<parameter=b>\npart"),
]


@pytest.mark.parametrize("name,text", CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_streamed_calls_equal_the_whole_parse(name, text):
    family = get_family(name)
    whole = ChatOutputParser(family).parse(text)
    want = [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in whole["tool_calls"]]
    assert want  # each case is a call the whole parse reads
    for step in (1, 2, 5, len(text)):
        parser = ChatOutputParser(family, stream_calls=True)
        content, _, calls = streamed(parser, [text[i:i + step] for i in range(0, len(text), step)])
        assert content == whole["content"], (step, content)
        assert [joined(calls[i]) for i in sorted(calls)] == want, (step, calls)
        assert sorted(calls) == list(range(len(want))) and parser.count == len(want)


@pytest.mark.parametrize("name,text", [("gemma4", '<|tool_call>call:f{a:1,b:<|"|>unfinished'),
                                       ("gemma4", "<|tool_call>call:f{a:1,b:12"),
                                       ("pythonic", "<|tool_call_start|>[f(a=1, b=[1, 2"),
                                       ("pythonic", "<|tool_call_start|>[f(a=1, b=12")])
def test_a_call_cut_off_mid_parameter_streams_valid_json(name, text):
    # The whole parse needs the closing brace or parenthesis; the stream has sent the
    # parameters that were complete and closes the object at the end of the output.
    _, _, calls = streamed(ChatOutputParser(get_family(name), stream_calls=True), list(text))
    assert joined(calls[0]) == ("f", {"a": 1})


def test_a_streamed_call_is_not_taken_back():
    # A pythonic argument that is not a literal: the whole parse keeps the markup as
    # content, but the streamed call was opened before it was written; the value is
    # sent as its source text.
    text = "<|tool_call_start|>[f(a=1, b=foo)]<|tool_call_end|>"
    assert ChatOutputParser(get_family("pythonic")).parse(text)["tool_calls"] == []
    _, _, calls = streamed(ChatOutputParser(get_family("pythonic"), stream_calls=True), list(text))
    assert joined(calls[0]) == ("f", {"a": 1, "b": "foo"})


def test_markup_that_never_opens_a_call_stays_content():
    for name, text in [("qwen3_coder", "<tool_call>\nno function here\n</tool_call>"),
                       ("gemma4", "<|tool_call>not a call<tool_call|>"),
                       ("kimi_k2", "<|tool_calls_section_begin|>x<|tool_calls_section_end|>")]:
        family = get_family(name)
        content, _, calls = streamed(ChatOutputParser(family, stream_calls=True), list(text))
        assert (content, calls) == (text, {}), name


@pytest.mark.parametrize("name,head,tail", [
    ("qwen3_coder", "<tool_call>\n<function=write>\n<parameter=code>\n",
     "\n</parameter>\n</function>\n</tool_call>"),
    ("minimax_m2", '<minimax:tool_call><invoke name="write"><parameter name="code">',
     "</parameter></invoke></minimax:tool_call>"),
    ("glm47", "<tool_call>write<arg_key>code</arg_key><arg_value>", "</arg_value></tool_call>"),
])
def test_a_long_value_streams_in_linear_time(name, head, tail):
    # A 48 KB value fed 4 characters at a time (12,000 feeds): a reader that rescanned
    # the call at every feed took ~25 s here; appending costs ~0.2 s.
    code = "".join(f"    x{i} = compute({i}, 'a, b')  # step\n" for i in range(1200))
    text = head + code + tail
    parser = ChatOutputParser(get_family(name), stream_calls=True)
    started = time.perf_counter()
    _, _, calls = streamed(parser, [text[i:i + 4] for i in range(0, len(text), 4)])
    assert time.perf_counter() - started < 5
    whole = ChatOutputParser(get_family(name)).parse(text)["tool_calls"][0]["function"]
    assert joined(calls[0]) == ("write", json.loads(whole["arguments"]))
    assert len(json.loads(whole["arguments"])["code"]) > 47000
