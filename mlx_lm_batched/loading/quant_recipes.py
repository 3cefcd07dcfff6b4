"""mlx-lm's mixed-precision quantization recipes (``convert --quant-predicate``), after
llama.cpp's Q4_K_M choices: the value and down projections of the first and last eighth
of the layers, and of every third layer between, and the output head get the high bit
width; everything else the low one."""

QUANT_RECIPES = ["mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6"]
_BITS = {"mixed_2_6": (2, 6), "mixed_3_4": (3, 4), "mixed_3_6": (3, 6), "mixed_4_6": (4, 6)}
_VALUE_PROJECTIONS = ("v_proj", "v_a_proj", "v_b_proj")


def mixed_quant_predicate_builder(recipe, model, group_size=64):
    """A ``quant_predicate(path, module)`` giving each layer's ``{"group_size", "bits",
    "mode": "affine"}`` under ``recipe`` (one of ``QUANT_RECIPES``) for ``model``."""
    if recipe not in _BITS:
        raise ValueError(f"Invalid quant recipe {recipe}")
    low, high = _BITS[recipe]
    down = [name for name, _ in model.named_modules() if "down_proj" in name]
    if not down:
        raise ValueError("Model does not have expected keys for mixed quant.")
    parts = down[0].split(".")
    # Where the layer index sits in a path (the first numeric part of a down projection's).
    where = next((i for i, p in enumerate(parts) if p.isdigit()), len(parts) - 1)
    n = len(model.layers)

    def predicate(path, module):
        parts = path.split(".")
        index = int(parts[where]) if len(parts) > where else 0
        more = index < n // 8 or index >= 7 * n // 8 or (index - n // 8) % 3 == 2
        important = any(p in path for p in _VALUE_PROJECTIONS) or "down_proj" in path
        bits = high if (important and more) or "lm_head" in path else low
        return {"group_size": group_size, "bits": bits, "mode": "affine"}

    return predicate
