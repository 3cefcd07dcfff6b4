"""Layers tensor parallelism refuses by name: their math does not split over ranks
the way the shared blocks' does, and no sharder is written for them yet.

``SHARDERS`` maps each class to a function that raises ``ValueError`` naming the
layer and why; ``shard.shard_model`` looks classes up here as in ``recurrent``."""

from ..layers.bitlinear import BitLinear
from ..models.bitnet import SubNormAttention, SubNormMLP
from ..models.deepseek_v41 import DecoderLayer as DeepseekV41Layer
from ..models.iquestloopcoder import LoopStack
from ..models.phi3small import GroupedQKVAttention
from ..models.talkie import HeadGainAttention


def _refuse_bitnet(module, group, path):
    raise ValueError(f"cannot shard layer '{path}' ({type(module).__name__}): BitNet's "
                     "sub-norms span every head / hidden unit and its packed ternary "
                     "weights interleave output rows; BitNet runs on one rank")


def _refuse_head_gain(module, group, path):
    raise ValueError(f"cannot shard layer '{path}' ({type(module).__name__}): talkie's "
                     "per-head query gains have no sharder yet; talkie runs on one rank")


def _refuse_loop(module, group, path):
    raise ValueError(f"cannot shard layer '{path or 'model'}' ({type(module).__name__}): "
                     "IQuest-Coder Loop's per-head gates have no sharder yet; it runs on one "
                     "rank")


def _refuse_block_sparse(module, group, path):
    raise ValueError(f"cannot shard layer '{path}' ({type(module).__name__}): Phi-3-small's "
                     "query_key_value interleaves each key/value group's heads and its "
                     "block-sparse pattern is per head; phi3small runs on one rank")


def _refuse_deepseek_v41(module, group, path):
    raise ValueError(f"cannot shard layer '{path}' ({type(module).__name__}): DeepSeek V4.1's "
                     "grouped output projection, attention sinks and hyper-connections have "
                     "no sharder yet; deepseek_v41 runs on one rank")


SHARDERS = {
    DeepseekV41Layer: _refuse_deepseek_v41,
    GroupedQKVAttention: _refuse_block_sparse,
    LoopStack: _refuse_loop,
    HeadGainAttention: _refuse_head_gain,
    SubNormAttention: _refuse_bitnet,
    SubNormMLP: _refuse_bitnet,
    BitLinear: _refuse_bitnet,
}
