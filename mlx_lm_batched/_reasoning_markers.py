"""The reasoning-block markers a model's chat output may use, listed once.

Both the tokenizer wrapper (``tokenization.markers``: mlx-lm's ``think_start`` /
``think_end``) and the chat-output parsers (``tool_parsers.families``: the reasoning
split of the server and ``run_batch``) look for them; those are sibling layers that may
not import each other, so the list lives here, below both.
"""

# (start, end) pairs that are one token each in the vocabularies that hold them, in
# mlx-lm's order of preference (``tokenizer_utils._infer_thinking``).
SINGLE_TOKEN_THINK = (("<think>", "</think>"), ("<longcat_think>", "</longcat_think>"),
                      ("<|think:start|>", "<|think:end|>"))

# Gemma 4 has no reasoning tokens of its own: its thought channel is the text
# "<|channel>thought" ... "<channel|>" (several tokens), found by the channel tokens.
GEMMA4_CHANNEL_TOKENS = ("<|channel>", "<channel|>")
GEMMA4_THOUGHT = ("<|channel>thought", "<channel|>")
