"""Work that fusion removes: repeated sequences of element-wise / reduction / normalisation kernels
on a stream (the ``compute`` analyzer; on Ascend with the pipe metrics msprof-analyze uses),
normalisations written out as separate kernels, and element-wise adds and activations right after
a GEMM (the ``kernels`` analyzer)."""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from hermes_kb.facts.base import Evidence, Fact
from hermes_kb.facts.compute.fusion import DecomposedNorm, FusionCandidates, FusionSequence, GemmEpilogue

from ..context import RankContext
from .activities import Acts, is_ascend, ratio, register_selected, top_label
from .kernel_classes import CLASSES, CLS_INDEX
from .kernel_names import short_kernel_name, tensor_core_kind
from .layouts import copy_kind_of_name


# --- parameters (docs/analysis/compute.md says where each comes from) -----------------------
TOP_FUSION = 5  # fusion-candidate sequences per rank
FUSION_MIN_COUNT = 3  # a sequence must repeat at least this often
FUSION_NGRAMS = (2, 3, 4)
FUSION_CLASSES = ("elementwise", "reduction", "norm")
FUSION_MAX_COUNTED = 100  # distinct sequences counted per rank (the fact lists TOP_FUSION of them)
FUSION_HOST_BOUND = 0.4  # exec / (exec + gaps) below this: host bound (msprof-analyze host_threshold)
FUSION_MTE_BOUND = 0.8  # MTE time / core time above this: MTE bound (msprof-analyze mte_threshold)

NORM_BACK = 2  # kernels before the reduction that belong to a written-out normalisation (cast, pow/sub)
NORM_FWD = 3  # kernels after the [r]sqrt that do (normalise, cast back, weight)

_COMM = CLS_INDEX["communication"]
_MEM = CLS_INDEX["memory"]


def _pipe_times(ctx: RankContext, k: Acts) -> tuple[np.ndarray, np.ndarray] | None:
    """Ascend pipe metrics per kernel of k: (MTE time, AI Core + AI Vector busy time), as
    msprof-analyze's fusible-operator check counts them; None without the columns."""
    kf = ctx.trace.kernels
    mte_cols = ("aic_mte2_time_us", "aiv_mte2_time_us", "aic_fixpipe_time_us", "aiv_mte3_time_us")
    core_cols = ("aicore_time_us", "aiv_time_us")
    if not any(c in kf.columns for c in mte_cols) or not any(c in kf.columns for c in core_cols):
        return None
    rows = k.row[k.kernel]
    if len(rows) != len(k):
        return None

    def col(c: str) -> np.ndarray:
        if c not in kf.columns:
            return np.zeros(len(rows))
        v = kf[c].to_numpy(dtype=float)[rows]
        return np.where(np.isfinite(v), v, 0.0)

    mte = np.maximum(col(mte_cols[0]), col(mte_cols[1])) + np.maximum(col(mte_cols[2]), col(mte_cols[3]))
    return mte, col(core_cols[0]) + col(core_cols[1])


def fusion_candidates(ctx: RankContext, k: Acts) -> list[Fact]:
    """The repeated sequences of fusable kernels: the longest TOP_FUSION, and how many there are."""
    if len(k) < 2:
        return []
    order = np.lexsort((k.ts, k.stream, k.device))
    k = k.take(order)
    cand = np.isin(k.cls, [CLS_INDEX[c] for c in FUSION_CLASSES])
    if cand.sum() < 2:
        return []
    tok, lab_u = _tokens(k, cand)
    V = len(lab_u) + 1
    cands, found = _ngrams(k, tok, V)
    if not cands:
        return []
    chosen = _choose(cands, V)
    gap_after = _gaps(k)
    measured, cov, cov_pairs = _measure(ctx, k, chosen, found, gap_after)
    return [_candidates_fact(ctx, k, cand, lab_u, chosen, measured, cov, float(gap_after[cov_pairs].sum()))]


