"""Ascend device tasks (the ``kernels`` analyzer, from kernel_details' shapes and dtypes): MatMul
inner axes and FlashAttention head dimension / sequence length against msprof-analyze's AI Core
rules, Cube operators fed FP32, and Vector operators over full language-model logits."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.attention import NpuFlashAttentionAlignment
from hermes_kb.facts.compute.layouts import NpuCubeAlignment
from hermes_kb.facts.npu import NpuFp32Cube, NpuVocabVectorOps

from ..context import RankContext
from .activities import Acts, is_ascend, ratio, register_selected
from .kernel_classes import CLS_INDEX
from .layers import VOCAB_MIN


_COMM = CLS_INDEX["communication"]

# --- Ascend: MatMul inner axes (msprof-analyze's AI Core performance check) ---------------------------
CUBE_INNER_AXIS = 256  # msprof-analyze AICorePerformanceChecker.INNER_AXIS_256
CUBE_GROUP_MB = 100.0  # msprof-analyze AICorePerformanceChecker.CUBE_OPERATOR_MEMORY_SIZE_MB


def _dims(text: str) -> list[list[int]]:
    out = []
    for part in str(text).strip().strip('"').split(";"):
        try:
            out.append([int(x) for x in part.split(",") if x.strip() != ""])
        except ValueError:
            out.append([])
    return out


def cube_inner_axes_aligned(input_shapes: str) -> bool | None:
    """msprof-analyze's rule: ND inputs need the last axis of both operands a multiple of 256, NZ
    (4-D fractal) inputs the product of their axes 1 and 2; None when the shapes do not fit."""
    d = _dims(input_shapes)
    if len(d) < 2 or not d[0] or not d[1]:
        return None
    if len(d[0]) == 4 and len(d[1]) == 4:
        return (d[0][1] * d[0][2]) % CUBE_INNER_AXIS == 0 and (d[1][1] * d[1][2]) % CUBE_INNER_AXIS == 0
    if len(d[0]) == 2:
        return d[0][-1] % CUBE_INNER_AXIS == 0 and d[1][-1] % CUBE_INNER_AXIS == 0
    return None


def _group_mb(input_shapes: str, output_shapes: str) -> float:
    """msprof-analyze's memory_size: elements of the inputs (a 1-D bias counted twice) and the output,
    times 2 bytes, in MB."""
    n = 0
    for d in _dims(input_shapes):
        if len(d) == 1:
            n += d[0] * 2
        elif d:
            n += int(np.prod(d))
    for d in _dims(output_shapes)[:1]:
        n += int(np.prod(d)) if d else 0
    return n * 2 / 1024 / 1024


def npu_cube(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not is_ascend(ctx, kf) or not {"input_shapes", "output_shapes"} <= set(kf.columns):
        return []
    rows = k.row[k.kernel] if len(k.kernel) == len(k) else k.row
    op = kf["op_type"].astype(str).to_numpy()[rows]
    tt = (kf["task_type"] if "task_type" in kf.columns else kf["core_type"]).astype(str).to_numpy()[rows]
    cube = np.array(["matmul" in o.lower() for o in op], dtype=bool) & (tt == "AI_CORE")
    if not cube.any():
        return []
    ins = kf["input_shapes"].astype(str).to_numpy()[rows]
    outs = kf["output_shapes"].astype(str).to_numpy()[rows]
    names = np.array([str(k.names[i]) for i in k.name_id], dtype=object)
    df = pd.DataFrame({"name": names[cube], "ins": ins[cube], "outs": outs[cube], "dur": k.dur[cube]})
    df["mb"] = [_group_mb(a, b) for a, b in zip(df["ins"], df["outs"])]
    g = df.groupby(["name", "ins", "outs"], sort=False).agg(mb=("mb", "sum"), dur=("dur", "sum")).reset_index()
    g = g[g["mb"] >= CUBE_GROUP_MB]
    if not len(g):
        return []
    g["aligned"] = [cube_inner_axes_aligned(x) for x in g["ins"]]
    bad = g[g["aligned"] == False]  # noqa: E712  (None: shapes that do not fit the rule)
    cube_t = float(k.dur[cube].sum())
    total = float(act.dur.sum())
    mis_t = float(bad["dur"].sum())
    if len(bad):
        keys = set(zip(bad["name"], bad["ins"]))
        m = np.zeros(len(k), dtype=bool)
        idx = np.flatnonzero(cube)
        m[idx] = [(a, b) in keys for a, b in zip(df["name"], df["ins"])]
        register_selected(ctx, "npu_cube_misaligned", "MatMul tasks whose inner axes are not multiples of 256", k, m)
    top = bad.sort_values("dur", ascending=False).iloc[0] if len(bad) else None
    return [NpuCubeAlignment(
        rank=ctx.rank, cube_time_us=cube_t, checked_groups_count=len(g), misaligned_groups_count=len(bad),
        misaligned_time_us=mis_t, share_of_device_time_ratio=ratio(mis_t / total) if total else 0.0,
        share_of_cube_time_ratio=ratio(mis_t / cube_t) if cube_t else 0.0, min_group_mb=CUBE_GROUP_MB,
        example_operator=str(top["name"]) if top is not None else "",
        example_shapes=str(top["ins"]).strip('"') if top is not None else "",
        evidence=Evidence(time_ranges_us=[ctx.span], events=[str(top["name"])] if top is not None else [],
                          counts={"checked_groups": len(g), "misaligned_groups": len(bad)},
                          note="msprof-analyze AI Core performance rule: MatMul groups of >= 100 MB, inner axes "
                               "multiples of 256 (ND: last axis of both inputs; NZ: axes 1 x 2)"),
    )]  # fmt: skip


FA_AXIS = 128  # msprof-analyze AICorePerformanceChecker.INNER_AXIS_128


def fa_dims(name: str, input_shapes: str, output_shapes: str) -> tuple[int | None, int | None]:
    """(head dimension, sequence length) of a FlashAttentionScore task from its shapes: q is the first
    input ([B,N,S,D] / [B,S,N,D]: D last; [B,S,H] / [S,B,H]: H / N; varlen [T,N,D]: D last, no
    sequence length); N and S from the softmax statistics [B,N,S,8] (the first output)."""
    q = (_dims(input_shapes) or [[]])[0]
    stats = (_dims(output_shapes) or [[]])[0]
    if "varlen" in name.lower():
        return (q[2] if len(q) == 3 else None), None
    seq = stats[2] if len(stats) == 4 else None
    if len(q) == 4:
        return q[3], seq
    if len(q) == 3 and len(stats) == 4 and stats[1] > 0 and q[2] % stats[1] == 0:
        return q[2] // stats[1], seq
    return None, seq


def npu_fa(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not is_ascend(ctx, kf) or not {"input_shapes", "output_shapes"} <= set(kf.columns):
        return []
    rows = k.row
    op = kf["op_type"].astype(str).to_numpy()[rows]
    fwd = op == "FlashAttentionScore"
    fa = fwd | (op == "FlashAttentionScoreGrad")
    if not fwd.any():
        return []
    ins = kf["input_shapes"].astype(str).to_numpy()[rows]
    outs = kf["output_shapes"].astype(str).to_numpy()[rows]
    names = [str(k.names[i]) for i in k.name_id]
    verdict: dict[str, tuple[int | None, int | None]] = {}
    for i in np.flatnonzero(fwd):
        q = ins[i].strip('"').split(";")[0]
        if q not in verdict:
            verdict[q] = fa_dims(names[i], ins[i], outs[i])
    bad = np.zeros(len(k), dtype=bool)
    for i in np.flatnonzero(fa):
        d, sq = verdict.get(ins[i].strip('"').split(";")[0], (None, None))
        bad[i] = (d is not None and d % FA_AXIS != 0) or (sq is not None and sq % FA_AXIS != 0)
    fa_t = float(k.dur[fa].sum())
    mis_t = float(k.dur[bad].sum())
    total = float(act.dur.sum())
    hd = sq = None
    ex = ""
    if bad.any():
        register_selected(ctx, "npu_fa_misaligned", "FlashAttention tasks with head dim or sequence length off 128", k, bad)
        q_of = [ins[i].strip('"').split(";")[0] for i in np.flatnonzero(bad)]
        qs = pd.Series(k.dur[bad]).groupby(pd.Series(q_of)).sum()
        q = str(qs.idxmax())
        hd, sq = verdict.get(q, (None, None))
        ex = next(ins[i].strip('"') for i in np.flatnonzero(bad) if ins[i].strip('"').split(";")[0] == q)
    return [NpuFlashAttentionAlignment(
        rank=ctx.rank, fa_time_us=fa_t, misaligned_time_us=mis_t,
        share_of_device_time_ratio=ratio(mis_t / total) if total else 0.0,
        share_of_fa_time_ratio=ratio(mis_t / fa_t) if fa_t else 0.0, head_dim=hd, seq_len=sq, example_shapes=ex,
        evidence=Evidence(time_ranges_us=[ctx.span], counts={"fa_tasks": int(fa.sum()), "misaligned": int(bad.sum())},
                          note="head dimension and sequence length from q and the softmax statistics' shapes; the "
                               "gradient tasks follow the forward call with the same q shape"),
    )]  # fmt: skip


# --- Ascend: Cube operators fed FP32 --------------------------------------------------------------
_NPU_CUBE_RE = re.compile(r"matmul|batchmatmul|conv|gemm|flashattention|grouped_matmul", re.I)
_NPU_FP32 = frozenset({"FLOAT", "FLOAT32", "DT_FLOAT", "DT_FLOAT32", "FP32"})
_NPU_FLOAT16 = frozenset({"FLOAT16", "DT_FLOAT16", "BF16", "DT_BF16", "BFLOAT16", "DT_BFLOAT16", "HALF", "FP16",
                          "HIFLOAT32", "DT_HIFLOAT32", "HF32"})  # fmt: skip


def npu_all_fp32(dtypes: str) -> bool:
    """True when the task's floating inputs are all FP32 (and there is at least one)."""
    parts = [p.strip().upper() for p in str(dtypes).replace('"', "").split(";") if p.strip()]
    fl = [p for p in parts if p in _NPU_FP32 or p in _NPU_FLOAT16]
    return bool(fl) and all(p in _NPU_FP32 for p in fl)


