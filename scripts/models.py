#!/usr/bin/env python3
"""Test models for dlcc, produced by real exporters.

Why this exists
---------------
dlcc has to compile ONNX graphs as real frontends emit them: the folded
BatchNorms, the ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape`` chains,
``Sigmoid * Mul`` for SiLU, the ``LSTM`` ops and their ``Transpose``/``Squeeze``
glue, the attention-mask arithmetic of Hugging Face models, and so on.  Hand
written graphs don't look like that, and nothing can be downloaded from a
model hub in the environments where dlcc is built and tested.  So this module
builds a set of representative architectures from code (hand-written torch
modules, and ``transformers`` models built from configs), gives them seeded
random weights, and exports them with ``torch.onnx.export`` (the TorchScript
exporter, ``dynamo=False``, opset 17).

Everything is deterministic: ``torch.manual_seed(0)`` is set before each model
is built, models are exported in eval mode, and :func:`sample_inputs` derives
inputs from a seed.  Every model has static input shapes, except
``cnn-dynamic`` whose batch dimension is symbolic (``"batch"``) so that dim
binding can be tested.

Each model comes in two sizes: ``small`` (CI sized: each exports in about a
second or less, files under 1 MB) and ``full`` (real architecture sizes such
as ResNet-50 and bert-base; up to several hundred MB and some seconds to
export).

API::

    from scripts.models import MODELS, export, sample_inputs
    path = export("cnn", Path("build/models"))          # -> build/models/cnn-small.onnx
    feeds = sample_inputs("cnn", path, seed=0)            # {"input": float32 array}

CLI::

    python scripts/models.py                 # export all small models to ./models
    python scripts/models.py cnn bert -o out --size full
    python scripts/models.py --list

The CLI prints the path and an op-type histogram for each model.
"""

import argparse
import collections
import os
import sys
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

OPSET = 17
SIZES = ("small", "full")


# --------------------------------------------------------------------------
# Specs
# --------------------------------------------------------------------------


@dataclass
class Built:
    """A constructed model plus everything ``torch.onnx.export`` needs."""

    module: nn.Module
    inputs: dict[str, torch.Tensor]  # ordered: positional args of module.forward
    output_names: list[str]
    dynamic_axes: dict[str, dict[int, str]] | None = None


@dataclass(frozen=True)
class ModelSpec:
    """How to build one test model.

    ``build(size)`` returns a :class:`Built`.  The remaining fields describe how
    :func:`sample_inputs` makes valid random inputs for the exported graph:

    * ``int_high``: integer inputs drawn uniformly from ``[0, high)``.
    * ``masks``: integer inputs drawn as right-padded attention masks
      (``dlcc.inputs.padding_mask``: per row, ones then zeros, at least one
      row padded), as are int/bool inputs whose name contains "mask".
    * ``dim_values``: values bound to symbolic dimensions (default 1).

    Float inputs are standard normal float32; other integer inputs are zeros.
    """

    name: str
    description: str
    build: Callable[[str], Built]
    int_high: dict[str, int] = field(default_factory=dict)
    masks: tuple[str, ...] = ()
    dim_values: dict[str, int] = field(default_factory=dict)
    sizes: tuple[str, ...] = SIZES


# --------------------------------------------------------------------------
# cnn: ResNet (mini BasicBlock ResNet / ResNet-50)
# --------------------------------------------------------------------------


