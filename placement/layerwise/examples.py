"""VGG-16 and Inception-V3 layer graphs built analytically from their published shapes.

They stand in for profiled graphs (same `Op.attrs` contract as the profiler) in tests,
benchmarks and `orchestrator layerwise --model ... --analytic`. Times are a roofline
on the device kind: forward = max(FLOPs / peak fp32 FLOP/s, bytes moved / memory
bandwidth), backward = 2 x forward (gradients for inputs and for weights). Each
convolution carries its batch norm and ReLU and each fully-connected layer its ReLU
and dropout (fused, as a framework would run them); VGG-16 has biases where
Inception-V3 has batch norms; the network's input images are
read by whichever device needs them, so no op stands for them.

Shapes: VGG-16 configuration D of Simonyan & Zisserman 2014 (224x224 inputs);
Inception-V3 as in Szegedy et al. 2016 / torchvision's `inception_v3` (299x299
inputs, 1000 classes, with the auxiliary classifier head).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from placement.cluster import DeviceKind
from placement.graph import Edge, Op, OpGraph

_FLOAT_BYTES = 4
Shape = tuple[int, ...]


class _Builder:
    def __init__(self, name: str, batch_size: int, device: DeviceKind) -> None:
        self.name, self.batch, self.device = name, batch_size, device
        self.ops: list[Op] = []
        self.edges: list[Edge] = []
        self.shapes: dict[int, Shape] = {}

    def _add(self, name: str, kind: str, inputs: Sequence[int], out: Shape, flops: float,
             params: int = 0, weight_shape: Shape | None = None,
             input_shape: Shape | None = None, kernel_size: int | None = None) -> int:
        op_id = len(self.ops)
        in_shapes = [self.shapes[i] for i in inputs] or [input_shape]
        out_bytes = _FLOAT_BYTES * math.prod(out)
        moved = out_bytes + _FLOAT_BYTES * (params + sum(math.prod(s) for s in in_shapes))
        forward_s = max(flops / self.device.peak_flops,
                        moved / self.device.memory_bandwidth_bytes_per_s)
        attrs: dict[str, object] = {
            "layer_kind": kind, "output_shape": list(out) if kind != "loss" else [],
            "input_shapes": [list(s) for s in in_shapes], "forward_flops": flops,
            "module": name}
        if weight_shape:
            attrs["weight_shape"] = list(weight_shape)
        if kernel_size:
            attrs["kernel_size"] = kernel_size
        self.ops.append(Op(
            id=op_id, name=name, forward_s={self.device.name: forward_s},
            backward_s={self.device.name: 2 * forward_s}, output_bytes=out_bytes,
            param_bytes=_FLOAT_BYTES * params, activation_bytes=out_bytes, attrs=attrs))
        self.shapes[op_id] = out
        for src in inputs:
            self.edges.append(Edge(src=src, dst=op_id, bytes=self.ops[src].output_bytes))
        return op_id

    def conv(self, name: str, src: int | None, cout: int, kernel: int | Shape,
             stride: int = 1, pad: int | Shape = 0, in_shape: Shape | None = None,
             batch_norm: bool = True) -> int:
        n, cin, h, w = self.shapes[src] if src is not None else in_shape
        kh, kw = (kernel, kernel) if isinstance(kernel, int) else kernel
        ph, pw = (pad, pad) if isinstance(pad, int) else pad
        ho, wo = (h + 2 * ph - kh) // stride + 1, (w + 2 * pw - kw) // stride + 1
        flops = 2 * n * cout * ho * wo * cin * kh * kw
        # weights + batch-norm scale and shift (Inception) or bias (VGG)
        params = cout * cin * kh * kw + (2 * cout if batch_norm else cout)
        return self._add(name, "conv2d", [src] if src is not None else [], (n, cout, ho, wo),
                         flops, params, (cout, cin, kh, kw), input_shape=(n, cin, h, w))

    def pool(self, name: str, src: int, kernel: int, stride: int, pad: int = 0) -> int:
        n, c, h, w = self.shapes[src]
        ho, wo = (h + 2 * pad - kernel) // stride + 1, (w + 2 * pad - kernel) // stride + 1
        return self._add(name, "pool", [src], (n, c, ho, wo), n * c * ho * wo * kernel ** 2,
                         kernel_size=kernel)

    def concat(self, name: str, srcs: Sequence[int]) -> int:
        n, _, h, w = self.shapes[srcs[0]]
        channels = sum(self.shapes[s][1] for s in srcs)
        return self._add(name, "concat", srcs, (n, channels, h, w), 0.0)

    def linear(self, name: str, src: int, out_features: int) -> int:
        n = self.shapes[src][0]
        in_features = math.prod(self.shapes[src][1:])
        return self._add(name, "linear", [src], (n, out_features),
                         2 * n * in_features * out_features,
                         in_features * out_features + out_features,
                         (out_features, in_features))

    def loss(self, name: str, src: int) -> int:
        n, classes = self.shapes[src]
        return self._add(name, "loss", [src], (n, classes), 5 * n * classes)

    def graph(self, **metadata: object) -> OpGraph:
        return OpGraph(ops=tuple(self.ops), edges=tuple(self.edges), name=self.name,
                       metadata={"source": "placement.layerwise.examples",
                                 "batch_size": self.batch, **metadata})


def vgg16(batch_size: int, device: DeviceKind) -> OpGraph:
    """VGG-16 (configuration D): 13 convolutions, 5 max-pools, 3 fully-connected."""
    b = _Builder("vgg16", batch_size, device)
    x: int | None = None
    shape: Shape = (batch_size, 3, 224, 224)
    blocks = [(64, 2), (128, 2), (256, 3), (512, 3), (512, 3)]
    for i, (channels, convs) in enumerate(blocks, start=1):
        for j in range(1, convs + 1):
            x = b.conv(f"conv{i}_{j}", x, channels, 3, pad=1, in_shape=shape,
                       batch_norm=False)
        x = b.pool(f"pool{i}", x, 2, 2)
    x = b.linear("fc6", x, 4096)
    x = b.linear("fc7", x, 4096)
    x = b.linear("fc8", x, 1000)
    b.loss("loss", x)
    return b.graph(model="vgg16")


def _inception_a(b: _Builder, name: str, x: int, pool_features: int) -> int:
    b1 = b.conv(f"{name}.branch1x1", x, 64, 1)
    b5 = b.conv(f"{name}.branch5x5_1", x, 48, 1)
    b5 = b.conv(f"{name}.branch5x5_2", b5, 64, 5, pad=2)
    b3 = b.conv(f"{name}.branch3x3dbl_1", x, 64, 1)
    b3 = b.conv(f"{name}.branch3x3dbl_2", b3, 96, 3, pad=1)
    b3 = b.conv(f"{name}.branch3x3dbl_3", b3, 96, 3, pad=1)
    bp = b.pool(f"{name}.avg_pool", x, 3, 1, pad=1)
    bp = b.conv(f"{name}.branch_pool", bp, pool_features, 1)
    return b.concat(f"{name}.cat", [b1, b5, b3, bp])


def _inception_b(b: _Builder, name: str, x: int) -> int:
    b3 = b.conv(f"{name}.branch3x3", x, 384, 3, stride=2)
    bd = b.conv(f"{name}.branch3x3dbl_1", x, 64, 1)
    bd = b.conv(f"{name}.branch3x3dbl_2", bd, 96, 3, pad=1)
    bd = b.conv(f"{name}.branch3x3dbl_3", bd, 96, 3, stride=2)
    bp = b.pool(f"{name}.max_pool", x, 3, 2)
    return b.concat(f"{name}.cat", [b3, bd, bp])


def _inception_c(b: _Builder, name: str, x: int, c7: int) -> int:
    b1 = b.conv(f"{name}.branch1x1", x, 192, 1)
    b7 = b.conv(f"{name}.branch7x7_1", x, c7, 1)
    b7 = b.conv(f"{name}.branch7x7_2", b7, c7, (1, 7), pad=(0, 3))
    b7 = b.conv(f"{name}.branch7x7_3", b7, 192, (7, 1), pad=(3, 0))
    bd = b.conv(f"{name}.branch7x7dbl_1", x, c7, 1)
    for i, (cout, k, p) in enumerate([(c7, (7, 1), (3, 0)), (c7, (1, 7), (0, 3)),
                                      (c7, (7, 1), (3, 0)), (192, (1, 7), (0, 3))], start=2):
        bd = b.conv(f"{name}.branch7x7dbl_{i}", bd, cout, k, pad=p)
    bp = b.pool(f"{name}.avg_pool", x, 3, 1, pad=1)
    bp = b.conv(f"{name}.branch_pool", bp, 192, 1)
    return b.concat(f"{name}.cat", [b1, b7, bd, bp])


def _inception_d(b: _Builder, name: str, x: int) -> int:
    b3 = b.conv(f"{name}.branch3x3_1", x, 192, 1)
    b3 = b.conv(f"{name}.branch3x3_2", b3, 320, 3, stride=2)
    b7 = b.conv(f"{name}.branch7x7x3_1", x, 192, 1)
    b7 = b.conv(f"{name}.branch7x7x3_2", b7, 192, (1, 7), pad=(0, 3))
    b7 = b.conv(f"{name}.branch7x7x3_3", b7, 192, (7, 1), pad=(3, 0))
    b7 = b.conv(f"{name}.branch7x7x3_4", b7, 192, 3, stride=2)
    bp = b.pool(f"{name}.max_pool", x, 3, 2)
    return b.concat(f"{name}.cat", [b3, b7, bp])


def _inception_e(b: _Builder, name: str, x: int) -> int:
    b1 = b.conv(f"{name}.branch1x1", x, 320, 1)
    b3 = b.conv(f"{name}.branch3x3_1", x, 384, 1)
    b3a = b.conv(f"{name}.branch3x3_2a", b3, 384, (1, 3), pad=(0, 1))
    b3b = b.conv(f"{name}.branch3x3_2b", b3, 384, (3, 1), pad=(1, 0))
    bd = b.conv(f"{name}.branch3x3dbl_1", x, 448, 1)
    bd = b.conv(f"{name}.branch3x3dbl_2", bd, 384, 3, pad=1)
    bda = b.conv(f"{name}.branch3x3dbl_3a", bd, 384, (1, 3), pad=(0, 1))
    bdb = b.conv(f"{name}.branch3x3dbl_3b", bd, 384, (3, 1), pad=(1, 0))
    bp = b.pool(f"{name}.avg_pool", x, 3, 1, pad=1)
    bp = b.conv(f"{name}.branch_pool", bp, 192, 1)
    return b.concat(f"{name}.cat", [b1, b3a, b3b, bda, bdb, bp])


def inception_v3(batch_size: int, device: DeviceKind, aux_logits: bool = True) -> OpGraph:
    """Inception-V3: stem, 3x A, B, 4x C, D, 2x E, classifier (+ auxiliary head)."""
    b = _Builder("inception_v3", batch_size, device)
    x = b.conv("Conv2d_1a_3x3", None, 32, 3, stride=2, in_shape=(batch_size, 3, 299, 299))
    x = b.conv("Conv2d_2a_3x3", x, 32, 3)
    x = b.conv("Conv2d_2b_3x3", x, 64, 3, pad=1)
    x = b.pool("maxpool1", x, 3, 2)
    x = b.conv("Conv2d_3b_1x1", x, 80, 1)
    x = b.conv("Conv2d_4a_3x3", x, 192, 3)
    x = b.pool("maxpool2", x, 3, 2)
    for name, pool_features in (("Mixed_5b", 32), ("Mixed_5c", 64), ("Mixed_5d", 64)):
        x = _inception_a(b, name, x, pool_features)
    x = _inception_b(b, "Mixed_6a", x)
    for name, c7 in (("Mixed_6b", 128), ("Mixed_6c", 160), ("Mixed_6d", 160),
                     ("Mixed_6e", 192)):
        x = _inception_c(b, name, x, c7)
    if aux_logits:
        a = b.pool("AuxLogits.avg_pool", x, 5, 3)
        a = b.conv("AuxLogits.conv0", a, 128, 1)
        a = b.conv("AuxLogits.conv1", a, 768, 5)
        a = b.linear("AuxLogits.fc", a, 1000)
        b.loss("AuxLogits.loss", a)
    x = _inception_d(b, "Mixed_7a", x)
    x = _inception_e(b, "Mixed_7b", x)
    x = _inception_e(b, "Mixed_7c", x)
    x = b.pool("avgpool", x, 8, 1)
    x = b.linear("fc", x, 1000)
    b.loss("loss", x)
    return b.graph(model="inception_v3")


MODELS = {"vgg16": vgg16, "inception_v3": inception_v3}
