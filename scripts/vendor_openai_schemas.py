"""Vendor the response schemas of OpenAI's OpenAPI document that the server's conformance
test validates against (``tests/test_server_conformance.py``).

The document (github.com/openai/openai-openapi, ``openapi.json``, ~3 MB) cannot be
downloaded at test time, so this keeps only the schemas the test needs, with every
``$ref`` resolved in place, ``nullable: true`` written as JSON Schema's ``anyOf`` with
null, and the prose (descriptions, examples) dropped:

    python scripts/vendor_openai_schemas.py openapi.json COMMIT > tests/data/openai_schemas.json
"""

import json
import sys

NEEDED = ["CreateChatCompletionResponse", "CreateChatCompletionStreamResponse",
          "CreateCompletionResponse", "ListModelsResponse", "ErrorResponse"]
DROP = {"description", "example", "examples", "x-oaiMeta", "x-oaiTypeLabel", "title",
        "x-stainless-const", "deprecated", "format"}


def resolve(node, schemas, seen=()):
    """``node`` with its ``$ref`` resolved (recursively) and prose keys dropped."""
    if isinstance(node, list):
        return [resolve(x, schemas, seen) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        name = node["$ref"].rsplit("/", 1)[-1]
        if name in seen:  # none of the needed schemas is recursive; refuse to loop
            raise ValueError(f"recursive schema {name}")
        out = resolve(schemas[name], schemas, seen + (name,))
        # A sibling ``nullable`` of a ``$ref`` (e.g. a stream chunk's ``usage``) still counts.
        return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") else out
    out = {k: resolve(v, schemas, seen) for k, v in node.items() if k not in DROP | {"nullable"}}
    # OpenAPI 3.0's ``nullable`` (still used in places) means nothing to JSON Schema.
    return {"anyOf": [out, {"type": "null"}]} if node.get("nullable") else out


def main(path, commit):
    doc = json.load(open(path))
    schemas = doc["components"]["schemas"]
    out = {"source": f"https://github.com/openai/openai-openapi/blob/{commit}/openapi.json",
           "commit": commit, "openapi_version": doc["info"]["version"],
           "schemas": {name: resolve(schemas[name], schemas) for name in NEEDED}}
    json.dump(out, sys.stdout, indent=None, separators=(",", ":"), sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(*sys.argv[1:3])
