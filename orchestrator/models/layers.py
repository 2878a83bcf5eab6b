"""Building blocks shared by the models, written so that `torch.fx` sees the right ops.

`LSTMLayer` is an fx *leaf*: one call runs one layer over one chunk of time steps and
becomes one op of the traced graph. The models call it once per (layer, chunk), so the
graph shows the wavefront of a recurrent network: chunk t of layer l+1 needs only chunk
t of layer l and chunk t-1 of layer l+1.
"""

from __future__ import annotations

import torch
from torch import nn

#: Module classes the profiler's tracer keeps whole (one call = one op), beside torch.nn's
#: own layers. Register a class with `leaf_module` when fx cannot trace into it (data-
#: dependent control flow) or when one call should be one op.
LEAF_MODULES: set[type[nn.Module]] = set()


def leaf_module(cls: type[nn.Module]) -> type[nn.Module]:
    """Class decorator: the tracer treats every instance of `cls` as one opaque op."""
    LEAF_MODULES.add(cls)
    return cls


def chunk_bounds(length: int, chunk: int) -> list[tuple[int, int]]:
    """[start, end) of each chunk of `chunk` time steps (the last may be shorter)."""
    if chunk < 1:
        raise ValueError(f"seq_chunk={chunk} must be >= 1")
    return [(a, min(a + chunk, length)) for a in range(0, length, chunk)]


@leaf_module
class LSTMLayer(nn.Module):
    """One LSTM layer, optionally with a recurrent projection (LSTMP, Sak et al. 2014, as
    in Jozefowicz et al. 2016), run over one chunk of time steps.

    `forward(x, h, c, extra=None)`: x is (batch, steps, input_size); h, c the state left
    by the previous chunk (None: zeros); `extra` (batch, steps, extra_size) is
    concatenated to x (GNMT's attention context). Returns (outputs, h, c) with outputs
    (batch, steps, out_size). `reverse=True` runs the chunk backwards in time (the
    backward direction of a bidirectional layer; the caller feeds chunks last-first).
    """

    def __init__(self, input_size: int, hidden_size: int, *, proj_size: int = 0,
                 extra_size: int = 0, reverse: bool = False) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.out_size = proj_size or hidden_size
        self.reverse = reverse
        # torch's own LSTM runs the chunk's time loop in one ATen call: no Python per
        # time step, and the GIL is free for the other devices' threads meanwhile.
        self.lstm = nn.LSTM(input_size + extra_size, hidden_size, proj_size=proj_size,
                            batch_first=True)

    def forward(self, x: torch.Tensor, h: torch.Tensor | None, c: torch.Tensor | None,
                extra: torch.Tensor | None = None):
        if extra is not None:
            x = torch.cat([x, extra], dim=-1)
        if self.reverse:
            x = x.flip(1)
        state = None if h is None else (h.unsqueeze(0), c.unsqueeze(0))
        outputs, (h, c) = self.lstm(x, state)
        if self.reverse:
            outputs = outputs.flip(1)
        return outputs, h.squeeze(0), c.squeeze(0)


def run_layer(layer: LSTMLayer, chunks: list, extras: list | None = None) -> list:
    """Call `layer` once per chunk, threading its state; returns the output chunks.

    Written with explicit indexing (not tuple unpacking) so fx traces it as getitem nodes.
    """
    order = range(len(chunks) - 1, -1, -1) if layer.reverse else range(len(chunks))
    h = c = None
    outputs: list = [None] * len(chunks)
    for k in order:
        out = layer(chunks[k], h, c, None if extras is None else extras[k])
        outputs[k], h, c = out[0], out[1], out[2]
    return outputs
