"""com.microsoft's MatMulNBits (weights quantized block-wise to 2, 4 or 8 bits, as
`onnxruntime.quantization.matmul_nbits_quantizer` and onnxruntime-genai's builders write them for
int4 LLMs) and GatherBlockQuantized (an embedding table quantized the same way, which that
quantizer writes when asked to quantize Gathers) rewritten at import, as dlcc/quantized.py
rewrites the other quantization ops.

The weights are constants, so they are dequantized here, once, in numpy: each k of row n is
`(q[n, k] - zero_point[n, block]) * scale[n, block]`, with the block k // block_size (the deprecated
g_idx input is refused), the values unpacked least significant bits first from each block's
bytes, the zero points either packed the same way (uint8) or given as floats, and 2^(bits-1)
when absent. The node becomes a MatMul of A with that [K, N] float weight, plus the bias.

This is onnxruntime's result where its `accuracy_level` is unset or 1 (float32 products of the
dequantized weights). At level 4 onnxruntime quantizes A to int8 per block first, an
approximation the attribute permits; dlcc computes the float products, and verify's reference
runs the model at level 0 (quantized.exact_products), which is the product the model describes.

GatherBlockQuantized's table is a constant too: it is dequantized here the same way along its
quantize_axis (uint8 packed values, or int4 and uint4 tensors, whose default zero point is 0),
and the node becomes a Gather from the float table. Where an index is out of range, onnxruntime
returns zeros and dlcc reports the index as it does for any Gather.

Unlike the other quantized rewrites, the MatMul made here follows the plan's precision (bf16
tensor cores for an int4 LLM at `--precision bf16`): its result is not quantized again, so no
rounding tie depends on it. It holds its weights at float width, not in 4 bits: the model's
memory saving is not kept.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import helper

if TYPE_CHECKING:  # (dlcc/quantized.py imports this module at its end, for its _LOWER table)
    from .quantized import _Builder


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first `count` `bits`-bit values of each row of uint8 `packed` (last axis), least
    significant bits first, as int32."""
    flat = np.unpackbits(np.ascontiguousarray(packed, np.uint8), axis=-1, bitorder="little")
    n = flat.shape[-1] // bits
    vals = flat[..., :n * bits].reshape(*flat.shape[:-1], n, bits).astype(np.int32)
    vals = (vals << np.arange(bits, dtype=np.int32)).sum(axis=-1)
    return vals[..., :count]


