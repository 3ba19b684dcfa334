"""Fusion candidates on Ascend data: operator types classified, host-bound and MTE-bound sequences.

Numbers on a tiny hand-made kernel_details.csv are computed by hand in the comments; the real
Qwen3 PP=2 rank is checked against msprof-analyze's own "Fusible Operator Analysis" sheet
(../shared/data/ascend_advisor_outputs/advisor_all_st4_cluster.xlsx).
"""

from __future__ import annotations

import html
import re
import zipfile
from pathlib import Path

import pytest

import hermes_kb
from hermes_kb.analyzers.compute import compute as C
from hermes_kb.analyzers.compute.kernel_classes import classify_ascend_task
from hermes_kb.analyzers.timeline.steps import step_context
from conftest import SHARED

ST4 = SHARED / "ascend" / "msinsight_st_level2_4rank_qwen3_0.6b_pp2"
XLSX = SHARED / "ascend_advisor_outputs" / "advisor_all_st4_cluster.xlsx"
needs_st4 = pytest.mark.skipif(not ST4.is_dir() or not XLSX.is_file(), reason="../shared/data is absent")

HEADER = ("Device_id,Step Id,Model ID,Task ID,Stream ID,Name,Type,OP State,Accelerator Core,Start Time(us),"
          "Duration(us),Wait Time(us),Input Shapes,Output Shapes,aicore_time(us),aic_mte2_time(us),"
          "aic_fixpipe_time(us),aiv_time(us),aiv_mte2_time(us),aiv_mte3_time(us)")  # fmt: skip


def _compute_facts(root: Path) -> dict:
    trace = hermes_kb.load(root)[0]
    ctx, _ = step_context(trace)
    out: dict = {}
    for f in C.per_rank(ctx):
        out.setdefault(f.kind, []).append(f)
    return out


@pytest.mark.parametrize("op_type,name,task_type,cls", [
    ("Add", "aclnnAdd_AddAiCore_Add", "AI_VECTOR_CORE", "elementwise"),
    ("RealDiv", "aclnnDivs_RealDivAiCore_RealDiv", "AI_VECTOR_CORE", "elementwise"),
    ("Cast", "aclnnCast_CastAiCore_Cast", "AI_VECTOR_CORE", "elementwise"),
    ("SwiGluGrad", "SwiGluGrad", "AI_VECTOR_CORE", "elementwise"),
    ("ApplyAdamWV2", "aclnnApplyAdamWV2_ApplyAdamWV2_ApplyAdamWV2", "AI_VECTOR_CORE", "elementwise"),
    ("SoftmaxV2", "aclnnSoftmax_SoftmaxV2AiCore_SoftmaxV2", "AI_VECTOR_CORE", "reduction"),
    ("ReduceSum", "aclnnReduceSum_ReduceSumOpAiCore_ReduceSum", "AI_VECTOR_CORE", "reduction"),
    ("LpNormV2", "aclnnLinalgVectorNorm_LpNormV2_LpNormV2", "AI_VECTOR_CORE", "reduction"),
    ("RmsNormGrad", "RmsNormGrad", "MIX_AIV", "norm"),
    ("LayerNormV3", "LayerNorm90", "AI_VECTOR_CORE", "norm"),
    ("TransData", "trans_TransData_0", "AI_VECTOR_CORE", "memory"),
    ("Slice", "aclnnInplaceCopy_SliceAiCore_Slice", "AI_VECTOR_CORE", "memory"),
    ("MatMulV3", "aclnnMm_MatMulV3Common_MatMulV3", "AI_CORE", "gemm"),
    ("Conv2DBackpropFilter", "Conv2DBackpropFilter6", "AI_CORE", "conv"),
    ("FlashAttentionScoreGrad", "aclnnFlashAttentionScoreGrad_x_FlashAttentionScoreGrad", "MIX_AIC", "attention"),
    ("hcom_batchSendRecv_", "hcom_batchSendRecv__128_3_1", "COMMUNICATION", "communication"),
    ("", "hcom_allReduce__586_0_1", "HCCL", "communication"),
    # Level0 exports record no type: it is read from the task name
    ("", "aclnnAdd_AddAiCore_Add", "AI_CORE", "elementwise"),
    ("", "trans_TransData_3", "AI_CORE", "memory"),
    ("", "Conv2D1", "AI_CORE", "conv"),
    ("", "ReduceSum7", "AI_CORE", "reduction"),
    ("NonZero", "aclnnNonzeroV2_NonzeroAiCore_NonZero", "AI_VECTOR_CORE", "other"),
])  # fmt: skip
def test_ascend_operator_types_are_classified(op_type, name, task_type, cls):
    assert classify_ascend_task(op_type, name, task_type) == cls


