"""Synchronisation waits across ranks (fact ``comm_sync_wait``): each collective instance is
matched on every rank of its group (by ``seq`` when recorded, else by its order among the
group's collectives of that kind within the step), and R_wait = 1 - mean(T_i) / max(T_i) (the
paper's synchronisation waste), the slowest rank and the one that waits most. Reads the ranks'
digests only (digest.py). Formulas: docs/analysis/comm.md."""

from __future__ import annotations

import numpy as np
import pandas as pd

from hermes_kb.facts.base import Evidence
from hermes_kb.facts.comm import CommSyncWait


def occurrence(df: pd.DataFrame) -> pd.Series:
    """Each collective's order among its group's collectives of that kind and source within the
    step: what matches an instance across ranks where no sequence number is recorded."""
    return df.groupby(["pg", "pg_ranks", "kind", "source", "step"], sort=False).cumcount()


def instances(digests: dict) -> pd.DataFrame:
    """Every rank's collectives (the digests' rows) in one frame, with the rank and ``occ``, the
    order of each among its group's collectives of that kind and source within the step."""
    parts = []
    for r, dg in digests.items():
        df = dg.collectives
        if not len(df):
            continue
        d = df[["pg", "pg_ranks", "kind", "source", "step", "ts", "dur", "seq", "n", "name", "msg_bytes"]].copy()
        d["rank"] = r
        d["occ"] = occurrence(d)
        parts.append(d)
    if not parts:
        return pd.DataFrame()
    return pd.concat(parts, ignore_index=True)


def sync_wait(
    key,
    grp: pd.DataFrame,
    inst_cols: list[str],
    ranks: list[int],
    matched_by: str,
) -> CommSyncWait | None:
    """The sync-wait fact of one (group, kind, source): ``grp``, its rows of ``instances``,
    matched into instances by ``inst_cols`` across ``ranks``; None when no instance has every
    rank."""
    pg, pg_ranks, kind, source = key
    g = grp.copy()
    g["inst"] = g.groupby(inst_cols, sort=False).ngroup()
    per = g.groupby("inst")
    nr = per["rank"].transform("nunique")
    full = nr.to_numpy() == len(ranks)
    unmatched = int(per.ngroups - g.loc[full, "inst"].nunique())
    g = g[full]
    if not len(g):
        return None
    g = g.drop_duplicates(["inst", "rank"])
    per = g.groupby("inst")
    tmin = per["dur"].transform("min").to_numpy()
    g["wait"] = g["dur"].to_numpy() - tmin
    agg = per.agg(
        tmean=("dur", "mean"),
        tmax=("dur", "max"),
        ts_lo=("ts", "min"),
        ts_hi=("ts", "max"),
        wait=("wait", "sum"),
    )
    r = np.where(agg["tmax"] > 0, 1.0 - agg["tmean"] / agg["tmax"].where(agg["tmax"] > 0, 1.0), 0.0)
    r = np.clip(r, 0.0, 1.0)
    n_inst = len(agg)
    # slowest = the shortest collective of an instance (arrives last); most waiting = the longest.
    # Ties in how often: the slowest is the one that waited least in total, and vice versa.
    wait_all = g.groupby("rank")["wait"].sum()
    slow_n = g.loc[per["dur"].idxmin(), "rank"].value_counts()
    waiting_n = g.loc[per["dur"].idxmax(), "rank"].value_counts()
    slow = sorted(slow_n.items(), key=lambda kv: (-kv[1], wait_all[kv[0]], kv[0]))[0]
    waiting = sorted(waiting_n.items(), key=lambda kv: (-kv[1], -wait_all[kv[0]], kv[0]))[0]
    wait_by_rank = wait_all.sort_values(ascending=False).head(10)
    worst = agg["wait"].idxmax()
    w = g[g["inst"] == worst]
    end_hi = float((w["ts"] + w["dur"]).max())
    sum_tmax = float(agg["tmax"].sum())
    n_rec = int(grp["n"].max()) if (grp["n"] > 0).any() else None
    return CommSyncWait(
        rank=None,
        process_group=pg,
        group_ranks=ranks,
        group_size_count=n_rec,
        collective=kind,
        source=source,
        matched_by=matched_by,
        instances_count=n_inst,
        unmatched_count=unmatched,
        r_wait_mean_ratio=float(r.mean()),
        r_wait_max_ratio=float(r.max()),
        r_wait_weighted_ratio=float(np.clip(1.0 - agg["tmean"].sum() / sum_tmax, 0, 1))
        if sum_tmax > 0
        else 0.0,
        wait_total_us=float(agg["wait"].sum()),
        wait_by_rank_us={int(k): float(v) for k, v in wait_by_rank.items()},
        slowest_rank=int(slow[0]),
        slowest_rank_share_ratio=float(slow[1]) / n_inst,
        most_waiting_rank=int(waiting[0]),
        most_waiting_rank_share_ratio=float(waiting[1]) / n_inst,
        most_waiting_rank_wait_us=float(wait_all[waiting[0]]),
        arrival_spread_mean_us=float((agg["ts_hi"] - agg["ts_lo"]).mean()),
        evidence=Evidence(
            time_ranges_us=[(float(w["ts"].min()), end_hi)],
            events=[str(grp["name"].iat[0])],
            counts={"instances": n_inst, "ranks": len(ranks), "unmatched": unmatched},
            note=(
                f"instances matched by {'seq' if matched_by == 'seq' else 'step and order of occurrence'}; "
                "R_wait = 1 - mean(T_i)/max(T_i) per instance, T_i the duration on rank i; wait of rank i = "
                "T_i - min_j T_j; time range = the instance with the most waiting"
            ),
        ),
    )


__all__ = ["instances", "occurrence", "sync_wait"]
