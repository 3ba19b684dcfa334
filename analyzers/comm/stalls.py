"""Transfer stalls across ranks (fact ``comm_transfer_stall``): per rank, the matched instances
of a group's large collectives whose transfer, once the last rank arrived, ran well below the
group's own best rate, the time beyond that rate, and how much of it another collective of the
rank ran beside. Reads the ranks' digests only (digest.py). Formulas: docs/analysis/comm.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.comm import CommTransferStall

from .groups import MIB, ratio

STALL_MIN_BYTES = 8 * MIB  # from here bandwidth, not latency, dominates a collective (as C-COMM-004)
STALL_RATIO = 0.25  # an instance below a quarter of the group's own best rate stalls
END_SPREAD = 0.1  # median spread of an instance's end across ranks, over the median post-arrival time
END_SPREAD_MIN_US = 50.0


def transfer_stall(key, grp: pd.DataFrame, inst_cols: list[str], ranks: list[int],
                   digests: dict, others: pd.DataFrame) -> list[CommTransferStall]:  # fmt: skip
    """Per rank: each matched instance's time after the last rank arrived (its latest start),
    its rate bytes / that time, against the best rate of the group's sized instances (every
    rank); instances below STALL_RATIO x best stall, and their time beyond bytes / best is the
    excess. Concurrency: the part of the stalled windows during which another collective of the
    rank (another group or kind: ``others``, rows of sync.py ``instances``) runs. Reads the digests
    only (digest.py)."""
    pg, pg_ranks, kind, source = key
    g = grp.copy()
    g["inst"] = g.groupby(inst_cols, sort=False).ngroup()
    full = g.groupby("inst")["rank"].transform("nunique").to_numpy() == len(ranks)
    g = g[full].drop_duplicates(["inst", "rank"])
    if not len(g):
        return []
    g["end"] = g["ts"] + g["dur"]
    last = g.groupby("inst")["ts"].transform("max").to_numpy()
    g["post_start"] = np.maximum(last, g["ts"].to_numpy())
    g["post"] = np.maximum(g["end"].to_numpy() - last, 0.0)
    # a collective ends at about the same time on every rank; when the ends drift apart by more
    # than END_SPREAD of the post-arrival time, the ranks' clocks are not comparable (traces of
    # different nodes) and arrival order cannot be read from them
    ends = g.groupby("inst")["end"]
    spread = float(np.median((ends.max() - ends.min()).to_numpy()))
    if spread > max(END_SPREAD * float(np.median(g["post"].to_numpy())), END_SPREAD_MIN_US):
        return []
    g["arrive_wait"] = last - g["ts"].to_numpy()
    size = g["msg_bytes"].to_numpy(float)
    sized = (size >= STALL_MIN_BYTES) & (g["post"].to_numpy() > 0)
    g["sized"] = sized
    g["rate"] = np.where(sized, size / np.maximum(g["post"].to_numpy(), 1e-9) / 1e3, np.nan)  # GB/s
    if sized.sum() < 2 or g.loc[sized, "inst"].nunique() < 2:
        return []
    best_row = g.loc[g["rate"].idxmax()]
    best = float(best_row["rate"])
    g["stalled"] = sized & (g["rate"].to_numpy() < STALL_RATIO * best)
    # a fact for each rank with a stalled instance only: at thousands of ranks the others say nothing
    g = g[g["rank"].isin(g.loc[g["stalled"], "rank"].unique())]
    if not len(g):
        return []
    g["excess"] = np.where(g["stalled"], np.maximum(g["post"] - g["msg_bytes"] / (best * 1e3), 0.0), 0.0)
    g["st_post"] = np.where(g["stalled"], g["post"], 0.0)
    g["st_bytes"] = np.where(g["stalled"], g["msg_bytes"], 0)
    per = g.groupby("rank", sort=True)
    agg = per.agg(instances=("inst", "nunique"), sized=("sized", "sum"), stalled=("stalled", "sum"),
                  post=("post", "sum"), wait=("arrive_wait", "sum"), excess=("excess", "sum"),
                  st_post=("st_post", "sum"), st_bytes=("st_bytes", "sum"), name=("name", "first"))  # fmt: skip
    agg["median"] = g[g["sized"]].groupby("rank")["rate"].median()
    st = g[g["stalled"]]
    worst = st.loc[st.groupby("rank")["post"].idxmax()].set_index("rank")
    agg["concurrent"] = _concurrent(st, others)
    out = []
    for r, a in agg.iterrows():
        dg = digests[int(r)]
        w = worst.loc[r]
        analysed = float(sum(x.end_us - x.start_us for x in dg.windows))
        stalled_us, stalled_bytes, excess = float(a["st_post"]), int(a["st_bytes"]), float(a["excess"])
        concurrent = min(float(a["concurrent"]), stalled_us)
        out.append(CommTransferStall(
            rank=int(r), process_group=pg, group_ranks=ranks, collective=kind, source=source,
            instances_count=int(a["instances"]), sized_count=int(a["sized"]), min_bytes=STALL_MIN_BYTES,
            post_arrival_us=float(a["post"]), arrival_wait_us=float(a["wait"]),
            best_gbps=best, best_bytes=int(best_row["msg_bytes"]), median_gbps=float(a["median"]),
            stall_ratio_threshold=STALL_RATIO, stalled_count=int(a["stalled"]), stalled_us=stalled_us,
            stalled_bytes=stalled_bytes, stalled_gbps=stalled_bytes / stalled_us / 1e3 if stalled_us > 0 else None,
            excess_us=excess, stalled_concurrent_us=concurrent,
            stalled_concurrent_ratio=ratio(concurrent, stalled_us) if stalled_us > 0 else 0.0,
            worst_us=float(w["post"]),
            worst_bytes=int(w["msg_bytes"]),
            analysed_us=analysed, excess_share_ratio=ratio(excess, analysed),
            evidence=Evidence(
                time_ranges_us=[(float(w["post_start"]), float(w["end"]))],
                events=[str(a["name"])],
                counts={"instances": int(a["instances"]), "sized": int(a["sized"]), "stalled": int(a["stalled"])},
                note=(f"post-arrival time = end on this rank - latest start among ranks {ranks}; rate = bytes / "
                      f"post-arrival time for instances of >= {STALL_MIN_BYTES // MIB} MiB; stalled below "
                      f"{STALL_RATIO:g} x the best rate ({best:.1f} GB/s, {int(best_row['msg_bytes'])} B); "
                      "time range = the slowest stalled instance after arrival"),
            ),
        ))  # fmt: skip
    return out


def _concurrent(st: pd.DataFrame, others: pd.DataFrame) -> pd.Series:
    """Per rank: length of the stalled post-arrival windows ``st`` (rank, post_start, end) covered
    by the union of that rank's other collectives (rank, ts, dur), without a loop over ranks."""
    o = others[others["rank"].isin(st["rank"].unique())]
    if not len(o):
        return pd.Series(0.0, index=pd.Index(sorted(st["rank"].unique()), name="rank"))
    o = o.assign(end=o["ts"] + o["dur"]).sort_values(["rank", "ts"], kind="stable")
    prev_end = o.groupby("rank")["end"].cummax().groupby(o["rank"]).shift()
    new = prev_end.isna().to_numpy() | (o["ts"].to_numpy() > prev_end.fillna(-np.inf).to_numpy())
    seg = o.assign(seg=np.cumsum(new)).groupby("seg").agg(rank=("rank", "first"), s=("ts", "min"), e=("end", "max"))
    m = st[["rank", "post_start", "end"]].merge(seg, on="rank")
    m["ov"] = np.clip(np.minimum(m["end"], m["e"]) - np.maximum(m["post_start"], m["s"]), 0.0, None)
    return m.groupby("rank")["ov"].sum().reindex(sorted(st["rank"].unique()), fill_value=0.0)


__all__ = ["END_SPREAD", "END_SPREAD_MIN_US", "STALL_MIN_BYTES", "STALL_RATIO", "transfer_stall"]
