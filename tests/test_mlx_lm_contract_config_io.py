"""config.json reading and writing, and ``utils._parse_size``, checked against mlx-lm 0.32:
transformers' tagged non-finite floats (``{"__float__": "Infinity"}``) read back as the
floats and are written tagged again, in files each library reads as the other wrote them."""

import json
import math

import pytest
from mlx_lm import utils as theirs

from mlx_lm_batched import utils as ours

CONFIG = {"model_type": "mamba2", "time_step_limit": [0.0, {"__float__": "Infinity"}],
          "deep": {"low": {"__float__": "-Infinity"}, "nan": [{"__float__": "NaN"}]},
          "kept": {"__float__": 3, "other": 4}, "odd": {"__float__": "infinity"}}


def _same(a, b):
    """Equal, NaN included."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def test_tagged_floats_read_and_write_as_mlx_lm(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    mine, reference = ours.load_config(tmp_path), theirs.load_config(tmp_path)
    assert _same(mine, reference)
    assert mine["time_step_limit"][1] == math.inf and mine["kept"] == CONFIG["kept"]
    for writer, reader in [(ours, theirs), (theirs, ours)]:
        out = tmp_path / writer.__name__.replace(".", "_")
        out.mkdir()
        writer.save_config(dict(mine), out / "config.json")
        written = json.loads((out / "config.json").read_text())  # plain JSON, tags in it
        assert written["time_step_limit"] == [0.0, {"__float__": "Infinity"}]
        assert _same(reader.load_config(out), mine)


@pytest.mark.parametrize("text", ["0", "1024", "20G", "512M", "4.1MB", "16.9GB", "2.7gb",
                                  "3 GB", ".5G"])
def test_parse_size_matches_mlx_lm(text):
    assert ours._parse_size(text) == theirs._parse_size(text)


@pytest.mark.parametrize("text", ["12TB", "GB", "1.2.3M", "-4G"])
def test_parse_size_refuses_what_mlx_lm_cannot_read(text):
    with pytest.raises(Exception):
        theirs._parse_size(text)
    with pytest.raises(ValueError, match="not a size"):
        ours._parse_size(text)
