"""mlx-lm's ``tool_parsers.<family>`` modules and ``server`` helper names, checked against
mlx-lm 0.32 itself: the same markers, and ``parse_tool_call`` giving mlx-lm's result
(or raising ValueError where mlx-lm does) on calls written the way each family's models
write them, with and without a tool schema that types the parameters."""

import importlib
import json

import mlx.core as mx
import pytest

WEATHER_TOOLS = [{"type": "function", "function": {
    "name": "weather", "parameters": {"type": "object", "properties": {
        "zip": {"type": "string"}, "days": {"type": "integer"},
        "detail": {"type": "object"}, "note": {"type": ["string", "null"]}}}}}]

# family -> texts between the markers (several per family: one call, two calls, typed
# strings that look like numbers, nested values, text that is not a call).
CASES = {
    "json_tools": ['{"name": "weather", "arguments": {"zip": "02139", "days": 2}}'],
    "glm47": ["weather<arg_key>zip</arg_key><arg_value>02139</arg_value>"
              "<arg_key>days</arg_key><arg_value>2</arg_value>",
              'weather\n<arg_key>detail</arg_key>\n<arg_value>{"hourly": true}</arg_value>',
              '{"name": "weather", "arguments": {"zip": "1", "days": 3}}'],
    "laguna": ["weather<arg_key>zip</arg_key><arg_value>75001</arg_value>"],
    "longcat": ["weather<longcat_arg_key>days</longcat_arg_key>\n"
                "<longcat_arg_value>4</longcat_arg_value>",
                '{"name": "weather", "arguments": {"days": 4}}'],
    "qwen3_coder": ["<function=weather>\n<parameter=zip>\n02139\n</parameter>\n"
                    "<parameter=days>\n2\n</parameter>\n</function>",
                    "<function=weather><parameter=detail>{'hourly': False}</parameter>"
                    "<parameter=zip>9</parameter></function>",
                    "<function=other><parameter=x>[1, 2]</parameter>"
                    "<parameter=y>7</parameter></function>"],
    "minimax_m2": ['<invoke name="weather">\n<parameter name="days">5</parameter>\n</invoke>\n'
                   '<invoke name="clock">\n<parameter name="tz">UTC</parameter>\n</invoke>'],
    "gemma4": ['call:weather{zip:<|"|>02139<|"|>,days:2}',
               'call:a{x:{deep:[1,2]}}call:b-c{s:<|"|>{not: braces}<|"|>}'],
    "function_gemma": ["call:weather{zip:<escape>02139<escape>,days:2}"],
    "pythonic": ['[weather(zip="02139", days=2), clock(tz=None)]',
                 "[weather(detail={'a': [1, 2]})]", '[ok(flag=true, none=null)]',
                 'weather(zip="1")', "[bad-name(x=1)]"],
    "mistral": ['weather[ARGS]{"zip": "02139"} and some text after',
                'a[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{"y": [2, {"z": "[ARGS]"}]}',
                '[{"name": "weather", "arguments": "{\\"days\\": 1}", "id": "call1234"}]',
                "no call at all", 'a[ARGS]{"x": '],
    "kimi_k2": ['<|tool_call_begin|>functions.weather:0<|tool_call_argument_begin|>'
                '{"days": 1}<|tool_call_end|><|tool_call_begin|>functions.clock:1'
                '<|tool_call_argument_begin|>{}<|tool_call_end|>'],
    "kimi_k3": ['<|open|>call tool="weather" index="1"<|sep|><|open|>argument key="zip" '
                'type="string"<|sep|>02139<|close|>argument<|sep|><|open|>argument key="days" '
                'type="integer"<|sep|>2<|close|>argument<|sep|><|close|>call<|sep|>',
                '<|open|>call tool="a&amp;b" index="1"<|sep|><|open|>json type="object"<|sep|>'
                '{"k": [1]}<|close|>json<|sep|><|close|>call<|sep|><|open|>call tool="cut"',
                '<|open|>call index="1"<|sep|><|close|>call<|sep|>'],
    "minicpm5": ['<function name="weather"><param name="zip">02139</param>'
                 '<param name="days">2</param></function>',
                 "\"weather\"><param name='note'> hi </param><param name='days'>3",
                 '<function name="weather"><param name="zip"><![CDATA[ <x> ]]></param></function>'
                 '\n<function name="clock"></function>', "nothing here"],
    "muse_spark": ['<atem:invoke name="weather">\n<atem:parameter name="days">2</atem:parameter>'
                   '<atem:parameter name="zip">02139 </atem:parameter>\n</atem:invoke>',
                   '<atem:invoke name="a"></atem:invoke><atem:invoke name="b">'
                   '<atem:parameter name="l">[1]</atem:parameter></atem:invoke>'],
}


