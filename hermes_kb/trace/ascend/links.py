"""How an Ascend rank's host and device work join: CANN call -> device task by connection id
(``device_links``), and the host op that issued each device task (``assign_ext_ids``: the
torch_to_npu flows)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from .timeline import Timeline


def device_links(rt: pd.DataFrame, kernels: pd.DataFrame, memcpy: pd.DataFrame) -> pd.DataFrame:
    cols = ["correlation", "gpu_kind", "gpu_idx", "gpu_ts", "gpu_ext_id", "runtime_idx", "launch_ts", "launch_tid",
            "runtime_ext_id", "ext_id"]  # fmt: skip
    if not len(rt):
        return _typed_links(pd.DataFrame({c: [] for c in cols}))
    prio = rt["kind"].astype(str).map({"launch": 0, "memcpy": 0}).fillna(1).to_numpy()
    r = pd.DataFrame({"correlation": rt["correlation"].to_numpy(), "runtime_idx": np.arange(len(rt)), "prio": prio,
                      "launch_ts": rt["ts"].to_numpy(), "launch_tid": rt["tid"].to_numpy(),
                      "runtime_ext_id": rt["ext_id"].to_numpy()})  # fmt: skip
    r = r[r["correlation"] >= 0].sort_values(["correlation", "prio"]).drop_duplicates("correlation")
    parts = []
    for kind, df in (("kernel", kernels), ("memcpy", memcpy)):
        if not len(df):
            continue
        g = pd.DataFrame({"correlation": df["correlation"].to_numpy(), "gpu_idx": np.arange(len(df)),
                          "gpu_ts": df["ts"].to_numpy(), "gpu_ext_id": df["ext_id"].to_numpy()})  # fmt: skip
        g = g[g["correlation"] >= 0].merge(r, on="correlation", how="inner")
        g["gpu_kind"] = kind
        parts.append(g)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({c: [] for c in cols})
    out["ext_id"] = out["gpu_ext_id"] if len(out) else []
    return _typed_links(out[cols])


def _typed_links(df: pd.DataFrame) -> pd.DataFrame:
    df = df.copy()
    for c in ("correlation", "gpu_idx", "gpu_ext_id", "runtime_idx", "launch_tid", "runtime_ext_id", "ext_id"):
        df[c] = df[c].astype(np.int64)
    for c in ("gpu_ts", "launch_ts"):
        df[c] = df[c].astype(np.float64)
    df["gpu_kind"] = pd.Categorical(df["gpu_kind"].astype(object))
    return df.reset_index(drop=True)


def assign_ext_ids(tl: Timeline | None, frames: dict[str, pd.DataFrame], links: pd.DataFrame) -> None:
    """The host op that issued each device task (torch_to_npu flows: op start -> task start);
    the innermost op starting at the flow's start wins. Runtime calls take their task's id."""
    ops = frames["cpu_ops"]
    if tl is None or not len(tl.op_flows) or not len(ops):
        return
    # called before the frames are moved to the rank's origin: flows and frames share one time axis
    key = pd.DataFrame({"tid": ops["tid"].to_numpy(), "ts": np.round(ops["ts"].to_numpy(), 3),
                        "depth": ops["depth"].to_numpy(), "ext": ops["ext_id"].to_numpy()})  # fmt: skip
    key = key.sort_values("depth", ascending=False).drop_duplicates(["tid", "ts"]).set_index(["tid", "ts"])["ext"]
    fl = tl.op_flows
    ext = key.reindex(pd.MultiIndex.from_arrays([fl["host_tid"].to_numpy(), np.round(fl["host_ts"].to_numpy(), 3)])).to_numpy()
    dev_ts = np.round(fl["device_ts"].to_numpy(), 3)
    ok = ~np.isnan(ext.astype(np.float64))
    by_ts = pd.Series(ext[ok].astype(np.int64), index=dev_ts[ok])
    by_ts = by_ts[~by_ts.index.duplicated()]
    for name in ("kernels", "memcpy"):
        df = frames[name]
        if len(df):
            got = by_ts.reindex(np.round(df["ts"].to_numpy(), 3)).to_numpy()
            df["ext_id"] = np.where(np.isnan(got.astype(np.float64)), df["ext_id"].to_numpy(), np.nan_to_num(got, nan=-1)).astype(np.int64)
    if len(links):
        for kind, name in (("kernel", "kernels"), ("memcpy", "memcpy")):
            sel = (links["gpu_kind"] == kind).to_numpy()
            idx = links["gpu_idx"].to_numpy()[sel]
            e = frames[name]["ext_id"].to_numpy()[idx]
            links.loc[sel, "gpu_ext_id"] = e
            links.loc[sel, "ext_id"] = e
            rt_idx = links["runtime_idx"].to_numpy()[sel]
            rext = frames["runtime"]["ext_id"].to_numpy().copy()
            rext[rt_idx] = e
            frames["runtime"]["ext_id"] = rext
            links.loc[sel, "runtime_ext_id"] = e