def test_fusion_on_a_tiny_ascend_export_by_hand(tmp_path):
    rows = []
    for j in range(3):  # three layers: MatMul, then Add -> Cast -> Mul with idle gaps between them
        b = 1000 + 1000 * j
        rows += [
            # name, type, core, ts, dur, aicore, aic_mte2, aic_fixpipe, aiv, aiv_mte2, aiv_mte3
            ("MatMul", "MatMulV3", "AI_CORE", b, 100, 100, 10, 10, 0, 0, 0),
            ("aclnnAdd_AddAiCore_Add", "Add", "AI_VECTOR_CORE", b + 100, 10, 0, 0, 0, 10, 6, 4),
            ("aclnnCast_CastAiCore_Cast", "Cast", "AI_VECTOR_CORE", b + 140, 10, 0, 0, 0, 10, 5, 4),
            ("aclnnMul_MulAiCore_Mul", "Mul", "AI_VECTOR_CORE", b + 180, 10, 0, 0, 0, 10, 5, 5),
        ]
    lines = [HEADER] + [f"0,1,1,{i},2,{n},{t},dynamic,{c},{ts}\t,{d},0,\"4,8\",\"4,8\",{a},{am},{af},{v},{vm2},{vm3}"
                        for i, (n, t, c, ts, d, a, am, af, v, vm2, vm3) in enumerate(rows)]  # fmt: skip
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "kernel_details.csv").write_text("\n".join(lines) + "\n")
    facts = _compute_facts(tmp_path / "rank0_ascend_pt")

    shares = {f.kernel_class: f for f in facts["kernel_class_share"]}
    assert set(shares) == {"gemm", "elementwise"}
    assert (shares["elementwise"].count, shares["elementwise"].time_us) == (9, 90.0)
    (f,) = facts["fusion_candidates"]
    # candidates: 9 vector kernels of 10 µs; all kernels: 3 x (100 + 30) = 390 µs
    assert (f.candidate_kernels_count, f.candidate_time_us) == (9, 90.0)
    assert f.candidate_time_ratio == pytest.approx(90 / 390)
    # the 3-gram Add -> Cast -> Mul is the longest; the 2-grams inside it are the same run
    assert f.sequences_count == 1 and len(f.sequences) == 1
    (s,) = f.sequences
    assert s.kernels == ["elementwise:aclnnAdd_AddAiCore_Add", "elementwise:aclnnCast_CastAiCore_Cast",
                         "elementwise:aclnnMul_MulAiCore_Mul"]  # fmt: skip
    assert (s.occurrences_count, s.total_time_us) == (3, 90.0)
    # gaps: Add ends at b+110, Cast starts at b+140 (30); Cast ends at b+150, Mul at b+180 (30):
    # 60 per occurrence, 180 in all; exec share 90 / (90 + 180) = 1/3 < 0.4 -> host bound
    assert s.gap_us == pytest.approx(180.0)
    assert s.exec_ratio == pytest.approx(1 / 3) and s.host_bound
    # MTE per occurrence: Add 6+4, Cast 5+4, Mul 5+5 = 29 µs of 30 µs vector time -> 0.967 > 0.8
    assert s.mte_us == pytest.approx(87.0) and s.mte_ratio == pytest.approx(87 / 90) and s.mte_bound
    assert (f.sequences_time_us, f.sequences_gap_us) == (90.0, pytest.approx(180.0))
    assert (f.host_bound_count, f.mte_bound_count) == (1, 1)


def test_fusion_without_pipe_metrics_has_no_mte_share(tmp_path):
    header = "Step Id,Stream ID,Name,Type,Accelerator Core,Start Time(us),Duration(us)"
    rows = []
    for j in range(3):
        b = 1000 * j
        rows += [f"1,2,Add,Add,AI_VECTOR_CORE,{b},10", f"1,2,Mul,Mul,AI_VECTOR_CORE,{b + 10},10",
                 f"1,2,MatMul,MatMulV2,AI_CORE,{b + 20},50"]  # fmt: skip
    out = tmp_path / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    out.mkdir(parents=True)
    (out / "kernel_details.csv").write_text("\n".join([header] + rows) + "\n")
    (f,) = _compute_facts(tmp_path / "rank0_ascend_pt")["fusion_candidates"]
    (s,) = f.sequences
    assert (s.occurrences_count, s.total_time_us, s.gap_us, s.exec_ratio) == (3, 60.0, 0.0, 1.0)
    assert s.mte_us is None and s.mte_ratio is None and s.mte_bound is None and not s.host_bound
    assert (f.host_bound_count, f.mte_bound_count) == (0, 0)


