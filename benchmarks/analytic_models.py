"""Analytic op graphs of BigLSTM, GNMT and Inception-V3 on a V100, for the cross-over
study until profiled graphs exist (clearly not measurements).

Each op's forward time is its FLOPs at the profiled batch divided by an achieved
fraction of the device's fp32 peak (`ACHIEVED_FRACTION`, an assumption; the same for
every op, so only the ratios between ops matter for placement), its backward twice
that; pooling, concatenation and embedding lookups are memory-bound (bytes / HBM
bandwidth). Architectures, from the papers:
- BigLSTM: "BIG LSTM" of Jozefowicz et al. 2016 as in Kuchaiev & Ginsburg 2017:
  2 LSTMP layers of 8192 cells projected to 1024, embedding 1024, vocabulary 793,471,
  sampled softmax of 8,192 classes, 20 unrolled steps.
- GNMT: Wu et al. 2016 as in NVIDIA's GNMT v2 / MLPerf: 1024 units, a bidirectional
  first encoder layer then 3 more, 4 decoder layers fed the attention context,
  32,320-token vocabulary; 30 tokens per sentence is our assumption.
- Inception-V3: Szegedy et al. 2016, layer by layer as torchvision builds it (no
  auxiliary head), 299x299 inputs; each branch of a module is one op.
Recurrent layers are cut into `TIME_CHUNKS` chunks of time steps (one op each, sharing
the layer's colocation group), so a placement can pipeline layers along time as
DLPlacer's BigLSTM and GNMT placements do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from placement.cluster import V100, DeviceKind
from placement.graph import Edge, Op, OpGraph

ACHIEVED_FRACTION = 0.5
TIME_CHUNKS = 4
FLOAT_BYTES = 4


@dataclass
class _Builder:
    name: str
    batch: int
    device: DeviceKind = V100
    ops: list[Op] = field(default_factory=list)
    edges: list[Edge] = field(default_factory=list)

    def compute(self, name: str, flops_per_sample: float, params: float = 0.0,
                out_elems_per_sample: float = 0.0, saved_elems_per_sample: float | None = None,
                colocation: str | None = None, gradient_params: float | None = None) -> int:
        t = self.batch * flops_per_sample / (self.device.peak_flops * ACHIEVED_FRACTION)
        return self._add(name, t, 2 * t, params, out_elems_per_sample,
                         saved_elems_per_sample, colocation, gradient_params, flops_per_sample)

    def memory_bound(self, name: str, elems_moved_per_sample: float, params: float = 0.0,
                     out_elems_per_sample: float = 0.0, colocation: str | None = None,
                     gradient_params: float | None = None) -> int:
        t = (self.batch * elems_moved_per_sample * FLOAT_BYTES
             / self.device.memory_bandwidth_bytes_per_s)
        return self._add(name, t, t, params, out_elems_per_sample, 0.0, colocation,
                         gradient_params, 0.0)

    def _add(self, name: str, fwd: float, bwd: float, params: float, out: float,
             saved: float | None, colocation: str | None, gradient_params: float | None,
             flops: float) -> int:
        op_id = len(self.ops)
        attrs: dict[str, object] = {"forward_flops": self.batch * flops}
        if gradient_params is not None:
            attrs["gradient_bytes"] = gradient_params * FLOAT_BYTES
        self.ops.append(Op(
            id=op_id, name=name, forward_s={self.device.name: fwd},
            backward_s={self.device.name: bwd},
            output_bytes=self.batch * out * FLOAT_BYTES, param_bytes=params * FLOAT_BYTES,
            activation_bytes=self.batch * (out if saved is None else saved) * FLOAT_BYTES,
            colocation=colocation, attrs=attrs))
        return op_id

    def edge(self, src: int, dst: int) -> None:
        self.edges.append(Edge(src=src, dst=dst, bytes=self.ops[src].output_bytes))

    def graph(self, **metadata: object) -> OpGraph:
        return OpGraph(ops=tuple(self.ops), edges=tuple(self.edges), name=self.name,
                       metadata={"batch": self.batch, "analytic": True, **metadata})


def lstm_flops_per_step(inputs: int, hidden: int, projection: int | None = None) -> float:
    """Forward FLOPs of one LSTM(P) time step: 4 gates x (inputs + recurrent) MACs,
    plus the projection."""
    recurrent = projection or hidden
    macs = 4 * hidden * (inputs + recurrent) + (hidden * projection if projection else 0)
    return 2.0 * macs


def lstm_params(inputs: int, hidden: int, projection: int | None = None) -> float:
    recurrent = projection or hidden
    return 4 * hidden * (inputs + recurrent + 1) + (hidden * projection if projection else 0)


def _chain_layer(b: _Builder, name: str, steps: int, flops_step: float, params: float,
                 out_dim: int, saved_dim: int, below: list[int] | list[list[int]],
                 reverse: bool = False) -> list[int]:
    """One recurrent layer as TIME_CHUNKS ops: chunk c needs chunk c-1 of this layer
    (c+1 when `reverse`) and chunk c of each layer below."""
    per = steps / TIME_CHUNKS
    ids = [b.compute(f"{name}.t{c}", flops_step * per, params if c == 0 else 0.0,
                     out_dim * per, saved_dim * per, colocation=name)
           for c in range(TIME_CHUNKS)]
    sources = below if below and isinstance(below[0], list) else [below]
    for c in range(TIME_CHUNKS):
        for layer in sources:
            if layer:
                b.edge(layer[c], ids[c])
        prev = c + 1 if reverse else c - 1
        if 0 <= prev < TIME_CHUNKS:
            b.edge(ids[prev], ids[c])
    return ids


def biglstm(batch: int = 128) -> OpGraph:
    vocab, dim, cells, steps, samples = 793_471, 1024, 8192, 20, 8192
    b = _Builder("biglstm", batch)
    emb = b.memory_bound("embedding", 2 * steps * dim, params=vocab * dim,
                         out_elems_per_sample=steps * dim,
                         gradient_params=batch * steps * dim)
    below: list[int] = [emb] * TIME_CHUNKS
    for layer in (1, 2):
        below = _chain_layer(b, f"lstmp{layer}", steps, lstm_flops_per_step(dim, cells, dim),
                             lstm_params(dim, cells, dim), dim, 6 * cells, below)
    per = steps / TIME_CHUNKS
    for c in range(TIME_CHUNKS):
        s = b.compute(f"softmax.t{c}", 2.0 * dim * (samples + 1) * per,
                      params=(vocab * (dim + 1)) if c == 0 else 0.0,
                      out_elems_per_sample=per, saved_elems_per_sample=(samples + 1) * per,
                      colocation="softmax",
                      gradient_params=((samples + batch * steps) * (dim + 1)) if c == 0 else 0.0)
        b.edge(below[c], s)
    return b.graph(model="biglstm", sample="20-token sequence")


def gnmt(batch: int = 128, tokens: int = 30) -> OpGraph:
    vocab, h = 32_320, 1024
    b = _Builder("gnmt", batch)
    src = b.memory_bound("encoder.embedding", 2 * tokens * h, params=vocab * h,
                         out_elems_per_sample=tokens * h, gradient_params=batch * tokens * h)
    enc_in = [src] * TIME_CHUNKS
    fwd = _chain_layer(b, "encoder.l1.forward", tokens, lstm_flops_per_step(h, h),
                       lstm_params(h, h), h, 6 * h, enc_in)
    bwd = _chain_layer(b, "encoder.l1.backward", tokens, lstm_flops_per_step(h, h),
                       lstm_params(h, h), h, 6 * h, enc_in, reverse=True)
    below: list[int] | list[list[int]] = [fwd, bwd]
    below = _chain_layer(b, "encoder.l2", tokens, lstm_flops_per_step(2 * h, h),
                         lstm_params(2 * h, h), h, 6 * h, below)
    for layer in (3, 4):
        below = _chain_layer(b, f"encoder.l{layer}", tokens, lstm_flops_per_step(h, h),
                             lstm_params(h, h), h, 6 * h, below)
    encoder_out = below[-1]
    tgt = b.memory_bound("decoder.embedding", 2 * tokens * h, params=vocab * h,
                         out_elems_per_sample=tokens * h, gradient_params=batch * tokens * h)
    dec = _chain_layer(b, "decoder.l1", tokens, lstm_flops_per_step(h, h),
                       lstm_params(h, h), h, 6 * h, [tgt] * TIME_CHUNKS)
    per = tokens / TIME_CHUNKS
    attention = []
    for c in range(TIME_CHUNKS):
        a = b.compute(f"attention.t{c}", (2 * h * h + 4 * h * tokens) * per,
                      params=(2 * h * h) if c == 0 else 0.0, out_elems_per_sample=h * per,
                      saved_elems_per_sample=(h + tokens) * per, colocation="attention")
        b.edge(dec[c], a)
        b.edge(encoder_out, a)
        attention.append(a)
    below = dec
    for layer in (2, 3, 4):
        below = _chain_layer(b, f"decoder.l{layer}", tokens, lstm_flops_per_step(2 * h, h),
                             lstm_params(2 * h, h), h, 6 * h, [below, attention])
    for c in range(TIME_CHUNKS):
        s = b.compute(f"classifier.t{c}", 2.0 * h * vocab * per,
                      params=(vocab * (h + 1)) if c == 0 else 0.0, out_elems_per_sample=per,
                      saved_elems_per_sample=vocab * per, colocation="classifier")
        b.edge(below[c], s)
    return b.graph(model="gnmt", sample="sentence pair", tokens_per_sentence=tokens)


@dataclass
class _Tensor:
    h: int
    w: int
    c: int

    @property
    def elems(self) -> int:
        return self.h * self.w * self.c


def _conv(x: _Tensor, cout: int, kh: int, kw: int | None = None, stride: int = 1,
          same: bool = True) -> tuple[_Tensor, float, float]:
    """(output, forward FLOPs, params) of a conv (BN folded in, bias-free)."""
    kw = kh if kw is None else kw
    if same:
        h, w = (x.h - 1) // stride + 1, (x.w - 1) // stride + 1
    else:
        h, w = (x.h - kh) // stride + 1, (x.w - kw) // stride + 1
    out = _Tensor(h, w, cout)
    return out, 2.0 * h * w * kh * kw * x.c * cout, kh * kw * x.c * cout


def _branch(b: _Builder, name: str, x: _Tensor, convs: list[tuple], src: int,
            pool: bool = False) -> tuple[int, _Tensor]:
    """One branch of an Inception module as one op: a chain of convs (and a pool)."""
    flops = params = saved = 0.0
    t = x
    if pool:
        saved += x.elems
        flops += 9.0 * x.elems
    for spec in convs:
        if spec[0] == "split":
            # parallel convs reading one tensor, their outputs concatenated
            parts = [_conv(t, *s) for s in spec[1]]
            t = _Tensor(parts[0][0].h, parts[0][0].w, sum(o.c for o, _, _ in parts))
            flops += sum(f for _, f, _ in parts)
            params += sum(p for _, _, p in parts)
        else:
            t, f, p = _conv(t, *spec)
            flops, params = flops + f, params + p
        saved += t.elems
    if pool and not convs and t.h != x.h:
        t = _Tensor((x.h - 3) // 2 + 1, (x.w - 3) // 2 + 1, x.c)
    op_id = b.compute(name, flops, params, t.elems, saved)
    b.edge(src, op_id)
    return op_id, t


def _module(b: _Builder, name: str, x: _Tensor, src: int,
            branches: list[tuple[list[tuple], bool]]) -> tuple[int, _Tensor]:
    outs = [_branch(b, f"{name}.b{i}", x, convs, src, pool)
            for i, (convs, pool) in enumerate(branches)]
    cat = _Tensor(outs[0][1].h, outs[0][1].w, sum(t.c for _, t in outs))
    op_id = b.memory_bound(f"{name}.concat", 2 * cat.elems, out_elems_per_sample=cat.elems)
    for i, _ in outs:
        b.edge(i, op_id)
    return op_id, cat


def inception_v3(batch: int = 64) -> OpGraph:
    b = _Builder("inception_v3", batch)
    x = _Tensor(299, 299, 3)
    stem = [(32, 3, 3, 2, False), (32, 3, 3, 1, False), (64, 3, 3, 1, True), "pool",
            (80, 1, 1, 1, True), (192, 3, 3, 1, False), "pool"]
    prev = -1
    for i, spec in enumerate(stem):
        if spec == "pool":
            x = _Tensor((x.h - 3) // 2 + 1, (x.w - 3) // 2 + 1, x.c)
            op_id = b.memory_bound(f"stem.{i}.maxpool", 2 * x.elems, out_elems_per_sample=x.elems)
        else:
            cout, kh, kw, stride, same = spec
            x, f, p = _conv(x, cout, kh, kw, stride, same)
            op_id = b.compute(f"stem.{i}.conv", f, p, x.elems)
        if prev >= 0:
            b.edge(prev, op_id)
        prev = op_id

    def a(pf: int) -> list:
        return [([(64, 1)], False), ([(48, 1), (64, 5)], False),
                ([(64, 1), (96, 3), (96, 3)], False), ([(pf, 1)], True)]

    def c(c7: int) -> list:
        return [([(192, 1)], False), ([(c7, 1), (c7, 1, 7), (192, 7, 1)], False),
                ([(c7, 1), (c7, 7, 1), (c7, 1, 7), (c7, 7, 1), (192, 1, 7)], False),
                ([(192, 1)], True)]

    split = ("split", [(384, 1, 3), (384, 3, 1)])
    e = [([(320, 1)], False), ([(384, 1), split], False),
         ([(448, 1), (384, 3), split], False), ([(192, 1)], True)]
    modules = [("mixed_5b", a(32)), ("mixed_5c", a(64)), ("mixed_5d", a(64)),
               ("mixed_6a", [([(384, 3, 3, 2, False)], False),
                             ([(64, 1), (96, 3), (96, 3, 3, 2, False)], False), ([], True)]),
               ("mixed_6b", c(128)), ("mixed_6c", c(160)), ("mixed_6d", c(160)),
               ("mixed_6e", c(192)),
               ("mixed_7a", [([(192, 1), (320, 3, 3, 2, False)], False),
                             ([(192, 1), (192, 1, 7), (192, 7, 1), (192, 3, 3, 2, False)],
                              False), ([], True)]),
               ("mixed_7b", e), ("mixed_7c", e)]
    for name, branches in modules:
        prev, x = _module(b, name, x, prev, branches)
    fc = b.compute("fc", 2.0 * x.c * 1000 + x.elems, params=x.c * 1000 + 1000,
                   out_elems_per_sample=1000, saved_elems_per_sample=x.c)
    b.edge(prev, fc)
    return b.graph(model="inception_v3", sample="image")


MODELS = {"biglstm": biglstm, "gnmt": gnmt, "inception_v3": inception_v3}
