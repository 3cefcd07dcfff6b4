"""What code written for mlx-lm's Muse Spark reaches, against mlx-lm as the oracle:
``chat_templates.muse_spark.RESPONSE_FORMAT`` splitting raw output as mlx-lm's state
machine does, ``models.pipeline.PipelineMixin``'s stage layer ranges, and the args
(``args.text``, transformers' default for a width the config leaves out)."""

import importlib
from types import SimpleNamespace

import pytest

CALL = ('<atem:function_calls><atem:invoke name="grep"><atem:parameter name="pattern">'
        "x</atem:parameter></atem:invoke></atem:function_calls>")
OUTPUTS = [
    f" to=self<|message|>plan<|eom|><|start|>assistant to=grep<|message|>{CALL}<|eom|>"
    "<|start|>assistant to=user<|message|>done<|eot|>",
    f"to=commentary<|message|>a<|eom|>assistant to=user<|message|>say {CALL} later",
    " to=self<|message|>only thinking, cut off <|eo",
]


def split_all(package, text, step):
    """``[(state, text), ...]`` of ``text`` fed in ``step``-character chunks to
    ``package``'s machine for a Muse Spark tokenizer, adjacent same-state text joined."""
    gen = importlib.import_module(f"{package}.generate")
    fmt = importlib.import_module(f"{package}.chat_templates.muse_spark").RESPONSE_FORMAT
    tokenizer = SimpleNamespace(has_thinking=False, has_tool_calling=True,
                                tool_call_start="<atem:function_calls>",
                                tool_call_end="</atem:function_calls>", structural_markers=(),
                                response_transitions=fmt["transitions"])
    machine = gen.make_text_state_machine(tokenizer)
    state, out = machine.make_state(fmt["initial_state"]), []
    for i in range(0, len(text), step):
        state, segments = gen.TextStateMachine.split(state, text[i:i + step])
        for name, chunk in segments:
            if out and out[-1][0] == name:
                out[-1] = (name, out[-1][1] + chunk)
            elif chunk:
                out.append((name, chunk))
    return out


@pytest.mark.parametrize("text", OUTPUTS)
@pytest.mark.parametrize("step", [1, 4, 1000])
def test_muse_spark_response_format_splits_as_mlx_lm(text, step):
    """Reasoning, answer and calls come out of the same states with the same text as
    mlx-lm's machine gives, whatever the chunking; header text stays in "header"."""
    got = split_all("mlx_lm_batched", text, step)
    assert got == split_all("mlx_lm", text, step)
    assert not any("<|message|>" in chunk for name, chunk in got if name != "header")
    assert {name for name, _ in got} <= {"header", "reasoning", "normal", "tool"}


@pytest.mark.parametrize("layers,size,split", [
    (4, 2, None), (7, 3, None), (5, 2, [1, 4]), (3, 3, None), (6, 4, [3, 1, 1, 1])])
def test_pipeline_mixin_keeps_mlx_lm_stage_layers(layers, size, split):
    """Every rank keeps the layers mlx-lm's mixin keeps (None before its range, so layer
    indices stay), with the same ``start_idx``/``end_idx`` and ``pipeline_layers``."""
    from mlx_lm.models.pipeline import PipelineMixin as Theirs

    from mlx_lm_batched.models.pipeline import PipelineMixin as Ours

    def stage(mixin, rank):
        class Stage(mixin):
            def __init__(self):
                super().__init__()
                self.layers = list(range(layers))

        model = Stage()
        model.pipeline(SimpleNamespace(rank=lambda: rank, size=lambda: size), split=split)
        return (model.layers, model.start_idx, model.end_idx, list(model.pipeline_layers),
                model.pipeline_rank, model.pipeline_size)

    ranges = []
    for rank in range(size):
        got = stage(Ours, rank)
        assert got == stage(Theirs, rank)
        ranges.append(got[3])
    assert sorted(i for part in ranges for i in part) == list(range(layers))


@pytest.mark.parametrize("split", [[2, 2, 1], [4, 0], [1, 1]])
def test_pipeline_mixin_refuses_what_mlx_lm_refuses(split):
    from mlx_lm.models.pipeline import PipelineMixin as Theirs

    from mlx_lm_batched.models.pipeline import PipelineMixin as Ours

    group = SimpleNamespace(rank=lambda: 0, size=lambda: 2)
    for mixin in (Ours, Theirs):
        model = type("Stage", (mixin,), {})()
        model.layers = list(range(4))
        with pytest.raises(ValueError):
            model.pipeline(group, split=split)


def test_muse_spark_args_text_and_defaults():
    """``args.text`` reads the text fields mlx-lm's nested args hold; a config without
    ``intermediate_size`` (dense layers' width) takes transformers' default."""
    from mlx_lm.models import muse_spark as theirs
    from transformers.models.muse_spark.configuration_muse_spark import MuseSparkTextConfig

    from mlx_lm_batched.models import muse_spark as ours

    text = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5, post_norm_eps=1e-8,
                rope_parameters={"rope_theta": 1e4, "rope_type": "default"},
                layer_rope_theta=[1e4, 0], layer_types=["sliding_attention", "full_attention"],
                sliding_window=4, final_logit_softcapping=20.0, output_multiplier=0.5,
                num_local_experts=4, num_experts_per_tok=2, moe_hidden_size=16,
                moe_intermediate_size=16)
    config = {"model_type": "muse_spark", "text_config": text}
    got, want = ours.ModelArgs.from_dict(config), theirs.ModelArgs.from_dict(config)
    for name in ("vocab_size", "hidden_size", "num_hidden_layers", "layer_types",
                 "sliding_window", "layer_rope_theta", "moe_intermediate_size"):
        assert getattr(got.text, name) == getattr(want.text, name), name
    assert got.intermediate_size == MuseSparkTextConfig().intermediate_size
    assert ours.ModelArgs.from_dict(
        {**config, "text_config": {**text, "intermediate_size": 48}}).intermediate_size == 48