def npu_fp32_cube(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not is_ascend(ctx, kf) or "input_dtypes" not in kf.columns:
        return []
    rows = k.row
    op = kf["op_type"].astype(str).to_numpy()[rows]
    tt = (kf["task_type"] if "task_type" in kf.columns else kf["core_type"]).astype(str).str.upper().to_numpy()[rows]
    comp = (k.cls != _COMM) & np.array(["HCCL" not in t and "COMMUNICATION" not in t for t in tt], dtype=bool)
    cube = comp & np.array([bool(_NPU_CUBE_RE.search(o)) for o in op], dtype=bool) & \
        np.array(["AI_CPU" not in t and "VECTOR" not in t for t in tt], dtype=bool)  # fmt: skip
    if not cube.any():
        return []
    dts = kf["input_dtypes"].astype(str).to_numpy()[rows]
    fp32 = cube & np.array([npu_all_fp32(d) for d in dts], dtype=bool)
    if not fp32.any():
        return []
    register_selected(ctx, "npu_fp32_cube", "Cube (MatMul / Conv) tasks computing in FP32", k, fp32)
    is_conv = np.array(["conv" in o.lower() for o in op], dtype=bool)
    hf = None
    if "hf32_eligible" in kf.columns:
        col = kf["hf32_eligible"].astype(str).str.upper().to_numpy()[rows]
        if np.isin(col, ["YES", "NO"]).any():
            hf = float(k.dur[fp32 & (col == "YES")].sum())
    t = float(k.dur[fp32].sum())
    ct = float(k.dur[cube].sum())
    dc = float(k.dur[comp].sum())
    types = pd.Series(k.dur[fp32]).groupby(op[fp32]).sum().sort_values(ascending=False)
    return [NpuFp32Cube(
        rank=ctx.rank, device_compute_us=dc, cube_us=ct, fp32_cube_count=int(fp32.sum()), fp32_cube_us=t,
        fp32_cube_ratio=ratio(t / ct) if ct else 0.0, fp32_share_of_compute_ratio=ratio(t / dc) if dc else 0.0,
        matmul_fp32_us=float(k.dur[fp32 & ~is_conv].sum()), conv_fp32_us=float(k.dur[fp32 & is_conv].sum()),
        hf32_eligible_us=hf, not_hf32_eligible_us=max(0.0, t - (hf or 0.0)),
        op_types=[str(x) for x in types.index[:8]],
        evidence=Evidence(time_ranges_us=[ctx.span], events=[str(x) for x in types.index[:3]],
                          counts={"fp32_cube_tasks": int(fp32.sum())},
                          note="Cube tasks: op type MatMul / BatchMatMul / Conv / GEMM / FlashAttention not on the AI "
                               "CPU or the Vector core; FP32 = every floating input FLOAT (Input Data Types)"),
    )]  # fmt: skip


# --- Ascend: vector operators over full logits ---------------------------------------------------------
def first_input_dims(shapes: str) -> list[int] | None:
    """Axes of the first input in a kernel_details 'Input Shapes' cell ('"4096,1,151936;4096,1,1"')."""
    first = str(shapes).replace('"', "").split(";")[0].strip()
    try:
        dims = [int(x) for x in first.split(",") if x.strip()]
    except ValueError:
        return None
    return dims or None


def npu_vocab_vector(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    kf = ctx.trace.kernels
    if not is_ascend(ctx, kf) or "input_shapes" not in kf.columns:
        return []
    rows = k.row
    tt = (kf["task_type"] if "task_type" in kf.columns else kf["core_type"]).astype(str).str.upper().to_numpy()[rows]
    op = kf["op_type"].astype(str).to_numpy()[rows]
    comp = (k.cls != _COMM) & np.array(["HCCL" not in t and "COMMUNICATION" not in t for t in tt], dtype=bool)
    vec = comp & np.array([("VECTOR" in t) or (t == "MIX_AIV") for t in tt], dtype=bool) & \
        np.array([not _NPU_CUBE_RE.search(o) for o in op], dtype=bool)  # fmt: skip
    if not vec.any():
        return []
    shapes = kf["input_shapes"].astype(str).to_numpy()[rows]
    dims = [first_input_dims(x) if v else None for x, v in zip(shapes, vec)]
    m = np.array([d is not None and len(d) >= 2 and d[-1] >= VOCAB_MIN for d in dims], dtype=bool) & vec
    if not m.any():
        return []
    register_selected(ctx, "npu_vocab_vector_ops", "Vector operators over full language-model logits", k, m)
    best = max((dims[i] for i in np.flatnonzero(m)), key=lambda d: (int(np.prod(d[:-1])) * d[-1], d[-1]))
    nrows, vocab = int(np.prod(best[:-1])), int(best[-1])
    fp32 = np.zeros(len(k), dtype=bool)
    if "input_dtypes" in kf.columns:
        dts = kf["input_dtypes"].astype(str).to_numpy()[rows]
        fp32 = m & np.array([npu_all_fp32(d) if mm else False for d, mm in zip(dts, m)], dtype=bool)
    t = float(k.dur[m].sum())
    dc = float(k.dur[comp].sum())
    types = pd.Series(k.dur[m]).groupby(op[m]).sum().sort_values(ascending=False)
    return [NpuVocabVectorOps(
        rank=ctx.rank, device_compute_us=dc, tasks_count=int(m.sum()), time_us=t,
        share_of_compute_ratio=ratio(t / dc) if dc else 0.0, fp32_time_us=float(k.dur[fp32].sum()),
        vocab_size=vocab, rows=nrows, logits_fp32_bytes=float(nrows) * vocab * 4.0,
        op_types=[str(x) for x in types.index[:8]],
        evidence=Evidence(time_ranges_us=[ctx.span], events=[str(x) for x in types.index[:4]],
                          counts={"tasks": int(m.sum())},
                          note=f"AI Vector / MIX_AIV tasks (not Cube op types) whose first input's last axis is at "
                               f"least {VOCAB_MIN} (a language-model vocabulary)"),
    )]  # fmt: skip
