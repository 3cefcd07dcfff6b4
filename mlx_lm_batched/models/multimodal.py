"""The language model of a multimodal checkpoint: its config nests the text model's
fields under ``text_config`` and its weights carry a ``language_model.`` prefix next
to vision/audio towers, which text generation ignores.

A family file subclasses the text family's classes with :class:`TextConfigArgs`
first and calls :func:`language_model_weights` in ``sanitize``."""

import dataclasses
import functools

# Top-level modules of multimodal checkpoints that are not the language model.
NON_TEXT_MODULES = ("vision_tower", "vision_model", "visual", "multi_modal_projector",
                    "audio_tower", "embed_vision", "embed_audio", "vision_embed",
                    "image_newline", "patch_merger", "mm_projector", "vision_embedder",
                    "patch_merge_mlp")


def text_config(config):
    """Flatten ``text_config`` into the config: the text model's fields win (but
    ``tie_word_embeddings``, which the outer model applies), the outer config fills
    what it lacks, and ``model_type`` stays the outer one (the
    registry's name for the checkpoint); the text model's is ``text_model_type``."""
    text = config.get("text_config")
    if not isinstance(text, dict):
        return config
    merged = {k: v for k, v in config.items()
              if k not in ("text_config", "vision_config", "audio_config")}
    merged.update({k: v for k, v in text.items() if k != "model_type"})
    if "model_type" in text:
        merged["text_model_type"] = text["model_type"]
    if "tie_word_embeddings" in config:  # transformers ties at the outer model
        merged["tie_word_embeddings"] = config["tie_word_embeddings"]
    return merged


def language_model_weights(weights):
    """Map the language model's weights to the text family's names and drop the rest.

    Handles both layouts in the wild: ``language_model.model.*`` /
    ``language_model.lm_head.*`` (transformers 4 and ``save_pretrained``) and
    ``model.language_model.*`` with a top-level ``lm_head.*`` (transformers 5 in
    memory). Names already in the text family's form pass through unchanged.
    """
    out = {}
    for key, value in weights.items():
        if key.startswith("language_model."):
            key = key[len("language_model."):]
            if not key.startswith(("model.", "lm_head.")):
                key = "model." + key
        elif key.startswith("model.language_model."):
            key = "model." + key[len("model.language_model."):]
        first = key.split(".")[1] if key.startswith("model.") else key.split(".")[0]
        if first in NON_TEXT_MODULES:
            continue
        out[key] = value
    return out


class TextConfigArgs:
    """Mixin for a ``ModelArgs`` dataclass: ``from_dict`` reads ``text_config``
    (decorate the dataclass with :func:`accepts_text_config` for the constructor).
    The built args keep the nested dict as ``text_config`` (mlx-lm's attribute, which
    code writing a config back reads); the flattened fields are what the model uses."""

    @classmethod
    def from_dict(cls, params):
        args = super().from_dict(text_config(params))
        nested = params.get("text_config")
        args.text_config = dict(nested) if isinstance(nested, dict) else None
        return args


def accepts_text_config(cls):
    """Class decorator (outside ``@dataclass``): the constructor also takes mlx-lm's
    ``text_config=`` (a dict or mlx-lm's text-args dataclass) and then builds what
    ``from_dict`` builds from the keywords and ``text_config`` (the config's keys that
    are no field are dropped there). A subclass's ``@dataclass`` writes a new
    ``__init__``, so each multimodal ``ModelArgs`` carries the decorator itself."""
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, *args, text_config=None, **kwargs):
        if text_config is None:
            init(self, *args, **kwargs)
            return
        if dataclasses.is_dataclass(text_config) and not isinstance(text_config, type):
            # mlx-lm's multimodal args hold their text settings as a dataclass
            text_config = dataclasses.asdict(text_config)
        if args or not isinstance(text_config, dict):
            raise TypeError("with text_config (a dict or dataclass), pass the other fields "
                            "as keywords")
        built = type(self).from_dict(dict(kwargs, text_config=text_config))
        self.__dict__.update(vars(built))

    cls.__init__ = __init__
    return cls


def text_rope_scaling(scaling):
    """Multimodal RoPE reduced to the text case: with text only, every position
    component (time, height, width) equals the token position, so M-RoPE (Qwen-VL's
    ``mrope_section`` / ``"type": "mrope"``) is the plain rotation. Other scalings
    are kept; the M-RoPE keys are dropped."""
    if not isinstance(scaling, dict):
        return scaling
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind in ("mrope", "default", None):
        return None
    return {k: v for k, v in scaling.items()
            if k not in ("mrope_section", "mrope_interleaved")}


def check_text_model_type(args, allowed):
    """ValueError unless the nested text model is one this family implements."""
    found = getattr(args, "text_model_type", None)
    if found is not None and found not in allowed:
        raise ValueError(f"{args.model_type}: text_config.model_type '{found}' is not supported "
                         f"(supported: {', '.join(allowed)})")