def _xlsx_sheet(path: Path, sheet: int) -> list[dict[str, str]]:
    """Rows of one sheet of an xlsx (a zip of XML), cells by column letter."""
    z = zipfile.ZipFile(path)
    strings = [html.unescape(re.sub(r"<[^>]+>", "", si))
               for si in re.findall(r"<si>(.*?)</si>", z.read("xl/sharedStrings.xml").decode(), re.S)]  # fmt: skip
    rows = []
    for r in re.findall(r"<row [^>]*>(.*?)</row>", z.read(f"xl/worksheets/sheet{sheet}.xml").decode(), re.S):
        row = {}
        for col, attrs, body in re.findall(r'<c r="([A-Z]+)\d+"([^>]*?)(?:/>|>(.*?)</c>)', r, re.S):
            v = re.search(r"<v>(.*?)</v>", body or "")
            if v:
                row[col] = strings[int(v.group(1))] if 't="s"' in attrs else v.group(1)
        rows.append(row)
    return rows


@needs_st4
def test_fusion_on_qwen_pp2_against_msprof_sheet():
    import pandas as pd

    facts = _compute_facts(ST4 / "rank_0_ascend_pt")
    shares = {f.kernel_class: f for f in facts["kernel_class_share"]}
    # Ascend operator types are recognised: before, 56% of the device time was 'other'
    assert shares["other"].share_of_device_time_ratio < 0.001
    assert shares["elementwise"].count == 1406 and shares["gemm"].count == 336
    (f,) = facts["fusion_candidates"]
    assert (f.sequences_count, f.host_bound_count, f.mte_bound_count) == (13, 6, 5)
    assert f.sequences_time_us == pytest.approx(46313.96, abs=0.1)
    assert f.sequences_gap_us == pytest.approx(45301.75, abs=0.1)
    top = f.sequences[0]
    assert [t.split(":")[0] for t in top.kernels] == ["elementwise", "norm", "elementwise", "elementwise"]
    assert (top.occurrences_count, round(top.total_time_us, 2)) == (84, 14944.94)

    # msprof-analyze's sheet: 68 distinct sequences (the terminal's "75" counts the 7 that are both
    # MTE and host bound twice), 2943.36 ms "end-to-end", 1874.90 ms NPU time, on a 810 ms step:
    # shifted windows of the same run are counted again, so the sum exceeds the step 3.6 times
    sheet = _xlsx_sheet(XLSX, 6)[2:]
    assert len(sheet) == 68
    assert sum(float(r["C"]) for r in sheet) / 1e3 == pytest.approx(2943.36, abs=0.01)
    assert sum(float(r["D"]) for r in sheet) / 1e3 == pytest.approx(1874.90, abs=0.01)
    assert sum(int(r["G"]) + int(r["H"]) for r in sheet) == 75
    # hermes' sequences (as operator types) against msprof's: the RMSNorm-backward chains lie inside
    # msprof sequences; the optimizer's Sub -> ApplyAdamWV2 run is hermes' only: msprof keys a
    # sequence on names *and shapes*, and every parameter has its own shape, so no shape-exact
    # sequence of the optimizer repeats more than 5 times
    kd = pd.read_csv(ST4 / "rank_0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv")
    name_type = dict(zip(kd["Name"].astype(str), kd["Type"].astype(str)))
    msprof_seqs = [kd["Type"].iloc[int(r["A"]) : int(r["B"]) + 1].astype(str).tolist() for r in sheet]
    inside = {}
    for s in f.sequences:
        types = tuple(name_type[t.split(":", 1)[1]] for t in s.kernels)
        inside[types] = any(any(tuple(m[i : i + len(types)]) == types for i in range(len(m) - len(types) + 1))
                            for m in msprof_seqs)  # fmt: skip
    assert inside == {
        ("Add", "RmsNormGrad", "Cast", "Add"): True,
        ("Sub", "ApplyAdamWV2", "Sub", "ApplyAdamWV2"): False,
        ("RmsNormGrad", "Cast", "Add", "Add"): True,
        ("Add", "SwiGluGrad"): True,
        ("RmsNormGrad", "Cast", "Add", "RmsNormGrad"): True,
    }
