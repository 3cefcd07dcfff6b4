"""Nanbeige (Nanbeige 4 looped): Llama's blocks run ``num_loops`` times with shared
weights, each pass with its own key/value caches and closed by the final RMSNorm
(once at the end with ``skip_loop_final_norm``). Checkpoints trained with per-loop
losses give the loop count as ``len(loop_loss_weights) + 1``. The reference code's
double-loop split, loop-shared keys/values and depth attention have no weights of
their own and are refused by name."""

from dataclasses import dataclass
from typing import List, Optional

from ..layers.stack import LoopedDecoderStack
from .llama import Model as LlamaModel
from .llama import ModelArgs as LlamaArgs

_UNSUPPORTED = ("enable_double_loop_split", "loop_share_kv", "enable_depth_attention")


@dataclass
class ModelArgs(LlamaArgs):
    tie_word_embeddings: bool = False
    num_loops: int = 1
    loop_loss_weights: Optional[List[float]] = None
    skip_loop_final_norm: bool = False
    enable_double_loop_split: bool = False
    loop_share_kv: bool = False
    enable_depth_attention: bool = False

    def __post_init__(self):
        super().__post_init__()
        for name in _UNSUPPORTED:
            if getattr(self, name):
                raise NotImplementedError(f"nanbeige: {name} is not supported")

    @property
    def effective_num_loops(self):
        """Passes over the blocks: one per loss weight plus the last one."""
        if self.loop_loss_weights:
            return len(self.loop_loss_weights) + 1
        return self.num_loops


class Model(LlamaModel):
    def __init__(self, args: ModelArgs):
        super().__init__(args)
        loops = args.effective_num_loops
        # Llama's blocks, run by a looped stack: one cache (and mask) per block and pass.
        blocks = self.model
        self.model = LoopedDecoderStack(args.vocab_size, args.hidden_size, blocks.layers,
                                        blocks.norm, loops, not args.skip_loop_final_norm)
        self.layer_windows = self.layer_windows * loops
