"""Constrained decoding per row (sampling/grammar.py): 20 JSON schemas decoded in one
batch with unconstrained rows, each output parsed and validated; regex and Lark
constraints; bad constraints rejected with one line naming the field."""

import json

import jsonschema
import pytest

from mlx_lm_batched import batch_generate
from mlx_lm_batched.sampling.grammar import grammar_spec, make_grammar_processor

S = {"type": "string", "maxLength": 12}
SCHEMAS = [
    {"type": "object", "properties": {"name": S}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"]},
    {"type": "object", "properties": {"price": {"type": "number", "minimum": 0, "maximum": 10}},
     "required": ["price"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": S, "minItems": 1,
                                               "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"point": {
        "type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
        "required": ["x", "y"], "additionalProperties": False}}, "required": ["point"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9},
     "minItems": 2, "maxItems": 4},
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 18,
                                                         "maximum": 99}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"level": {"type": "string", "enum": ["low", "high"]},
                                      "score": {"type": "integer", "minimum": -5, "maximum": 5}},
     "required": ["level", "score"], "additionalProperties": False},
    {"type": "object", "properties": {"items": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "label": {"type": "string", "maxLength": 4}},
        "required": ["id", "label"], "additionalProperties": False}}}, "required": ["items"]},
    {"type": "string", "enum": ["yes", "no", "maybe"]},
    {"type": "integer", "minimum": 100, "maximum": 200},
    {"type": "integer", "exclusiveMinimum": 0, "maximum": 1000},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "profile": {"type": "object", "properties": {"city": S}, "required": ["city"],
                    "additionalProperties": False}},
        "required": ["profile"], "additionalProperties": False}}, "required": ["user"],
     "additionalProperties": False},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "maximum": 50},
                                                          {"type": "null"}]}},
     "required": ["value"], "additionalProperties": False},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
     "required": ["code"], "additionalProperties": False},
    {"type": "object", "properties": {"matrix": {"type": "array", "maxItems": 2, "items": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
        "maxItems": 2}}}, "required": ["matrix"], "additionalProperties": False},
    {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                      "c": {"const": "fixed"}},
     "required": ["a", "b", "c"], "additionalProperties": False},
    {"type": "object", "properties": {"title": S, "year": {"type": "integer", "minimum": 1900,
                                                           "maximum": 2030},
                                      "genres": {"type": "array", "maxItems": 2,
                                                 "items": {"enum": ["drama", "comedy"]}}},
     "required": ["title", "year", "genres"], "additionalProperties": False},
]


def _strict(schema):
    """OpenAI's strict mode: every object closes its properties."""
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if schema.get("type") == "object":
            schema.setdefault("additionalProperties", False)
    elif isinstance(schema, list):
        schema = [_strict(v) for v in schema]
    return schema


SCHEMAS = [_strict(s) for s in SCHEMAS]


def _chat(tokenizer, text):
    return tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                         add_generation_prompt=True)


def test_twenty_schemas_in_one_batch_parse_and_validate(float_models):
    model, tok = float_models["smollm2"]
    prompts, formats = [], []
    for i, schema in enumerate(SCHEMAS):
        prompts.append(_chat(tok, f"Answer in JSON. Example {i}."))
        formats.append({"type": "json_schema",
                        "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
    free = _chat(tok, "Say hello.")
    prompts.append(free)  # an unconstrained row in the same batch
    formats.append(None)
    out = batch_generate(model, tok, prompts, max_tokens=40, response_format=formats)
    cut = [(i, out.texts[i]) for i in range(len(SCHEMAS)) if out.finish_reasons[i] != "stop"]
    assert not cut
    for i, schema in enumerate(SCHEMAS):
        jsonschema.validate(json.loads(out.texts[i]), schema)
    alone = batch_generate(model, tok, [free], max_tokens=40)
    assert out.texts[-1] == alone.texts[0]  # the free row is untouched by its batch mates


def test_json_object_regex_and_lark_rows_together(float_models):
    model, tok = float_models["smollm2"]
    prompts = [_chat(tok, "Give a JSON object about a cat."), _chat(tok, "What day is it?"),
               _chat(tok, "Which pet is best?")]
    rows = [[make_grammar_processor(tok, {"type": "json_object"})],
            [make_grammar_processor(tok, regex=r"[0-9]{4}-[0-9]{2}-[0-9]{2}")],
            [make_grammar_processor(tok, grammar='start: "cat" | "dog"')]]
    out = batch_generate(model, tok, prompts, max_tokens=40, logits_processors=rows)
    assert isinstance(json.loads(out.texts[0]), dict)
    assert out.texts[1][:4].isdigit() and len(out.texts[1]) == 10 and out.texts[1][4] == "-"
    assert out.texts[2] in ("cat", "dog")
    assert out.finish_reasons == ["stop"] * 3


@pytest.mark.parametrize("kwargs,message", [
    ({"response_format": {"type": "xml"}}, "response_format: unsupported type 'xml'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "bogus"}}}},
     "response_format: Invalid type: bogus"),
    ({"regex": "("}, "regex:"),
    ({"grammar": "start: ("}, "grammar:"),
    ({"response_format": {"type": "json_object"}, "regex": "a"}, "at most one"),
])
def test_bad_constraints_name_their_field(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        grammar_spec(**kwargs)


def test_text_format_is_no_constraint(float_models):
    _, tok = float_models["smollm2"]
    assert make_grammar_processor(tok, {"type": "text"}) is None
    with pytest.raises(ValueError, match="one entry"):
        batch_generate(*float_models["smollm2"], ["a", "b"], max_tokens=1,
                       response_format=[{"type": "json_object"}])


def test_cli_json_schema(tmp_path, float_dirs):
    from test_cli import assert_one_line_error, records, run_cli

    schema = SCHEMAS[8]  # name and age, closed
    path = tmp_path / "person.json"
    path.write_text(json.dumps(schema))
    proc = run_cli("--model", float_dirs["smollm2"], "--prompt", "Describe Ada as JSON.",
                   "--prompt", "Describe Alan as JSON.", "--json-schema", path,
                   "--max-tokens", 40, "--jsonl", "-", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    recs = records(proc.stdout)
    assert len(recs) == 2
    for r in recs:
        jsonschema.validate(json.loads(r["text"]), schema)
    path.write_text('{"type": "bogus"}')
    assert_one_line_error(run_cli("--prompt", "x", "--json-schema", path), "--json-schema")