def _randomize_bn(module: nn.Module) -> None:
    """Non-trivial BatchNorm parameters and running stats.

    With the defaults (weight 1, bias 0, mean 0, var 1) BN folding is barely
    tested, and the exporter deduplicates the identical all-zero folded biases
    into Identity nodes.
    """
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.normal_(m.bias, 0.0, 0.1)
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def _conv_bn(cin: int, cout: int, k: int, stride: int = 1, groups: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, (k - 1) // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    )


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, planes: int, stride: int = 1, downsample: nn.Module | None = None):
        super().__init__()
        width = planes
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet(nn.Module):
    """torchvision.models.ResNet, written out (torchvision isn't available)."""

    def __init__(self, block, layers: list[int], widths: list[int], stem: int, num_classes: int):
        super().__init__()
        self.inplanes = stem
        self.conv1 = nn.Conv2d(3, stem, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(stem)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = []
        for i, (n, w) in enumerate(zip(layers, widths)):
            stages.append(self._make_layer(block, w, n, stride=1 if i == 0 else 2))
        self.layers = nn.Sequential(*stages)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(self.inplanes, num_classes)
        _randomize_bn(self)

    def _make_layer(self, block, planes: int, blocks: int, stride: int) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes * block.expansion:
            downsample = _conv_bn(self.inplanes, planes * block.expansion, 1, stride)
        layers = [block(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * block.expansion
        layers += [block(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layers(x)
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def build_cnn(size: str, batch: int = 1) -> Built:
    if size == "small":
        model = ResNet(BasicBlock, [1, 1], [16, 32], stem=16, num_classes=10)
        x = torch.randn(batch, 3, 32, 32)
    else:  # ResNet-50
        model = ResNet(Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512], stem=64, num_classes=1000)
        x = torch.randn(batch, 3, 224, 224)
    return Built(model, {"input": x}, ["logits"])


def build_cnn_dynamic(size: str) -> Built:
    built = build_cnn(size, batch=2)
    built.dynamic_axes = {"input": {0: "batch"}, "logits": {0: "batch"}}
    return built


# --------------------------------------------------------------------------
# mobilenet: MobileNetV3
# --------------------------------------------------------------------------


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    if new_v < 0.9 * v:
        new_v += divisor
    return new_v


class SqueezeExcitation(nn.Module):
    def __init__(self, c: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(c, squeeze, 1)
        self.relu = nn.ReLU()
        self.fc2 = nn.Conv2d(squeeze, c, 1)
        self.scale_act = nn.Hardsigmoid()

    def forward(self, x):
        s = self.scale_act(self.fc2(self.relu(self.fc1(self.avgpool(x)))))
        return x * s


class InvertedResidual(nn.Module):
    # (kernel, expanded, out, use_se, activation "RE"/"HS", stride, expand-conv groups)
    def __init__(self, cin: int, k: int, exp: int, cout: int, se: bool, act: str, stride: int, groups: int = 1):
        super().__init__()
        Act = nn.Hardswish if act == "HS" else nn.ReLU
        self.use_res = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if exp != cin:
            layers += [_conv_bn(cin, exp, 1, groups=groups), Act()]
        layers += [_conv_bn(exp, exp, k, stride, groups=exp), Act()]  # depthwise
        if se:
            layers.append(SqueezeExcitation(exp, _make_divisible(exp // 4)))
        layers.append(_conv_bn(exp, cout, 1))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return x + y if self.use_res else y


class MobileNetV3(nn.Module):
    def __init__(self, cfg, stem: int, last: int, hidden: int, num_classes: int):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, stem, 3, 2), nn.Hardswish()]
        cin = stem
        for k, exp, cout, se, act, stride, groups in cfg:
            layers.append(InvertedResidual(cin, k, exp, cout, se, act, stride, groups))
            cin = cout
        layers += [_conv_bn(cin, last, 1), nn.Hardswish()]
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(
            nn.Linear(last, hidden), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(hidden, num_classes)
        )
        _randomize_bn(self)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def build_mobilenet(size: str) -> Built:
    if size == "small":
        cfg = [
            (3, 16, 16, True, "RE", 2, 1),
            (3, 48, 24, False, "RE", 2, 2),  # grouped expand conv (groups=2)
            (5, 64, 24, True, "HS", 1, 1),  # residual
            (5, 96, 32, True, "HS", 2, 4),  # grouped expand conv (groups=4)
        ]
        model = MobileNetV3(cfg, stem=16, last=96, hidden=128, num_classes=10)
        x = torch.randn(1, 3, 32, 32)
    else:  # MobileNetV3-Small (torchvision table), plus one grouped expand conv
        cfg = [
            (3, 16, 16, True, "RE", 2, 1),
            (3, 72, 24, False, "RE", 2, 1),
            (3, 88, 24, False, "RE", 1, 2),
            (5, 96, 40, True, "HS", 2, 1),
            (5, 240, 40, True, "HS", 1, 1),
            (5, 240, 40, True, "HS", 1, 1),
            (5, 120, 48, True, "HS", 1, 1),
            (5, 144, 48, True, "HS", 1, 1),
            (5, 288, 96, True, "HS", 2, 1),
            (5, 576, 96, True, "HS", 1, 1),
            (5, 576, 96, True, "HS", 1, 1),
        ]
        model = MobileNetV3(cfg, stem=16, last=576, hidden=1024, num_classes=1000)
        x = torch.randn(1, 3, 224, 224)
    return Built(model, {"input": x}, ["logits"])


# --------------------------------------------------------------------------
# yolo: YOLOv8-like detector
# --------------------------------------------------------------------------


class ConvBnSiLU(nn.Module):
    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class YoloBottleneck(nn.Module):
    def __init__(self, c: int, shortcut: bool = True):
        super().__init__()
        self.cv1 = ConvBnSiLU(c, c, 3)
        self.cv2 = ConvBnSiLU(c, c, 3)
        self.add = shortcut

    def forward(self, x):
        y = self.cv2(self.cv1(x))
        return x + y if self.add else y


class C2f(nn.Module):
    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True):
        super().__init__()
        self.c = cout // 2
        self.cv1 = ConvBnSiLU(cin, 2 * self.c, 1)
        self.cv2 = ConvBnSiLU((2 + n) * self.c, cout, 1)
        self.m = nn.ModuleList(YoloBottleneck(self.c, shortcut) for _ in range(n))

    def forward(self, x):
        # torch.split with explicit sizes -> ONNX Split.  (x.chunk(2, 1) exports
        # as Shape/Gather/Div/Slice chains at opset 13+.)
        y = list(self.cv1(x).split((self.c, self.c), 1))
        for m in self.m:
            y.append(m(y[-1]))
        return self.cv2(torch.cat(y, 1))


class SPPF(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        c = cin // 2
        self.cv1 = ConvBnSiLU(cin, c, 1)
        self.cv2 = ConvBnSiLU(c * 4, cout, 1)
        self.m = nn.MaxPool2d(5, 1, 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat([x, y1, y2, self.m(y2)], 1))


class Yolo(nn.Module):
    def __init__(self, w: int, n: int, num_classes: int = 8, reg: int = 4):
        super().__init__()
        self.stem = ConvBnSiLU(3, w, 3, 2)  # /2
        self.down1 = ConvBnSiLU(w, 2 * w, 3, 2)  # /4
        self.c2f1 = C2f(2 * w, 2 * w, n)
        self.down2 = ConvBnSiLU(2 * w, 4 * w, 3, 2)  # /8  -> P3
        self.c2f2 = C2f(4 * w, 4 * w, n)
        self.down3 = ConvBnSiLU(4 * w, 8 * w, 3, 2)  # /16 -> P4
        self.c2f3 = C2f(8 * w, 8 * w, n)
        self.down4 = ConvBnSiLU(8 * w, 8 * w, 3, 2)  # /32 -> P5
        self.sppf = SPPF(8 * w, 8 * w)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.neck4 = C2f(16 * w, 8 * w, n, shortcut=False)
        self.neck3 = C2f(12 * w, 4 * w, n, shortcut=False)
        no = num_classes + reg
        self.heads = nn.ModuleList(
            nn.Sequential(ConvBnSiLU(c, c, 3), nn.Conv2d(c, no, 1)) for c in (4 * w, 8 * w, 8 * w)
        )
        self.no = no
        _randomize_bn(self)

    def forward(self, x):
        x = self.c2f1(self.down1(self.stem(x)))
        p3 = self.c2f2(self.down2(x))
        p4 = self.c2f3(self.down3(p3))
        p5 = self.sppf(self.down4(p4))
        n4 = self.neck4(torch.cat([self.up(p5), p4], 1))  # Resize nearest
        up3 = F.interpolate(n4, size=p3.shape[-2:], mode="bilinear", align_corners=False)  # Resize linear
        n3 = self.neck3(torch.cat([up3, p3], 1))
        outs = [h(f).flatten(2) for h, f in zip(self.heads, (n3, n4, p5))]
        return torch.cat(outs, 2)  # [B, no, anchors]


def build_yolo(size: str) -> Built:
    if size == "small":
        model, x = Yolo(w=8, n=1), torch.randn(1, 3, 64, 64)
    else:
        model, x = Yolo(w=16, n=2, num_classes=80), torch.randn(1, 3, 640, 640)
    return Built(model, {"images": x}, ["detections"])


# --------------------------------------------------------------------------
# ocr: CRNN-like recognizer with a few side heads
# --------------------------------------------------------------------------


class OCR(nn.Module):
    def __init__(self, c: int, hidden: int, num_chars: int, num_orient: int = 4):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(
                nn.Conv2d(cin, cout, 3, 1, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU6()
            )

        self.b1 = block(1, c)
        self.pool1 = nn.AvgPool2d(2)  # H/2
        self.b2 = block(c, 2 * c)
        self.pool2 = nn.AvgPool2d(2)  # H/4
        # BatchNorm after pooling can't be folded into a Conv: keeps a real
        # BatchNormalization node in the graph.
        self.bn_post = nn.BatchNorm2d(2 * c)
        self.b3 = block(2 * c, 4 * c)
        self.pool3 = nn.AvgPool2d((2, 1))  # H/8
        self.act = nn.Hardtanh(0.0, 4.0)
        # text-segmentation branch: upsample back to H/2 with a transposed conv
        self.deconv = nn.ConvTranspose2d(2 * c, c, 2, stride=2)
        self.seg = nn.Conv2d(c, 1, 1)
        # orientation classification head
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.orient = nn.Linear(4 * c, num_orient)
        # recognition head
        self.rnn = nn.LSTM(4 * c, hidden, num_layers=1, bidirectional=True)
        self.fc = nn.Linear(2 * hidden, num_chars)
        _randomize_bn(self)

    def forward(self, x):
        f1 = self.pool1(self.b1(x))
        f2 = self.bn_post(self.pool2(self.b2(f1)))
        seg = torch.sigmoid(self.seg(F.relu(self.deconv(f2))))
        f3 = self.act(self.pool3(self.b3(f2)))  # [B, C, H', W]
        orient = self.orient(torch.flatten(self.gap(f3), 1))
        seq = f3.mean(2).permute(2, 0, 1)  # [T=W, B, C]
        y, _ = self.rnn(seq)
        logits = self.fc(y)  # [T, B, num_chars]
        return logits, orient, seg


def build_ocr(size: str) -> Built:
    if size == "small":
        model, x = OCR(c=8, hidden=16, num_chars=40), torch.randn(1, 1, 32, 64)
    else:
        model, x = OCR(c=64, hidden=256, num_chars=6625), torch.randn(1, 1, 48, 320)
    return Built(model, {"input": x}, ["seq_logits", "orient_logits", "seg"])


# --------------------------------------------------------------------------
# lstm: plain 2-layer LSTM
# --------------------------------------------------------------------------


class RNNModel(nn.Module):
    """An nn.LSTM (unidirectional) or nn.GRU (bidirectional) stack plus a Linear head."""

    def __init__(self, cell: str, inp: int, hidden: int, layers: int, out: int):
        super().__init__()
        bidir = cell == "gru"
        self.rnn = (nn.GRU if bidir else nn.LSTM)(inp, hidden, num_layers=layers, bidirectional=bidir)
        self.fc = nn.Linear((2 if bidir else 1) * hidden, out)

    def forward(self, x):
        y, state = self.rnn(x)
        h = state[0] if isinstance(state, tuple) else state  # LSTM returns (h, c)
        return self.fc(y), h


def _build_rnn(cell: str, size: str, small_hidden: int) -> Built:
    if size == "small":
        model, x = RNNModel(cell, 16, small_hidden, 2, 10), torch.randn(8, 2, 16)
    else:
        model, x = RNNModel(cell, 128, 512, 2, 1000), torch.randn(64, 1, 128)
    return Built(model, {"input": x}, ["logits", "h_n"])


def build_lstm(size: str) -> Built:
    return _build_rnn("lstm", size, 32)


class StackedLSTM(nn.Module):
    """Rammer's LSTM-TC case: a stack of unidirectional LSTM layers, the last step's h as output."""

    def __init__(self, hidden: int, layers: int):
        super().__init__()
        self.rnn = nn.LSTM(hidden, hidden, num_layers=layers)

    def forward(self, x):
        y, (h, _) = self.rnn(x)
        return y[-1], h


def build_lstm_tc(size: str) -> Built:
    """small: 3 layers x 6 steps, hidden 32; full: Rammer's LSTM-TC, 10 layers x 100 steps, hidden
    256, batch 1 (2,030 launches one kernel per op)."""
    hidden, layers, steps = (32, 3, 6) if size == "small" else (256, 10, 100)
    return Built(StackedLSTM(hidden, layers), {"input": torch.randn(steps, 1, hidden)}, ["last", "h_n"])


def build_gru(size: str) -> Built:
    return _build_rnn("gru", size, 24)


# --------------------------------------------------------------------------
# transformers models
# --------------------------------------------------------------------------


class HFWrapper(nn.Module):
    """Calls a transformers model with keyword inputs; returns a tuple of tensors."""

    def __init__(self, model: nn.Module, input_names: list[str], output_keys: list[str], ones_mask: bool = False):
        super().__init__()
        self.model = model
        self.input_names = input_names
        self.output_keys = output_keys
        self.ones_mask = ones_mask

    def forward(self, *args):
        kwargs = dict(zip(self.input_names, args))
        if self.ones_mask:
            # Without an attention_mask, transformers 5 checks position_ids for
            # packed sequences with torch.diff, which the TorchScript exporter
            # can't export.  An all-ones mask of static shape constant-folds.
            kwargs["attention_mask"] = torch.ones_like(kwargs["input_ids"])
        out = self.model(**kwargs, return_dict=True)
        return tuple(out[k] for k in self.output_keys)


def _hf(model: nn.Module, inputs: dict[str, torch.Tensor], outputs: list[str], ones_mask: bool = False) -> Built:
    # transformers initializes every bias to 0 and every LayerNorm to (1, 0):
    # a dropped bias would go unnoticed, and the exporter deduplicates the
    # identical initializers into Identity nodes.  Perturb all parameters.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p), alpha=0.02)
    return Built(HFWrapper(model, list(inputs), outputs, ones_mask), inputs, outputs)


# "eager" attention exports to plain MatMul/Softmax.  "sdpa" exports too, but
# adds IsNaN/Where guards and splits the 1/sqrt(d) scaling over Q and K.
ATTN = "eager"


def build_bert(size: str) -> Built:
    from transformers import BertConfig, BertModel

    if size == "small":
        cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   vocab_size=1000, max_position_embeddings=64)
        seq = 16
    else:  # bert-base-uncased
        cfg = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   vocab_size=30522, max_position_embeddings=512)
        seq = 128
    model = BertModel(BertConfig(**cfg, attn_implementation=ATTN))
    ids = torch.randint(0, 1000, (1, seq), dtype=torch.int64)
    mask = torch.ones(1, seq, dtype=torch.int64)
    return _hf(model, {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state", "pooler_output"])


def build_bert_small(size: str) -> Built:
    """BERT-small (4 layers, hidden 256, 4 heads, seq 128), the size of the H100 profiler trace
    ../shared/traces/h100_bert-small_infer_bs1: batch 1 at size small, batch 8 at size full."""
    from transformers import BertConfig, BertModel

    cfg = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
               vocab_size=30522, max_position_embeddings=512)
    batch = 1 if size == "small" else 8
    model = BertModel(BertConfig(**cfg, attn_implementation=ATTN))
    ids = torch.randint(0, 1000, (batch, 128), dtype=torch.int64)
    mask = torch.ones(batch, 128, dtype=torch.int64)
    return _hf(model, {"input_ids": ids, "attention_mask": mask}, ["last_hidden_state", "pooler_output"])


def build_gpt2(size: str) -> Built:
    from transformers import GPT2Config, GPT2LMHeadModel

    if size == "small":
        cfg = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=1000, n_positions=64)
        seq = 16
    else:  # gpt2 (124M)
        cfg = dict(n_embd=768, n_layer=12, n_head=12, vocab_size=50257, n_positions=1024)
        seq = 128
    v = cfg["vocab_size"] - 1
    config = GPT2Config(**cfg, bos_token_id=v, eos_token_id=v, use_cache=False, attn_implementation=ATTN)
    model = GPT2LMHeadModel(config)
    model.config.use_cache = False
    ids = torch.randint(0, 1000, (1, seq), dtype=torch.int64)
    return _hf(model, {"input_ids": ids}, ["logits"], ones_mask=True)


def build_vit(size: str) -> Built:
    from transformers import ViTConfig, ViTModel

    if size == "small":
        cfg = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   image_size=32, patch_size=8, num_channels=3)
    else:  # ViT-B/16
        cfg = dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072,
                   image_size=224, patch_size=16, num_channels=3)
    model = ViTModel(ViTConfig(**cfg, attn_implementation=ATTN))
    x = torch.randn(1, 3, cfg["image_size"], cfg["image_size"])
    return _hf(model, {"pixel_values": x}, ["last_hidden_state", "pooler_output"])


# --------------------------------------------------------------------------
# registry
# --------------------------------------------------------------------------


MODELS: dict[str, ModelSpec] = {
    s.name: s
    for s in [
        ModelSpec("cnn", "ResNet: mini BasicBlock ResNet 3x32x32 (small) / ResNet-50 3x224x224 (full)", build_cnn),
        ModelSpec("cnn-dynamic", "the cnn model with a dynamic batch dimension ('batch')", build_cnn_dynamic,
                  dim_values={"batch": 2}),
        ModelSpec("mobilenet", "MobileNetV3: depthwise/grouped conv, Hardswish, squeeze-excite", build_mobilenet),
        ModelSpec("yolo", "YOLOv8-like: Conv-BN-SiLU, C2f (Split), SPPF, Resize nearest+linear", build_yolo),
        ModelSpec("ocr", "CRNN-like: ReLU6/Clip, AvgPool, ConvTranspose, GAP head, BiLSTM head", build_ocr),
        ModelSpec("lstm", "2-layer LSTM + Linear on [seq, batch, feat]", build_lstm),
        ModelSpec("lstm-tc", "stacked LSTM (Rammer's LSTM-TC: 10 layers x 100 steps, hidden 256 at full size)",
                  build_lstm_tc),
        ModelSpec("gru", "2-layer bidirectional GRU + Linear on [seq, batch, feat]", build_gru),
        ModelSpec("bert", "transformers BertModel (tiny / bert-base), input_ids + attention_mask", build_bert,
                  int_high={"input_ids": 1000}, masks=("attention_mask",)),
        ModelSpec("bert-small", "transformers BERT-small (4 layers, hidden 256, seq 128): batch 1 (small) / 8 (full)",
                  build_bert_small, int_high={"input_ids": 1000}, masks=("attention_mask",)),
        ModelSpec("gpt2", "transformers GPT2LMHeadModel (tiny / gpt2-124M), no KV cache", build_gpt2,
                  int_high={"input_ids": 1000}),
        ModelSpec("vit", "transformers ViTModel (tiny / ViT-B/16)", build_vit),
    ]
}


# --------------------------------------------------------------------------
# export / inputs / verification
# --------------------------------------------------------------------------


def _spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(MODELS)}") from None


def build(name: str, size: str = "small") -> Built:
    """Build the (seeded, eval-mode) torch model and its example inputs."""
    spec = _spec(name)
    if size not in spec.sizes:
        raise ValueError(f"model {name!r} has no size {size!r} (sizes: {spec.sizes})")
    torch.manual_seed(0)
    built = spec.build(size)
    built.module.eval()
    return built


def export(name: str, out_dir: Path, size: str = "small", verify: bool = True) -> Path:
    """Export model ``name`` to ``out_dir/{name}-{size}.onnx`` and return the path.

    Skips the export if the file already exists.  A fresh export is written to
    a temporary file and renamed into place, so concurrent callers never see a
    partial file.  With ``verify`` the fresh export is checked with
    ``onnx.checker`` and run with onnxruntime against the torch model.
    """
    out_dir = Path(out_dir)
    path = out_dir / f"{name}-{size}.onnx"
    if path.exists():
        return path
    built = build(name, size)
    out_dir.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{name}-{size}.", suffix=".onnx.tmp", dir=out_dir)
    os.close(fd)
    try:
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")
            torch.onnx.export(
                built.module,
                tuple(built.inputs.values()),
                tmp,
                dynamo=False,
                opset_version=OPSET,
                input_names=list(built.inputs),
                output_names=built.output_names,
                dynamic_axes=built.dynamic_axes,
                do_constant_folding=True,
            )
        if verify:
            verify_export(name, tmp, built)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def _np_dtype(elem_type: int) -> np.dtype:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def input_signature(model_path: Path | str) -> list[tuple[str, list[int | str], np.dtype]]:
    """[(name, shape, numpy dtype)] of the graph inputs; symbolic dims are str."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in model.graph.initializer}
    sig = []
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim]
        sig.append((inp.name, shape, _np_dtype(tt.elem_type)))
    return sig


def sample_inputs(name: str, model_path: Path | str, seed: int = 0,
                  dim_values: dict[str, int] | None = None) -> dict[str, np.ndarray]:
    """Seeded random feeds for the exported model ``name`` at ``model_path``.

    Floats are standard normal; integer inputs listed in the spec's
    ``int_high`` are uniform in ``[0, high)``; the spec's ``masks`` (and any
    int or bool input whose name contains "mask") are right-padded attention
    masks with zeros (``dlcc.inputs.padding_mask``), so that masking is
    checked; names containing "ids" default to ``[0, 100)``; other ints are
    zeros, other bools ones.  Symbolic dims are bound from ``dim_values``,
    then the spec's ``dim_values``, else 1.
    """
    from dlcc.inputs import padding_mask

    spec = _spec(name)
    dims = {**spec.dim_values, **(dim_values or {})}
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for iname, shape, dtype in input_signature(model_path):
        shp = tuple(d if isinstance(d, int) else dims.get(d, 1) for d in shape)
        if np.issubdtype(dtype, np.floating):
            feeds[iname] = rng.standard_normal(shp).astype(dtype)
        elif np.issubdtype(dtype, np.integer):
            if iname in spec.int_high:
                feeds[iname] = rng.integers(0, spec.int_high[iname], shp).astype(dtype)
            elif iname in spec.masks or "mask" in iname.lower():
                feeds[iname] = padding_mask(rng, shp, dtype)
            elif "ids" in iname:
                feeds[iname] = rng.integers(0, 100, shp).astype(dtype)
            else:
                feeds[iname] = np.zeros(shp, dtype)
        elif dtype == np.bool_:
            feeds[iname] = padding_mask(rng, shp, dtype) if "mask" in iname.lower() else np.ones(shp, dtype)
        else:
            raise TypeError(f"{name}: input {iname!r} has unsupported dtype {dtype}")
    return feeds


def run_ort(model_path: Path | str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds)))


def verify_export(name: str, model_path: Path | str, built: Built | None = None,
                  seed: int = 0, rtol: float = 1e-3, atol: float = 1e-4) -> dict[str, np.ndarray]:
    """onnx.checker + onnxruntime run; compares with torch if ``built`` is given."""
    import onnx

    onnx.checker.check_model(str(model_path), full_check=True)
    feeds = sample_inputs(name, model_path, seed)
    outs = run_ort(model_path, feeds)
    if built is not None:
        with torch.no_grad():
            ref = built.module(*(torch.from_numpy(feeds[k]) for k in built.inputs))
        ref = ref if isinstance(ref, (tuple, list)) else (ref,)
        for oname, r in zip(built.output_names, ref):
            r = r.numpy()
            got = outs[oname]
            if got.shape != r.shape or not np.allclose(got, r, rtol=rtol, atol=atol):
                err = np.abs(got - r).max() if got.shape == r.shape else f"shape {got.shape} vs {r.shape}"
                raise AssertionError(f"{name}: output {oname!r} mismatches torch (max abs err {err})")
    return outs


def op_histogram(model_path: Path | str) -> collections.Counter:
    """Counter of op types (domain-qualified when not the default domain)."""
    import onnx

    model = onnx.load(str(model_path), load_external_data=False)
    return collections.Counter(
        n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}" for n in model.graph.node
    )


# --------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", help="models to export (default: all)")
    ap.add_argument("-o", "--out-dir", type=Path, default=Path("models"), help="output directory (default: models)")
    ap.add_argument("--size", choices=SIZES, default="small")
    ap.add_argument("--list", action="store_true", help="list the models and exit")
    ap.add_argument("--no-verify", action="store_true", help="skip onnx.checker / onnxruntime verification")
    args = ap.parse_args(argv)

    if args.list:
        width = max(map(len, MODELS))
        for spec in MODELS.values():
            print(f"{spec.name:<{width}}  {spec.description}")
        return 0

    names = args.names or list(MODELS)
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        ap.error(f"unknown model(s) {', '.join(unknown)}; known: {', '.join(MODELS)}")
    for n in names:
        path = args.out_dir / f"{n}-{args.size}.onnx"
        existed = path.exists()
        t0 = time.perf_counter()
        path = export(n, args.out_dir, args.size, verify=not args.no_verify)
        dt = time.perf_counter() - t0
        if existed and not args.no_verify:
            verify_export(n, path)
        hist = op_histogram(path)
        sig = ", ".join(f"{i}{list(s)}:{d}" for i, s, d in input_signature(path))
        how = "exists" if existed else f"exported in {dt:.1f}s"
        print(f"{path}  ({path.stat().st_size / 1e6:.2f} MB, {how})")
        print(f"  inputs: {sig}")
        print(f"  ops ({sum(hist.values())}): {dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
