"""FLOP and byte counts of common ATen operators from their recorded input shapes.

Input: the operator name and the raw JSON text of its ``Input Dims`` / ``Input type`` (as the
reader keeps them in ``cpu_ops.input_dims`` / ``input_types``), and optionally ``Concrete Inputs``.
Output: an ``OpCost`` (FLOPs, bytes moved to/from device memory, data type, whether the count is
exact) or None when the shapes do not fit the formula.

Formulas (M×K @ K×N costs 2·M·K·N FLOPs: one multiply and one add per term):

- ``mm`` [M,K]·[K,N]: 2MKN; ``addmm`` (bias, [M,K], [K,N]): 2MKN + MN; ``bmm`` / ``baddbmm``:
  2·B·M·K·N; ``matmul``: batch dims broadcast, 1-D operands promoted as PyTorch does;
  ``linear`` ([*,K], [N,K], bias): 2·rows·K·N (+ rows·N with bias); ``_scaled_mm`` (fp8) as mm.
  Bytes: every operand read once and the output written once.
- convolution (``convolution``, ``_convolution``, ``conv1d/2d/3d``, ``cudnn_convolution``,
  ``miopen_convolution``, ``mkldnn_convolution``): input [N,C,*S], weight [O,C/g,*K]:
  2·N·O·prod(S_out)·(C/g)·prod(K). Stride, padding and dilation are in ``Concrete Inputs``; when
  they are not available the output size is taken equal to the input size (stride 1, 'same'
  padding), an upper bound for strided convolutions, and the cost is marked inexact.
  ``convolution_backward`` (grad_out, input, weight, ...): the output size is exact (grad_out);
  FLOPs = 2 × forward (input gradient + weight gradient).
- attention (``scaled_dot_product_attention`` and the flash / efficient / cuDNN variants):
  q [..., Lq, D], k [..., Lk, D], v [..., Lk, Dv] (``_flash_attention_forward`` and
  ``_efficient_attention_forward`` use [B, L, H, D]): 2·B·H·Lq·Lk·(D + Dv). Causal masking halves
  the work; ``is_causal`` is a concrete input, so without it the cost is an upper bound (inexact).
  Backward variants: 2.5 × forward (two matmuls recomputed/propagated per forward matmul plus the
  recomputed scores), bytes = q, k, v, out, grad_out read and three gradients written.
- element-wise (add, mul, div, relu, gelu, silu, pow, exp, where, ..., their in-place ``_`` forms
  and activation backwards): FLOPs = numel(output) (broadcast of the tensor inputs), bytes =
  tensor inputs + output.
- reductions ``sum`` / ``mean``: FLOPs = numel(input); bytes = input (the output, at most as large,
  is left out: a lower bound, marked inexact).
- memory ``copy_`` (dst, src): 0 FLOPs, bytes = src read + dst written; ``fill_`` / ``zero_``:
  bytes = output written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from hermes_kb.core.dtypes import FLOAT_RANK, input_type
from hermes_kb.trace.args import decode


@dataclass(frozen=True)
class OpCost:
    category: str  # gemm, conv, attention, elementwise, reduction, memory
    flops: float
    bytes: float
    dtype: str  # fp32, bf16, fp16, fp8, fp64, int64, ... ("unknown")
    exact: bool = True
    thin: int = 0  # GEMMs: the smallest of M, N, K (the rows a small batch starves); 0 otherwise
    mkn: tuple[int, int, int] | None = None  # GEMMs: (M, K, N) of one product (batch dims left out)


@dataclass(frozen=True)
class _Tensor:
    shape: tuple[int, ...]
    dtype: str
    size: int  # bytes per element

    @property
    def numel(self) -> int:
        return math.prod(self.shape) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.numel * self.size


def _tensors(dims, types) -> list[_Tensor | None]:
    """One entry per argument: a tensor (shape, dtype) or None (scalar, list, None argument)."""
    out: list[_Tensor | None] = []
    if not isinstance(dims, list):
        return out
    types = types if isinstance(types, list) else []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else ""
        dt = input_type(t) if isinstance(t, str) else None
        if dt is None or not isinstance(d, list) or not all(isinstance(x, int) for x in d):
            out.append(None)
        else:
            out.append(_Tensor(tuple(d), dt[0], dt[1]))
    return out


def _real(ts: list[_Tensor]) -> list[_Tensor]:
    """Tensors that decide the result type: 0-d ones (wrapped Python scalars such as the 'double'
    of ``mul_(x, 0.9)``) only when there is nothing else."""
    nd = [t for t in ts if t.shape]
    return nd or ts


def _float_dtype(ts: list[_Tensor]) -> str:
    ts = _real(ts)
    best, rank = "unknown", -1
    for t in ts:
        r = FLOAT_RANK.get(t.dtype, 0)
        if r > rank:
            best, rank = t.dtype, r
    return best


def _out_size(ts: list[_Tensor]) -> int:
    """Bytes per element of a result: the widest floating type among the inputs."""
    ts = _real(ts)
    fl = [t.size for t in ts if t.dtype in FLOAT_RANK]
    return max(fl) if fl else (ts[0].size if ts else 4)


def _broadcast(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    n = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(1, n + 1):
        dims = {s[-i] for s in shapes if len(s) >= i} - {1}
        if len(dims) > 1:
            return None
        out.append(dims.pop() if dims else 1)
    return tuple(reversed(out))


# --- matrix multiplies ----------------------------------------------------------------------
def _mm_cost(a: _Tensor, b: _Tensor, extra: list[_Tensor], bias: bool, dtype_from: list[_Tensor]) -> OpCost | None:
    if len(a.shape) != 2 or len(b.shape) != 2 or a.shape[1] != b.shape[0]:
        return None
    m, k = a.shape
    n = b.shape[1]
    flops = 2.0 * m * k * n + (m * n if bias else 0)
    out_bytes = m * n * _out_size(dtype_from)
    nbytes = a.nbytes + b.nbytes + sum(t.nbytes for t in extra) + out_bytes
    return OpCost("gemm", flops, float(nbytes), _float_dtype(dtype_from), thin=min(m, k, n), mkn=(m, k, n))


def _mm(ts):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    return _mm_cost(ts[0], ts[1], [], False, [ts[0], ts[1]])


def _addmm(ts):
    if len(ts) < 3 or ts[1] is None or ts[2] is None:
        return None
    extra = [ts[0]] if ts[0] is not None else []
    return _mm_cost(ts[1], ts[2], extra, True, [ts[1], ts[2]])


def _bmm_cost(a: _Tensor, b: _Tensor, extra: list[_Tensor]) -> OpCost | None:
    if len(a.shape) != 3 or len(b.shape) != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        return None
    bs, m, k = a.shape
    n = b.shape[2]
    flops = 2.0 * bs * m * k * n
    nbytes = a.nbytes + b.nbytes + sum(t.nbytes for t in extra) + bs * m * n * _out_size([a, b])
    return OpCost("gemm", flops, float(nbytes), _float_dtype([a, b]), thin=min(m, k, n), mkn=(m, k, n))


def _bmm(ts):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    return _bmm_cost(ts[0], ts[1], [])


def _baddbmm(ts):
    if len(ts) < 3 or ts[1] is None or ts[2] is None:
        return None
    return _bmm_cost(ts[1], ts[2], [ts[0]] if ts[0] is not None else [])


def _matmul(ts):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    a, b = ts[0], ts[1]
    sa, sb = list(a.shape), list(b.shape)
    if not sa or not sb:
        return None
    if len(sa) == 1:
        sa = [1, sa[0]]
    if len(sb) == 1:
        sb = [sb[0], 1]
    if sa[-1] != sb[-2]:
        return None
    batch = _broadcast([tuple(sa[:-2]), tuple(sb[:-2])])
    if batch is None:
        return None
    nb = math.prod(batch) if batch else 1
    m, k, n = sa[-2], sa[-1], sb[-1]
    flops = 2.0 * nb * m * k * n
    nbytes = a.nbytes + b.nbytes + nb * m * n * _out_size([a, b])
    return OpCost("gemm", flops, float(nbytes), _float_dtype([a, b]), thin=min(m, k, n), mkn=(m, k, n))


def _linear(ts):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    x, w = ts[0], ts[1]
    bias = ts[2] if len(ts) > 2 else None
    if not x.shape or len(w.shape) != 2 or x.shape[-1] != w.shape[1]:
        return None
    rows = math.prod(x.shape[:-1]) if len(x.shape) > 1 else 1
    k, n = w.shape[1], w.shape[0]
    flops = 2.0 * rows * k * n + (rows * n if bias is not None else 0)
    nbytes = x.nbytes + w.nbytes + (bias.nbytes if bias is not None else 0) + rows * n * _out_size([x, w])
    return OpCost("gemm", flops, float(nbytes), _float_dtype([x, w]), thin=min(rows, k, n), mkn=(rows, k, n))


def _scaled_mm(ts):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    c = _mm_cost(ts[0], ts[1], [], False, [ts[0], ts[1]])
    if c is None:
        return None
    m, n = ts[0].shape[0], ts[1].shape[1]
    # fp8 operands, result usually bf16: count the output at 2 bytes
    nbytes = ts[0].nbytes + ts[1].nbytes + m * n * 2
    return OpCost("gemm", c.flops, float(nbytes), "fp8" if ts[0].dtype == "fp8" else c.dtype, mkn=c.mkn)


# --- convolution ----------------------------------------------------------------------------
def _conv_params(concrete, nsp: int, first: int) -> tuple[list[int], list[int], list[int]] | None:
    """stride, padding, dilation from Concrete Inputs starting at argument ``first``."""
    if not isinstance(concrete, list) or len(concrete) < first + 3:
        return None
    vals = []
    for raw in concrete[first : first + 3]:
        v = decode(raw) if isinstance(raw, str) else raw
        if isinstance(v, int):
            v = [v] * nsp
        if not isinstance(v, list) or not v or not all(isinstance(x, int) for x in v):
            return None
        if len(v) == 1:
            v = v * nsp
        vals.append(v[:nsp])
    return vals[0], vals[1], vals[2]


def _conv_out(spatial, kernel, params) -> tuple[list[int], bool]:
    if params is None:
        return list(spatial), False
    stride, pad, dil = params
    out = []
    for i, s in enumerate(spatial):
        k_eff = dil[i] * (kernel[i] - 1) + 1
        out.append(max(0, (s + 2 * pad[i] - k_eff) // stride[i] + 1))
    return out, True


def _conv(ts, concrete=None, name: str = ""):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    x, w = ts[0], ts[1]
    if len(x.shape) < 3 or len(w.shape) != len(x.shape):
        return None
    nsp = len(x.shape) - 2
    n, c = x.shape[0], x.shape[1]
    o, cg = w.shape[0], w.shape[1]
    kernel = list(w.shape[2:])
    if cg <= 0 or c % cg:
        return None
    # aten::conv2d(input, weight, bias, stride, padding, dilation, groups); the convolution family
    # (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...)
    std = name in ("aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d")
    params = _conv_params(concrete, nsp, 3) if std else None
    transposed = False
    if isinstance(concrete, list) and len(concrete) > 6 and name.endswith("convolution"):
        transposed = str(concrete[6]).strip().lower() == "true"
    if transposed:
        return None
    out_sp, exact = _conv_out(x.shape[2:], kernel, params)
    out_numel = n * o * math.prod(out_sp)
    flops = 2.0 * out_numel * cg * math.prod(kernel)
    bias = ts[2] if len(ts) > 2 and ts[2] is not None else None
    nbytes = x.nbytes + w.nbytes + (bias.nbytes if bias else 0) + out_numel * _out_size([x, w])
    return OpCost("conv", flops, float(nbytes), _float_dtype([x, w]), exact)


def _conv_backward(ts):
    # convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation,
    #                      transposed, output_padding, groups, output_mask)
    if len(ts) < 3 or ts[0] is None or ts[1] is None or ts[2] is None:
        return None
    go, x, w = ts[0], ts[1], ts[2]
    if len(x.shape) < 3 or len(w.shape) != len(x.shape) or len(go.shape) != len(x.shape):
        return None
    cg = w.shape[1]
    fwd = 2.0 * go.numel * cg * math.prod(w.shape[2:])
    # read grad_out, input, weight; write grad_input and grad_weight
    nbytes = go.nbytes + 2 * x.nbytes + 2 * w.nbytes
    return OpCost("conv", 2.0 * fwd, float(nbytes), _float_dtype([x, w]))


# --- attention ------------------------------------------------------------------------------
def _attn_dims(q: _Tensor, k: _Tensor, v: _Tensor, bhld: bool) -> tuple[int, int, int, int, int] | None:
    """(batch*heads, Lq, Lk, D, Dv)."""
    if len(q.shape) < 3 or len(k.shape) != len(q.shape) or len(v.shape) != len(q.shape):
        return None
    if bhld:  # [..., L, D]
        bh = math.prod(q.shape[:-2])
        return bh, q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1]
    if len(q.shape) != 4:  # [B, L, H, D]
        return None
    b, lq, h, d = q.shape
    return b * h, lq, k.shape[1], d, v.shape[-1]


def _attention(bhld: bool, backward: bool, first: int):
    def fn(ts):
        if len(ts) < first + 3 or any(t is None for t in ts[first : first + 3]):
            return None
        q, k, v = ts[first], ts[first + 1], ts[first + 2]
        dims = _attn_dims(q, k, v, bhld)
        if dims is None:
            return None
        bh, lq, lk, d, dv = dims
        fwd = 2.0 * bh * lq * lk * (d + dv)
        out_bytes = bh * lq * dv * q.size
        if backward:
            # read q, k, v, out, grad_out; write grad_q, grad_k, grad_v
            nbytes = 2 * (q.nbytes + k.nbytes + v.nbytes) + 2 * out_bytes
            return OpCost("attention", 2.5 * fwd, float(nbytes), _float_dtype([q, k, v]), False)
        nbytes = q.nbytes + k.nbytes + v.nbytes + out_bytes
        return OpCost("attention", fwd, float(nbytes), _float_dtype([q, k, v]), False)

    return fn


# --- element-wise, reductions, copies --------------------------------------------------------
def _elementwise(ts):
    tensors = [t for t in ts if t is not None]
    if not tensors:
        return None
    shape = _broadcast([t.shape for t in tensors])
    if shape is None:
        return None
    numel = math.prod(shape) if shape else 1
    nbytes = sum(t.nbytes for t in tensors) + numel * _out_size(tensors)
    return OpCost("elementwise", float(numel), float(nbytes), _float_dtype(tensors))


def _reduction(ts):
    if not ts or ts[0] is None:
        return None
    x = ts[0]
    return OpCost("reduction", float(x.numel), float(x.nbytes), _float_dtype([x]), False)


def _copy(ts):
    if len(ts) < 2 or ts[0] is None or ts[1] is None:
        return None
    dst, src = ts[0], ts[1]
    return OpCost("memory", 0.0, float(src.nbytes + dst.nbytes), _float_dtype([dst, src]) if dst.dtype in FLOAT_RANK
                  else dst.dtype)  # fmt: skip


def _fill(ts):
    if not ts or ts[0] is None:
        return None
    return OpCost("memory", 0.0, float(ts[0].nbytes), ts[0].dtype)


ELEMENTWISE_OPS = """
add add_ sub sub_ rsub mul mul_ div div_ neg neg_ exp exp_ log log_ sqrt sqrt_ rsqrt rsqrt_ pow pow_
relu relu_ gelu gelu_ silu silu_ sigmoid sigmoid_ tanh tanh_ abs abs_ sin cos clamp clamp_ clamp_min
clamp_min_ clamp_max clamp_max_ hardtanh hardtanh_ leaky_relu leaky_relu_ elu elu_ mish softplus
threshold threshold_ threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward
hardtanh_backward leaky_relu_backward where masked_fill masked_fill_ addcmul addcmul_ addcdiv addcdiv_
lerp lerp_ reciprocal reciprocal_ square erf erf_ maximum minimum eq ne lt gt le ge sign floor ceil round
bitwise_and bitwise_or bitwise_not bitwise_xor logical_and logical_or logical_not remainder fmod
""".split()

_ATTN_BHLD = ["scaled_dot_product_attention", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_attention_math"]  # fmt: skip
_ATTN_BHLD_BWD = ["_scaled_dot_product_flash_attention_backward", "_scaled_dot_product_efficient_attention_backward",
                  "_scaled_dot_product_cudnn_attention_backward",
                  "_scaled_dot_product_flash_attention_for_cpu_backward"]  # fmt: skip

OPS: dict[str, object] = {
    "aten::mm": _mm,
    "aten::addmm": _addmm,
    "aten::_addmm_activation": _addmm,
    "aten::bmm": _bmm,
    "aten::baddbmm": _baddbmm,
    "aten::matmul": _matmul,
    "aten::linear": _linear,
    "aten::_scaled_mm": _scaled_mm,
    "aten::convolution_backward": _conv_backward,
    "aten::_flash_attention_forward": _attention(False, False, 0),
    "aten::_efficient_attention_forward": _attention(False, False, 0),
    "aten::_flash_attention_backward": _attention(False, True, 1),
    "aten::_efficient_attention_backward": _attention(False, True, 1),
    "aten::sum": _reduction,
    "aten::mean": _reduction,
    "aten::copy_": _copy,
    "aten::fill_": _fill,
    "aten::zero_": _fill,
}
for _n in _ATTN_BHLD:
    OPS[f"aten::{_n}"] = _attention(True, False, 0)
for _n in _ATTN_BHLD_BWD:
    OPS[f"aten::{_n}"] = _attention(True, True, 1)
for _n in ELEMENTWISE_OPS:
    OPS[f"aten::{_n}"] = _elementwise
CONV_OPS = ["aten::convolution", "aten::_convolution", "aten::conv1d", "aten::conv2d", "aten::conv3d",
            "aten::cudnn_convolution", "aten::miopen_convolution", "aten::mkldnn_convolution",
            "aten::_convolution_mode", "aten::thnn_conv2d", "aten::_slow_conv2d_forward"]  # fmt: skip


def is_recognised(name: str) -> bool:
    return name in OPS or name in CONV_OPS


@lru_cache(maxsize=65536)
def op_cost(name: str, dims_text: str, types_text: str, concrete_text: str = "") -> OpCost | None:
    """FLOPs and bytes of one operator call from its recorded shapes (None when not countable)."""
    if not is_recognised(name):
        return None
    ts = _tensors(decode(dims_text), decode(types_text))
    if not ts:
        return None
    try:
        if name in CONV_OPS:
            return _conv(ts, decode(concrete_text) if concrete_text else None, name)
        return OPS[name](ts)  # type: ignore[operator]
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return None


def shape_signature(dims_text: str, types_text: str = "", limit: int = 120) -> str:
    """Compact text of the tensor arguments' shapes: '[16,559,1024]x[1024,1024]x[1024]'
    (0-d tensors as '[]', tensor lists as 'list[n]'; scalars and None arguments left out)."""
    dims = decode(dims_text)
    if not isinstance(dims, list):
        return ""
    types = decode(types_text) if types_text else None
    types = types if isinstance(types, list) else []
    parts = []
    for i, d in enumerate(dims):
        t = types[i] if i < len(types) else None
        if isinstance(d, list) and d and all(isinstance(x, int) for x in d):
            parts.append("[" + ",".join(str(x) for x in d) + "]")
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            parts.append(f"list[{len(d)}]")
        elif d == [] and isinstance(t, str) and input_type(t) is not None:
            parts.append("[]")
    s = "x".join(parts)
    return s if len(s) <= limit else s[: limit - 3] + "..."


__all__ = ["CONV_OPS", "OPS", "OpCost", "is_recognised", "op_cost", "shape_signature"]