def _tokens(k: Acts, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per kernel, its token (class + short name, per distinct (kernel name, class)) or -1 when it
    is no candidate; and the token labels."""
    pair = k.name_id * len(CLASSES) + k.cls
    uid, inv = np.unique(pair, return_inverse=True)
    labels = np.array([f"{CLASSES[p % len(CLASSES)]}:{short_kernel_name(str(k.names[p // len(CLASSES)]))}"
                       for p in uid], dtype=object)  # fmt: skip
    lab_u, lab_inv = np.unique(labels, return_inverse=True)
    tok = np.where(cand, lab_inv[inv.reshape(-1)], -1).astype(np.int64)
    return tok, lab_u


def _ngrams(k: Acts, tok: np.ndarray, V: int) -> tuple[list[tuple[float, int, int, int]], dict]:
    """The n-grams of candidate kernels on one stream that occur at least FUSION_MIN_COUNT times:
    (total time, occurrences, n, key) each, and per n (keys, start, key index) of the occurrences."""
    cands: list[tuple[float, int, int, int]] = []  # (total time, count, n, key)
    found: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # n -> (keys, start, key index)
    nk = len(tok)
    for n in FUSION_NGRAMS:
        if nk < n or V**n > 2**62:
            continue
        L = nk - n + 1
        ok = np.ones(L, dtype=bool)
        key = np.zeros(L, dtype=np.int64)
        for j in range(n):
            tj = tok[j : j + L]
            ok &= tj >= 0
            if j:
                ok &= (k.stream[j : j + L] == k.stream[:L]) & (k.device[j : j + L] == k.device[:L])
            key = key * V + np.maximum(tj, 0)
        if not ok.any():
            continue
        starts = np.flatnonzero(ok)
        keys, kinv, counts = np.unique(key[ok], return_inverse=True, return_counts=True)
        kinv = kinv.reshape(-1)
        pre = counts[kinv] >= FUSION_MIN_COUNT  # overlapping count is an upper bound of the real one
        if not pre.any():
            continue
        # occurrences of a sequence may overlap (a run of 10 'add' kernels holds seven 4-grams): count
        # the kernels covered by a sequence's occurrences once, occurrences = covered kernels // n
        sv, kid = starts[pre], kinv[pre]
        found[n] = (keys, sv, kid)
        pairs = np.unique((kid[:, None] * nk + sv[:, None] + np.arange(n)[None, :]).reshape(-1))
        pk, pp = pairs // nk, pairs % nk
        covered = np.bincount(pk, minlength=len(keys))
        times = np.bincount(pk, weights=k.dur[pp], minlength=len(keys))
        occ = covered // n
        good = np.flatnonzero(occ >= FUSION_MIN_COUNT)
        cands.extend((float(times[i]), int(occ[i]), n, int(keys[i])) for i in good)
    return cands, found


def _choose(cands: list[tuple[float, int, int, int]], V: int) -> list[tuple[float, int, tuple[int, ...], int, int]]:
    """The candidates by time, each run of kernels once (at most FUSION_MAX_COUNTED)."""
    cands.sort(key=lambda x: (-x[0], -x[2]))
    chosen: list[tuple[float, int, tuple[int, ...], int, int]] = []  # (time, count, tokens, n, key)
    for tt, c, n, kk in cands:
        seq = []
        key_v = kk
        for _ in range(n):
            seq.append(key_v % V)
            key_v //= V
        seq_t = tuple(reversed(seq))
        if any(_same_run(s, cs, seq_t, c) for _, cs, s, _, _ in chosen):
            continue
        chosen.append((tt, c, seq_t, n, kk))
        if len(chosen) >= FUSION_MAX_COUNTED:
            break
    return chosen


def _gaps(k: Acts) -> np.ndarray:
    """Idle time between kernel i and kernel i+1 on the same stream (0 for the last of a stream)."""
    nk = len(k)
    gap_after = np.zeros(nk)
    if nk > 1:
        same = (k.stream[1:] == k.stream[:-1]) & (k.device[1:] == k.device[:-1])
        gap_after[:-1] = np.where(same, np.maximum(0.0, k.ts[1:] - k.end[:-1]), 0.0)
    return gap_after


def _measure(ctx: RankContext, k: Acts, chosen: list, found: dict,
             gap_after: np.ndarray) -> tuple[list[tuple], np.ndarray, np.ndarray]:  # fmt: skip
    """Per chosen sequence (gaps, exec ratio, MTE time, MTE ratio); the kernels and the kernel
    pairs all of them cover, each once."""
    pipes = _pipe_times(ctx, k)
    all_kernels: list[np.ndarray] = []
    all_pairs: list[np.ndarray] = []
    measured = []
    for tt, c, seq_t, n, kk in chosen:
        keys, sv, kid = found[n]
        starts = sv[kid == np.searchsorted(keys, kk)]
        kern = np.unique((starts[:, None] + np.arange(n)[None, :]).reshape(-1))
        inner = np.unique((starts[:, None] + np.arange(n - 1)[None, :]).reshape(-1))  # kernel i of pair (i, i+1)
        all_kernels.append(kern)
        all_pairs.append(inner)
        gap = float(gap_after[inner].sum())
        exec_ratio = tt / (tt + gap) if tt + gap > 0 else 1.0
        mte = core = None
        if pipes is not None:
            mte, core = float(pipes[0][kern].sum()), float(pipes[1][kern].sum())
        mte_ratio = mte / core if (mte is not None and core) else None
        measured.append((gap, exec_ratio, mte if mte_ratio is not None else None, mte_ratio))
    cov = np.unique(np.concatenate(all_kernels))
    cov_pairs = np.unique(np.concatenate(all_pairs)) if all_pairs else np.zeros(0, dtype=np.int64)
    return measured, cov, cov_pairs


def _candidates_fact(ctx: RankContext, k: Acts, cand: np.ndarray, lab_u: np.ndarray, chosen: list,
                     measured: list[tuple], cov: np.ndarray, cov_gap: float) -> FusionCandidates:  # fmt: skip
    host_flags = [m[1] < FUSION_HOST_BOUND for m in measured]
    mte_flags = [m[3] is not None and m[3] > FUSION_MTE_BOUND for m in measured]
    total = float(k.dur.sum())
    cand_time = float(k.dur[cand].sum())
    seqs = [FusionSequence(kernels=[str(lab_u[i]) for i in s], length_count=len(s), occurrences_count=c,
                           total_time_us=tt, mean_time_us=tt / c,
                           share_of_kernel_time_ratio=ratio(tt / total) if total else 0.0,
                           gap_us=gap, exec_ratio=ratio(er), host_bound=hb,
                           mte_us=mte, mte_ratio=mr, mte_bound=(mb if mr is not None else None))
            for (tt, c, s, _, _), (gap, er, mte, mr), hb, mb in zip(chosen, measured, host_flags, mte_flags)][:TOP_FUSION]  # fmt: skip
    return FusionCandidates(
        rank=ctx.rank, sequences=seqs, candidate_kernels_count=int(cand.sum()), candidate_time_us=cand_time,
        candidate_time_ratio=ratio(cand_time / total) if total else 0.0,
        min_occurrences_count=FUSION_MIN_COUNT,
        sequences_count=len(chosen), sequences_time_us=float(k.dur[cov].sum()),
        sequences_gap_us=cov_gap,
        host_bound_count=int(sum(host_flags)), mte_bound_count=int(sum(mte_flags)),
        host_bound_threshold_ratio=FUSION_HOST_BOUND, mte_bound_threshold_ratio=FUSION_MTE_BOUND,
        evidence=Evidence(
            time_ranges_us=[ctx.span],
            events=[" -> ".join(s.kernels)[:200] for s in seqs],
            counts={"kernels": len(k), "candidate_kernels": int(cand.sum()), "sequence_kernels": len(cov)},
            note="n-grams (n=2..4) of consecutive kernels on one stream, all element-wise/reduction/"
                 "normalisation; ranked by total time; a sequence inside, or shifted by one along, a "
                 "higher-ranked one that occurs about as often is the same run and is skipped; host bound: "
                 "exec_ratio < host_bound_threshold_ratio; MTE bound (Ascend pipe metrics): mte_ratio > "
                 "mte_bound_threshold_ratio (msprof-analyze's fusible-operator thresholds)",
        ),
    )  # fmt: skip


def _same_run(big: tuple[int, ...], big_count: int, small: tuple[int, ...], small_count: int) -> bool:
    """One contains the other, or they overlap shifted along each other with a similar count: both
    describe the same run of kernels, and only the higher-ranked one is kept."""
    n, m = len(big), len(small)
    if m <= n and any(big[i : i + m] == small for i in range(n - m + 1)):
        return True
    if n < m and any(small[i : i + n] == big for i in range(m - n + 1)):
        return True
    if abs(small_count - big_count) > 0.1 * max(big_count, small_count):
        return False
    for ov in range(max(1, min(n, m) - 1), min(n, m)):
        if big[-ov:] == small[:ov] or small[-ov:] == big[:ov]:
            return True
    return False


# --- written-out normalisations ---------------------------------------------------------------------
@lru_cache(maxsize=16384)
def _norm_role(name: str, cls: int) -> str:
    low = name.lower()
    if cls == CLS_INDEX["reduction"] and ("meanops" in low or "welfordops" in low or "mean_kernel" in low):
        return "mean"
    if cls == CLS_INDEX["elementwise"] and "rsqrt" in low:
        return "sqrt"
    if cls == CLS_INDEX["elementwise"] and "sqrt_kernel" in low:
        return "sqrt"
    if cls == CLS_INDEX["elementwise"] or (cls == _MEM and copy_kind_of_name(name) == "dtype_cast"):
        return "pointwise"
    return ""


def decomposed_norms(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    if len(k) < 3:
        return []
    order = np.lexsort((k.ts, k.stream, k.device))
    ks = k.take(order)
    pair = ks.name_id * len(CLASSES) + ks.cls
    uid, inv = np.unique(pair, return_inverse=True)
    roles = np.array([_norm_role(str(ks.names[p // len(CLASSES)]), int(p % len(CLASSES))) for p in uid],
                     dtype=object)[inv.reshape(-1)]  # fmt: skip
    n = len(ks)
    same = np.zeros(n, dtype=bool)
    same[1:] = (ks.stream[1:] == ks.stream[:-1]) & (ks.device[1:] == ks.device[:-1])  # same stream as the one before
    marked = np.zeros(n, dtype=bool)
    occ = 0
    example: list[int] = []
    for i in np.flatnonzero(roles == "sqrt"):
        if i >= 1 and same[i] and roles[i - 1] == "mean":
            j = i - 1  # mean, rsqrt
        elif i >= 2 and same[i] and same[i - 1] and roles[i - 1] == "pointwise" and roles[i - 2] == "mean":
            j = i - 2  # mean, add eps, rsqrt
        else:
            continue
        lo = j
        for _ in range(NORM_BACK):
            if lo - 1 >= 0 and same[lo] and roles[lo - 1] == "pointwise":
                lo -= 1
            else:
                break
        hi = i
        for _ in range(NORM_FWD):
            if hi + 1 < n and same[hi + 1] and roles[hi + 1] == "pointwise":
                hi += 1
            else:
                break
        marked[lo : hi + 1] = True
        occ += 1
        if not example:
            example = list(range(lo, hi + 1))
    if not occ:
        return []
    t = float(ks.dur[marked].sum())
    total = float(act.dur.sum())
    return [DecomposedNorm(
        rank=ctx.rank, occurrences_count=occ, kernels_count=int(marked.sum()),
        kernels_per_occurrence=float(marked.sum()) / occ, time_us=t,
        share_of_device_time_ratio=ratio(t / total) if total else 0.0,
        fused_norm_time_us=float(act.dur[act.cls == CLS_INDEX["norm"]].sum()),
        example=[short_kernel_name(str(ks.names[ks.name_id[x]])) for x in example],
        evidence=Evidence(
            time_ranges_us=[(float(ks.ts[example[0]]), float(ks.end[example[-1]]))] if example else [ctx.span],
            events=[short_kernel_name(str(ks.names[ks.name_id[x]])) for x in example][:8],
            counts={"occurrences": occ, "kernels": int(marked.sum())},
            note=f"a mean/variance reduction followed within two kernels by a [r]sqrt on the same stream, with up "
                 f"to {NORM_BACK} point-wise kernels before it and {NORM_FWD} after",
        ),
    )]  # fmt: skip


# --- element-wise epilogues after GEMMs ----------------------------------------------------------------
_EPI_ADD = re.compile(r"functor_add|functoronself_add|addfunctor|add_kernel|\bbias")
# ReLU runs as clamp_min (launch_clamp_scalar) or threshold in ATen
_EPI_ACT = re.compile(r"gelu|relu|silu|swish|tanh|sigmoid|hardswish|elu_kernel|mish|clamp_min|launch_clamp_scalar|"
                      r"threshold_kernel")


@lru_cache(maxsize=4096)
def epilogue_kind(name: str) -> str:
    """'add', 'activation' or '' for an element-wise kernel, from the functor in its name."""
    head = name.lower()[:200]
    if _EPI_ACT.search(head):
        return "activation"
    if _EPI_ADD.search(head):
        return "add"
    return ""


def gemm_epilogue(ctx: RankContext, act: Acts, k: Acts) -> list[Fact]:
    if is_ascend(ctx, ctx.trace.kernels) or len(k) < 2:
        return []
    uid, inv = np.unique(k.name_id, return_inverse=True)
    inv = inv.reshape(-1)
    aux = np.array([tensor_core_kind(str(k.names[i])) == "aux" for i in uid], dtype=bool)[inv]
    gemm = (k.cls == CLS_INDEX["gemm"]) & ~aux
    if not gemm.any():
        return []
    kind = np.array([epilogue_kind(str(k.names[i])) for i in uid], dtype=object)[inv]
    order = np.lexsort((k.ts, k.stream, k.device))
    nxt = np.full(len(k), -1, dtype=np.int64)  # the next kernel on the same device and stream
    same = (k.stream[order][1:] == k.stream[order][:-1]) & (k.device[order][1:] == k.device[order][:-1])
    nxt[order[:-1][same]] = order[1:][same]
    g = np.flatnonzero(gemm & (nxt >= 0))
    cand = nxt[g]
    cand = cand[(k.cls[cand] == CLS_INDEX["elementwise"]) & (kind[cand] != "")]
    m = np.zeros(len(k), dtype=bool)
    m[cand] = True
    if not m.any():
        return []
    register_selected(ctx, "gemm_epilogues", "element-wise adds and activations run right after a GEMM", k, m)
    t = float(k.dur[m].sum())
    gt = float(k.dur[gemm].sum())
    comp = float(k.dur[k.cls != _COMM].sum())
    tk = top_label(np.array([short_kernel_name(str(k.names[i])) for i in k.name_id[m]], dtype=object), k.dur[m])
    return [GemmEpilogue(
        rank=ctx.rank, gemm_count=int(gemm.sum()), gemm_time_us=gt, epilogue_count=int(m.sum()), epilogue_time_us=t,
        add_time_us=float(k.dur[m & (kind == "add")].sum()),
        activation_time_us=float(k.dur[m & (kind == "activation")].sum()),
        share_of_device_time_ratio=ratio(t / comp) if comp else 0.0,
        epilogue_to_gemm_ratio=t / gt if gt else 0.0, top_kernel=tk,
        evidence=Evidence(time_ranges_us=[ctx.span], events=[tk], counts={"epilogue_kernels": int(m.sum())},
                          note="the kernel right after each GEMM on the same stream, when it is an element-wise "
                               "add or activation (gelu, relu, silu, tanh, sigmoid) by its functor name"),
    )]  # fmt: skip