def _result(parse, text, tools):
    try:
        return parse(text, tools)
    except ValueError as e:  # both raise ValueError on text that is not a call
        return ValueError


@pytest.mark.parametrize("family", sorted(CASES))
def test_tool_parser_modules_match_mlx_lm(family):
    theirs = importlib.import_module(f"mlx_lm.tool_parsers.{family}")
    ours = importlib.import_module(f"mlx_lm_batched.tool_parsers.{family}")
    assert (ours.tool_call_start, ours.tool_call_end) == (theirs.tool_call_start,
                                                          theirs.tool_call_end)
    for text in CASES[family]:
        for tools in (None, WEATHER_TOOLS):
            expected = _result(theirs.parse_tool_call, text, tools)
            assert _result(ours.parse_tool_call, text, tools) == expected, (family, text, tools)


def test_server_tool_call_formatter_matches_mlx_lm():
    from mlx_lm import server as theirs
    from mlx_lm.tool_parsers import pythonic

    from mlx_lm_batched import server as ours

    text = ['[weather(zip="02139", days=2), clock(tz="UTC")]', "[cut(x=", '[one(a=[1, 2])]']
    for streaming in (False, True):
        got = ours.ToolCallFormatter(pythonic.parse_tool_call, None, streaming)(text)
        want = theirs.ToolCallFormatter(pythonic.parse_tool_call, None, streaming)(text)
        for entry in got + want:
            assert entry.pop("id")  # a fresh uuid on each side
        assert got == want


def test_server_sampling_names_match_mlx_lm():
    from mlx_lm import server as theirs

    from mlx_lm_batched import server as ours

    class Tokenizer:
        eos_token_ids = {2}

        def encode(self, text):
            return [5]

    settings = dict(temperature=0.0, top_p=0.9, top_k=3, min_p=0.0, xtc_probability=0.0,
                    xtc_threshold=0.1)
    logits = mx.log(mx.array([[0.1, 0.5, 0.2, 0.2]]))
    picked = []
    for module in (ours, theirs):
        args = type("Args", (), {"sampling": module.SamplingArguments(**settings)})
        picked.append(module._make_sampler(args, Tokenizer())(logits).tolist())
    assert picked[0] == picked[1] == [1]


@pytest.mark.parametrize("name", ["APIHandler", "ResponseGenerator"])
def test_server_http_classes_raise_one_line(name):
    from mlx_lm_batched import server

    with pytest.raises(NotImplementedError) as e:
        getattr(server, name)(None)
    assert "\n" not in str(e.value) and "create_app" in str(e.value)


def test_server_lru_prompt_cache_has_mlx_lm_methods():
    from mlx_lm.server import LRUPromptCache as Theirs

    from mlx_lm_batched.server import LRUPromptCache as Ours

    for method in ("fetch_nearest_cache", "insert_cache", "trim_to", "__len__"):
        assert callable(getattr(Theirs, method)) and callable(getattr(Ours, method))
    assert json.dumps(Ours(max_size=2).stats_by_type())  # the metrics the server reports