def dequantized_weight(w: np.ndarray, scales: np.ndarray, zero_points: np.ndarray | None,
                       K: int, N: int, bits: int, block: int) -> np.ndarray:
    """The [K, N] float32 weight that MatMulNBits' packed B, scales and zero points describe."""
    k_blocks = -(-K // block)
    if w.size == 0:  # an omitted projection: Y is the bias alone
        return np.zeros((K, N), np.float32)
    q = unpack_bits(w.reshape(N, k_blocks, -1), bits, block).reshape(N, k_blocks * block)[:, :K]
    s = scales.astype(np.float32).reshape(N, k_blocks)
    if zero_points is None:
        z = np.full((N, k_blocks), 2 ** (bits - 1), np.float32)
    elif zero_points.dtype == np.uint8:
        z = unpack_bits(zero_points.reshape(N, -1), bits, k_blocks).astype(np.float32)
    else:
        z = zero_points.astype(np.float32).reshape(N, k_blocks)
    gi = np.arange(K) // block
    wt = (q.astype(np.float32) - z[:, gi]) * s[:, gi]  # [N, K]
    return np.ascontiguousarray(wt.T)


def matmul_nbits(b: _Builder) -> None:
    a, w, scales, zp, g_idx, bias = (b.input(i) for i in range(6))
    if int(b.attrs.get("weight_prepacked", 0)):
        raise b.fail("weights prepacked into a CUDA layout (weight_prepacked) are not supported", _lowering_error())
    K, N, block = (int(b.attrs.get(k, 0)) for k in ("K", "N", "block_size"))
    bits = int(b.attrs.get("bits", 4))
    if K <= 0 or N <= 0 or block < 16 or block & (block - 1):
        raise b.fail(f"K {K} and N {N} must be positive and block_size {block} a power of two of at least 16")
    if bits not in (2, 4, 8):
        raise b.fail(f"{bits}-bit weights are not supported (onnxruntime's CPU kernel, the reference, has 2, 4 and 8)",
                     _lowering_error())
    vals = {name: b.const(name) for name in (w, scales, zp) if name}
    if any(v is None for v in vals.values()):
        raise b.fail("B, scales and zero_points must be constants (weights), as the quantizer writes them",
                     _lowering_error())
    k_blocks = -(-K // block)
    wv, sv = vals[w], vals[scales]
    if wv.size and (wv.dtype != np.uint8 or wv.size != N * k_blocks * (block * bits // 8)):
        raise b.fail(f"B must be uint8 of shape [N, k_blocks, blob_size] = [{N}, {k_blocks}, {block * bits // 8}], "
                     f"not {wv.dtype} {list(wv.shape)}")
    if wv.size and sv.size != N * k_blocks:
        raise b.fail(f"scales must hold N x k_blocks = {N * k_blocks} values, not {sv.size}")
    zv = vals.get(zp) if zp else None
    if zv is not None:
        want = N * -(-k_blocks * bits // 8) if zv.dtype == np.uint8 else N * k_blocks
        if zv.size != want:
            raise b.fail(f"zero_points must hold {want} values, not {zv.size}")
    if g_idx:
        # (onnxruntime's deprecated reorder path: its answer differs from the plain one even for
        # g_idx = k // block_size, and its schema does not say its layout)
        raise b.fail("the deprecated g_idx input is not supported", _lowering_error())
    weight = dequantized_weight(wv, sv, zv, K, N, bits, block)
    a_type = helper.tensor_dtype_to_np_dtype(b.elem(a) or 1)
    y = b.op("MatMul", [a, b.shared(("nbits", w, scales, zp), lambda: weight) if a_type == np.float32
                        else b.constant(weight.astype(a_type), a_type)])
    b.op("Add" if bias else "Identity", [y, bias] if bias else [y], b.node.output[0])
    b.track = False  # (follows the plan's precision: module docstring)


def gather_block_quantized(b: _Builder) -> None:
    data, idx, scales, zp = (b.input(i) for i in range(4))
    vals = {name: b.const(name) for name in (data, scales, zp) if name}
    if any(v is None for v in vals.values()):
        raise b.fail("data, scales and zero_points must be constants (weights)", _lowering_error())
    dv, sv = vals[data], vals[scales]
    zv = vals.get(zp) if zp else None
    bits, block = int(b.attrs.get("bits", 4)), int(b.attrs.get("block_size", 128))
    rank = dv.ndim
    qa, ga = int(b.attrs.get("quantize_axis", 1)), int(b.attrs.get("gather_axis", 0))
    if not (-rank <= qa < rank and -rank <= ga < rank) or rank < 1:
        raise b.fail(f"quantize_axis {qa} and gather_axis {ga} must be axes of the data's {rank} dims")
    qa, ga = qa % rank, ga % rank
    kind = dv.dtype.name
    if kind == "uint8":
        if bits not in (2, 4, 8):
            raise b.fail(f"{bits}-bit uint8 data is not supported (2, 4 and 8 are)")
        count = dv.shape[-1] * 8 // bits
        q = unpack_bits(dv, bits, count) if bits < 8 else dv.astype(np.int32)
        if zv is not None and bits < 8:
            zv = unpack_bits(zv, bits, -(-count // block) if qa == rank - 1 else zv.shape[-1] * 8 // bits)
        default_zp = 2 ** (bits - 1)
    elif kind in ("int4", "uint4"):
        q, default_zp = dv.astype(np.int32), 0
    else:
        raise b.fail(f"data of type {kind} is not supported (uint8, int4 and uint4 are)", _lowering_error())
    if block < 16 or block & (block - 1):
        raise b.fail(f"block_size {block} must be a power of two of at least 16")
    blocks = -(-q.shape[qa] // block)
    want = q.shape[:qa] + (blocks,) + q.shape[qa + 1:]
    if sv.shape != want or (zv is not None and tuple(zv.shape) != want):
        raise b.fail(f"scales and zero_points must have shape {list(want)}, not {list(sv.shape)}"
                     + (f" and {list(zv.shape)}" if zv is not None else ""))
    z = np.full(want, default_zp, np.float32) if zv is None else zv.astype(np.float32)
    s = sv.astype(np.float32)
    crop = [slice(None)] * rank
    crop[qa] = slice(0, q.shape[qa])
    table = (q.astype(np.float32) - np.repeat(z, block, axis=qa)[tuple(crop)]) * np.repeat(s, block, axis=qa)[tuple(crop)]
    out = sv.dtype
    b.op("Gather", [b.shared(("gbq", data, scales, zp), lambda: table) if out == np.float32
                    else b.constant(table.astype(out), out), idx], b.node.output[0], axis=ga)
    b.track = False  # (a table lookup: nothing rounds after it)


def _lowering_error():
    from .ops.context import LoweringError

    return LoweringError
