"""mlx-lm 0.32's model-class contract: models copy and pickle like any ``nn.Module``
(mlx-lm code deep-copies models, e.g. for draft models and LoRA), and every family's
``ModelArgs`` takes mlx-lm's constructor arguments."""

import copy
import pickle

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_map

from arch_harness import collect_families
from mlx_lm_batched.models import get_model_module

FAMILIES = collect_families()


def build(name):
    """A tiny random model of one ``FAMILIES`` entry, built from its config."""
    config, options = FAMILIES[name][1]
    model_type = options.get("model_type", name)
    module = get_model_module(model_type)
    model = module.Model(module.ModelArgs.from_dict({"model_type": model_type, **config}))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_model_deepcopies_and_pickles(name):
    model = build(name)
    prompt = mx.array([[1, 5, 9, 2]])
    expected = np.array(model(prompt))
    copied = copy.deepcopy(model)
    restored = pickle.loads(pickle.dumps(model))
    for clone in (copied, restored):
        assert type(clone) is type(model)
        np.testing.assert_array_equal(np.array(clone(prompt)), expected, err_msg=name)
    # The deep copy owns its parameters: zeroing them leaves the original alone.
    copied.update(tree_map(mx.zeros_like, copied.parameters()))
    np.testing.assert_array_equal(np.array(model(prompt)), expected, err_msg=name)
