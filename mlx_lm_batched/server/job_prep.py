"""A request's prompts as token lists, checked against the vocabulary and the context."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .errors import APIError
from .tool_format import generic_messages


@dataclass
class JobSpec:
    """What a route hands the engine: chat ``messages`` (+ ``tools``) or completion
    ``prompts`` (each a string or token ids), and the generation parameters."""

    params: Any  # schema.GenerationParams
    messages: Optional[List[dict]] = None
    tools: Optional[List[dict]] = None
    prompts: Optional[List[Any]] = None
    template_kwargs: Dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    output: Any = None  # tool_calls.ChatOutput of a chat request
    adapter: int = 0  # the adapter slot the request's model name picks (0: the base model)
    tool_format: Any = None  # tool_format.ToolFormat of the model (None: the template's own)


def _encode(spec, tokenizer):
    if spec.messages is not None:
        if not tokenizer.has_chat_template:
            raise APIError(400, "This model has no chat template; use /v1/completions.",
                           "messages", "no_chat_template")
        messages, tools = spec.messages, spec.tools or None
        if spec.tool_format is not None and spec.tool_format.generic:
            messages, tools = generic_messages(messages, tools), None
        try:
            ids = tokenizer.apply_chat_template(messages, tools=tools,
                                                add_generation_prompt=True, **spec.template_kwargs)
        except Exception as e:  # jinja raises on messages the template does not accept
            raise APIError(400, f"The chat template rejected 'messages': {e}", "messages",
                           "invalid_value") from None
        return [list(ids)], "messages"
    return [tokenizer.encode_prompt(p) if isinstance(p, str) else list(p) for p in spec.prompts], "prompt"


def prepare_prompts(spec, tokenizer, vocab_size, context_length, default_max_tokens):
    """``(token prompts, max_tokens per prompt)``; APIError(400) naming the field for an
    empty prompt, a token id outside the vocabulary, or a prompt (+ max_tokens) over
    ``context_length``."""
    prompts, field = _encode(spec, tokenizer)
    max_tokens = []
    for p in prompts:
        if not p:
            raise APIError(400, f"'{field}' is empty after tokenization: nothing to generate from.",
                           field, "invalid_value")
        bad = next((t for t in p if not 0 <= t < vocab_size), None)
        if bad is not None:
            raise APIError(400, f"Invalid value for '{field}': token id {bad} is outside the "
                           f"vocabulary [0, {vocab_size}).", field, "invalid_value")
        m = spec.params.max_tokens
        if context_length is not None:
            if len(p) >= context_length:
                raise APIError(400, f"This model's maximum context length is {context_length} "
                               f"tokens, but '{field}' has {len(p)} tokens.", field,
                               "context_length_exceeded")
            if m is not None and len(p) + m > context_length:
                raise APIError(400, f"This model's maximum context length is {context_length} "
                               f"tokens: '{field}' ({len(p)} tokens) plus 'max_tokens' ({m}) "
                               "is over it.", "max_tokens", "context_length_exceeded")
            if m is None:
                m = min(default_max_tokens, context_length - len(p))
        max_tokens.append(m if m is not None else default_max_tokens)
    for t in spec.params.stop_token_ids:
        if not 0 <= t < vocab_size:
            raise APIError(400, f"Invalid value for 'stop_token_ids': token id {t} is outside "
                           f"the vocabulary [0, {vocab_size}).", "stop_token_ids", "invalid_value")
    for t in spec.params.logit_bias:
        if t >= vocab_size:
            raise APIError(400, f"Invalid value for 'logit_bias': token id {t} is outside the "
                           f"vocabulary [0, {vocab_size}).", "logit_bias", "invalid_value")
    return prompts, max_tokens
