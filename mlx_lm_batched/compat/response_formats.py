"""mlx-lm's ``chat_templates.<family>.RESPONSE_FORMAT``: how a family's raw output
splits into reasoning, answer and tool calls, as the transitions of the text state
machine (``tool_parsers/state_machine.py``: ``make_text_state_machine`` reads them from
a tokenizer's ``response_transitions``; ``TokenizerWrapper(response_format=...)``)."""

# Muse Spark: a turn is several messages, each opened by a header naming its reader
# (``to=self``: reasoning; ``to=user`` / ``to=commentary``: the answer; a tool's name:
# a call); the header text itself belongs to no state's output.
MUSE_SPARK_RESPONSE_FORMAT = {
    "initial_state": "header",
    "transitions": {
        "header": [("to=self<|message|>", "reasoning"), ("to=user<|message|>", "normal"),
                   ("to=commentary<|message|>", "normal"), ("<atem:function_calls>", "tool")],
        "reasoning": [("<|eom|>", "header")],
        "normal": [("<|eom|>", "header"), ("<|eot|>", "normal")],
    },
}
