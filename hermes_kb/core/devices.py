"""Accelerator peak table: dense peak FLOP/s per data type and HBM bandwidth, with sources, and the
intra-node interconnect link of each device model.

Every number is the vendor's *dense* figure (no 2:4 structured sparsity), per device as PyTorch
sees it: one GPU, or one GCD for AMD MI250/MI250X (each GCD is a separate ``torch.cuda`` device,
so the module figures are halved). ``peak_flops`` keys:

- ``fp64``, ``fp32``: vector (CUDA-core / SIMD) rates;
- ``fp32_matrix``: AMD matrix-core (MFMA) FP32, which hipBLASLt uses for FP32 GEMMs;
- ``tf32``, ``fp16``, ``bf16``, ``fp8``: tensor-core / matrix-core rates (TF32 is what cuBLAS and
  cuDNN use for FP32 matmuls/convolutions when TF32 is allowed);
- ``int8`` in OP/s.

``sources`` maps every key of ``peak_flops`` plus ``hbm`` to the URL the number was read from.
``verified`` is False where no vendor datasheet itemises the number (Ascend) and it comes from
secondary sources or from the memory configuration; treat those as approximate.

``lookup(device_properties)`` takes a Kineto ``deviceProperties`` entry (or just its name) and
returns the matching ``DeviceSpec``, or ``None`` when the device is unknown (then no roofline
class and no MFU can be given). See docs/devices.md.

``device_link(name)`` gives the intra-node interconnect of a device model (``LINKS``: NVLink,
Infinity Fabric, PCIe) with its per-direction peak, what a collective's bus bandwidth is
compared with (docs/analysis/comm.md); ``NICS`` keeps the inter-node NICs for reference.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

T = 1e12
GBPS = 1e9


@dataclass(frozen=True)
class DeviceSpec:
    key: str
    name: str
    vendor: str
    peak_flops: dict[str, float]  # FLOP/s (OP/s for int8), dense
    hbm_bytes_per_s: float
    memory_bytes: float | None
    sources: dict[str, str]
    note: str = ""
    verified: bool = True
    matched_by: str = field(default="name", compare=False)

    @property
    def hbm_gbps(self) -> float:
        return self.hbm_bytes_per_s / 1e9

    def peak(self, dtype: str) -> float | None:
        return self.peak_flops.get(dtype)

    @property
    def host_link_bytes_per_s(self) -> float | None:
        """One direction of the PCIe x16 link to the host (None: not known), by the generation the
        datasheets give (bidirectional figures there: 32 / 64 / 128 GB/s for Gen3 / Gen4 / Gen5)."""
        for prefix, gbps in HOST_LINK_GBPS.items():
            if self.key.startswith(prefix):
                return gbps * GBPS
        return None

    def matmul_peak(self, dtype: str, fp32_uses_tf32: bool = False) -> tuple[str, float] | None:
        """Peak for a matrix multiply (GEMM, convolution, attention) in ``dtype``.

        FP32 matmuls count against TF32 when the trace shows TF32 tensor-core kernels, else
        against the AMD matrix-core FP32 rate where there is one, else the vector FP32 rate.
        """
        if dtype == "fp32":
            order = (["tf32"] if fp32_uses_tf32 else []) + ["fp32_matrix", "fp32"]
        elif dtype == "bf16":
            order = ["bf16", "fp32"]  # no BF16 tensor cores (V100): BF16 runs at best at the FP32 rate
        elif dtype == "fp16":
            order = ["fp16", "fp32"]
        elif dtype == "fp8":
            order = ["fp8"]
        elif dtype == "int8":
            order = ["int8"]
        else:
            order = [dtype]
        for key in order:
            if key in self.peak_flops:
                return key, self.peak_flops[key]
        return None

    def vector_peak(self) -> tuple[str, float] | None:
        """Peak for element-wise work (CUDA cores / SIMD units): the vector FP32 rate."""
        if "fp32" in self.peak_flops:
            return "fp32", self.peak_flops["fp32"]
        return None


def _src(url: str, keys: list[str], **override: str) -> dict[str, str]:
    out = {k: url for k in keys}
    out.update(override)
    return out


# --- vendor sources -------------------------------------------------------------------------
V100_DS = "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf"
A100_DS = "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf"
H100_PAGE = "https://www.nvidia.com/en-us/data-center/h100/"
H200_PAGE = "https://www.nvidia.com/en-us/data-center/h200/"
B200_DGX_DS = "https://resources.nvidia.com/en-us-dgx-systems/dgx-b200-datasheet"
HGX_PAGE = "https://www.nvidia.com/en-us/data-center/hgx/"
MI250_PAGE = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250.html"
MI250X_PAGE = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi250x.html"
MI210_PAGE = "https://www.amd.com/en/products/accelerators/instinct/mi200/mi210.html"
MI300X_PAGE = "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html"
ASCEND910_PR = "https://www.huawei.com/en/news/2019/8/huawei-ascend-910-most-powerful-ai-processor"
ASCEND910_HC31 = "https://www.anandtech.com/show/14756/hot-chips-live-blogs-huawei-da-vinci-architecture"
ASCEND910B_DOC = "https://ai.gitee.com/docs/compute/clusters_gpu/ascend_gpu"


def _nv(key, name, fp64, fp32, tf32, fp16, fp8, int8, hbm_gbps, mem_gb, url, note="", src_override=None):
    flops = {"fp64": fp64 * T, "fp32": fp32 * T}
    if tf32:
        flops["tf32"] = tf32 * T
    flops["fp16"] = fp16 * T
    if tf32:  # bf16 tensor cores arrived with Ampere, together with TF32
        flops["bf16"] = fp16 * T
    if fp8:
        flops["fp8"] = fp8 * T
    if int8:
        flops["int8"] = int8 * T
    return DeviceSpec(key=key, name=name, vendor="nvidia", peak_flops=flops, hbm_bytes_per_s=hbm_gbps * GBPS,
                      memory_bytes=mem_gb * 1e9, sources=_src(url, [*flops, "hbm"], **(src_override or {})), note=note)  # fmt: skip


def _amd(key, name, fp64, fp32, fp32_matrix, tf32, bf16, fp8, int8, hbm_gbps, mem_gb, url, note=""):
    flops = {"fp64": fp64 * T, "fp32": fp32 * T, "fp32_matrix": fp32_matrix * T}
    if tf32:
        flops["tf32"] = tf32 * T
    flops["fp16"] = bf16 * T
    flops["bf16"] = bf16 * T
    if fp8:
        flops["fp8"] = fp8 * T
    flops["int8"] = int8 * T
    return DeviceSpec(key=key, name=name, vendor="amd", peak_flops=flops, hbm_bytes_per_s=hbm_gbps * GBPS,
                      memory_bytes=mem_gb * 1e9, sources=_src(url, [*flops, "hbm"]), note=note)  # fmt: skip


# one direction of the host link, GB/s, by family: PCIe Gen3 x16 (V100), Gen4 (A100, MI250, MI210),
# Gen5 (H100, H200, B200, MI300X); the datasheets in the table below give the bidirectional figures
HOST_LINK_GBPS = {"v100": 15.75, "a100": 31.5, "mi250": 31.5, "mi210": 31.5, "h100": 63.0, "h200": 63.0,
                  "b200": 63.0, "mi300x": 63.0}  # fmt: skip

_GCD = "per GCD: the module has two GCDs, each a separate PyTorch device; the module figures are halved"

DEVICES: dict[str, DeviceSpec] = {
    d.key: d
    for d in [
        # NVIDIA Volta: no TF32/BF16; FP16 tensor cores only
        _nv("v100-sxm2", "NVIDIA V100 SXM2", 7.8, 15.7, None, 125, None, None, 900, 32, V100_DS,
            "16 GB and 32 GB SXM2 boards have the same rates"),
        _nv("v100-pcie", "NVIDIA V100 PCIe", 7.0, 14.0, None, 112, None, None, 900, 32, V100_DS),
        _nv("v100s-pcie", "NVIDIA V100S PCIe", 8.2, 16.4, None, 130, None, None, 1134, 32, V100_DS),
        # NVIDIA Ampere
        _nv("a100-sxm4-40gb", "NVIDIA A100 SXM4 40GB", 9.7, 19.5, 156, 312, None, 624, 1555, 40, A100_DS,
            "also 'A100-PG509-200' (a 40 GB SXM4 board)"),
        _nv("a100-sxm4-80gb", "NVIDIA A100 SXM4 80GB", 9.7, 19.5, 156, 312, None, 624, 2039, 80, A100_DS),
        _nv("a100-pcie-40gb", "NVIDIA A100 PCIe 40GB", 9.7, 19.5, 156, 312, None, 624, 1555, 40, A100_DS),
        _nv("a100-pcie-80gb", "NVIDIA A100 PCIe 80GB", 9.7, 19.5, 156, 312, None, 624, 1935, 80, A100_DS),
        # NVIDIA Hopper (the page lists sparse tensor figures; dense = half)
        _nv("h100-sxm", "NVIDIA H100 SXM5 80GB", 34, 67, 494.5, 989.5, 1979, 1979, 3350, 80, H100_PAGE,
            "tensor figures are the page's sparse numbers halved"),
        _nv("h100-pcie", "NVIDIA H100 PCIe 80GB", 26, 51, 378, 756, 1513, 1513, 2000, 80, H100_PAGE,
            "tensor figures are the page's sparse numbers halved"),
        _nv("h100-nvl", "NVIDIA H100 NVL 94GB", 30, 60, 417.5, 835.5, 1671, 1671, 3900, 94, H100_PAGE,
            "tensor figures are the page's sparse numbers halved"),
        _nv("h200-sxm", "NVIDIA H200 SXM 141GB", 34, 67, 494.5, 989.5, 1979, 1979, 4800, 141, H200_PAGE,
            "tensor figures are the page's sparse numbers halved"),
        _nv("h200-nvl", "NVIDIA H200 NVL 141GB", 30, 60, 417.5, 835.5, 1671, 1671, 4800, 141, H200_PAGE,
            "tensor figures are the page's sparse numbers halved"),
        # NVIDIA Blackwell (HGX/DGX B200, 1000 W); DGX totals divided by 8, sparse figures halved
        _nv("b200", "NVIDIA B200 (HGX/DGX, 1000 W)", 37, 75, 1125, 2250, 4500, 4500, 8000, 180, B200_DGX_DS,
            "DGX B200 8-GPU totals / 8; FP32 and FP64 from the HGX page (600 TF FP32 per 8 GPUs)",
            src_override={"fp32": HGX_PAGE, "fp64": HGX_PAGE}),
        # AMD CDNA2 (gfx90a) and CDNA3 (gfx942)
        _amd("mi250x-gcd", "AMD Instinct MI250X (one GCD)", 23.95, 23.95, 47.85, None, 191.5, None, 191.5, 1638.4, 64,
             MI250X_PAGE, _GCD),
        _amd("mi250-gcd", "AMD Instinct MI250 (one GCD)", 22.65, 22.65, 45.25, None, 181.05, None, 181.05, 1638.4, 64,
             MI250_PAGE, _GCD),
        _amd("mi210", "AMD Instinct MI210", 22.6, 22.6, 45.3, None, 181.0, None, 181.0, 1638.4, 64, MI210_PAGE),
        _amd("mi300x", "AMD Instinct MI300X", 81.7, 81.7, 163.4, 653.7, 1307.4, 2614.9, 2614.9, 5300, 192, MI300X_PAGE,
             "also the 'MI300X VF' (SR-IOV virtual function) of the same chip"),
        # Huawei Ascend (DaVinci): Cube unit FP16 (910B also BF16). No vendor datasheet itemises HBM
        # bandwidth; the figures below are from secondary sources and the HBM configuration.
        DeviceSpec(key="ascend910a", name="Huawei Ascend 910 (910A)", vendor="huawei",
                   peak_flops={"fp16": 256 * T, "int8": 512 * T}, hbm_bytes_per_s=1200 * GBPS, memory_bytes=32e9,
                   sources={"fp16": ASCEND910_PR, "int8": ASCEND910_PR, "hbm": ASCEND910_HC31},
                   note="HBM: four HBM2 stacks (Hot Chips 31); ~1.2 TB/s is the figure secondary sources quote, "
                        "not stated on either cited page",
                   verified=False),  # fmt: skip
        DeviceSpec(key="ascend910b", name="Huawei Ascend 910B", vendor="huawei",
                   peak_flops={"fp16": 280 * T, "bf16": 280 * T}, hbm_bytes_per_s=1600 * GBPS, memory_bytes=64e9,
                   sources={"fp16": ASCEND910B_DOC, "bf16": ASCEND910B_DOC, "hbm": ASCEND910B_DOC},
                   note="910B1..B4 SKUs differ (published FP16 figures range ~280-400 TF); 64 GB HBM2e, "
                        "~1.6 TB/s from secondary sources",
                   verified=False),  # fmt: skip
    ]
}


def _props(device: Mapping[str, Any] | str | None) -> dict[str, Any]:
    if device is None:
        return {}
    if isinstance(device, str):
        return {"name": device}
    return dict(device)


def _gb(props: dict[str, Any]) -> float | None:
    mem = props.get("totalGlobalMem")
    try:
        return float(mem) / 1e9 if mem else None
    except (TypeError, ValueError):
        return None


def _by_name(name: str, props: dict[str, Any]) -> str | None:
    n = name.lower()
    gb = _gb(props)
    if "v100" in n:
        if "v100s" in n:
            return "v100s-pcie"
        return "v100-pcie" if "pcie" in n else "v100-sxm2"
    if "a100" in n:
        big = "80gb" in n or (gb is not None and gb > 50)
        if "pcie" in n:
            return "a100-pcie-80gb" if big else "a100-pcie-40gb"
        return "a100-sxm4-80gb" if big else "a100-sxm4-40gb"  # SXM4 and the PG5xx boards
    if "h100" in n:
        if "pcie" in n:
            return "h100-pcie"
        if "nvl" in n:
            return "h100-nvl"
        return "h100-sxm"  # 'NVIDIA H100 80GB HBM3', 'H100 SXM5'
    if "h200" in n:
        return "h200-nvl" if "nvl" in n else "h200-sxm"
    if re.search(r"\bb200\b", n):
        return "b200"
    if "mi300x" in n:
        return "mi300x"
    if "mi250x" in n:
        return "mi250x-gcd"
    if "mi250" in n:
        return "mi250-gcd"
    if "mi210" in n:
        return "mi210"
    if "ascend" in n and "910" in n:
        return "ascend910b" if re.search(r"910\s*b", n) else "ascend910a"
    return None


def _by_architecture(props: dict[str, Any]) -> str | None:
    """AMD devices that report no usable name ('AMD Radeon Graphics', ''): by gfx arch and CU count."""
    try:
        major, minor = int(props.get("computeMajor", -1)), int(props.get("computeMinor", -1))
        cus, warp = int(props.get("numSms", -1)), int(props.get("warpSize", -1))
    except (TypeError, ValueError):
        return None
    if warp != 64:
        return None
    gb = _gb(props) or 0.0
    if (major, minor) == (9, 4) and cus == 304 and 150 < gb < 240:
        return "mi300x"  # gfx942, 304 CUs, 192 GiB = 206 GB (an MI325X has 256 GiB)
    if (major, minor) == (9, 0):  # gfx90a
        if cus == 110:
            return "mi250x-gcd"
        if cus == 104:
            return "mi250-gcd"  # an MI250 GCD and an MI210 have the same per-device peaks
    return None


def lookup(device: Mapping[str, Any] | str | None) -> DeviceSpec | None:
    """The spec for a deviceProperties entry (or a device name); None when unknown."""
    props = _props(device)
    name = str(props.get("name") or "")
    key = _by_name(name, props) if name else None
    how = "name"
    if key is None:
        key = _by_architecture(props)
        how = "architecture"
    if key is None:
        return None
    spec = DEVICES[key]
    return spec if how == "name" else DeviceSpec(**{**spec.__dict__, "matched_by": how})


def device_of_trace(trace: Any, device_id: int | None = None) -> DeviceSpec | None:
    """The spec of a RankTrace's device (the entry whose id is ``device_id``, else the first)."""
    props = list(getattr(trace.meta, "device_properties", None) or [])
    if not props:
        return None
    chosen = props[0]
    if device_id is not None:
        for p in props:
            if p.get("id") == device_id:
                chosen = p
                break
    return lookup(chosen)


# ------------------------------------------------------------------ interconnect links


@dataclass(frozen=True)
class Link:
    name: str
    peak_gbps: float  # per direction, per GPU: what NCCL's busbw is compared with
    total_gbps: float  # as the vendor quotes it (both directions)
    source: str


# Intra-node links by device model (first match wins). Vendors quote the bidirectional total;
# busbw is a per-direction figure, so it is compared with half of it.
LINKS: list[tuple[re.Pattern, Link]] = [
    (
        re.compile(r"V100.*(SXM|DGX)|DGX.*V100", re.I),
        Link("NVLink 2 (6 links)", 150.0, 300.0, "NVIDIA Tesla V100 datasheet: NVLink 300 GB/s"),
    ),
    (
        re.compile(r"A100.*PCIE|A100.*PCI", re.I),
        Link(
            "PCIe Gen4 x16",
            32.0,
            64.0,
            "PCI-SIG: Gen4 x16 ~32 GB/s per direction (NVLink bridge not detectable)",
        ),
    ),
    (
        re.compile(r"A100|A800", re.I),
        Link("NVLink 3 (12 links)", 300.0, 600.0, "NVIDIA A100 datasheet: NVLink 600 GB/s (SXM4, HGX)"),
    ),
    (
        re.compile(r"H100.*PCIE|H100 NVL", re.I),
        Link(
            "PCIe Gen5 x16",
            64.0,
            128.0,
            "PCI-SIG: Gen5 x16 ~64 GB/s per direction (NVLink bridge not detectable)",
        ),
    ),
    (
        re.compile(r"H100|H200|H800|GH200", re.I),
        Link("NVLink 4 (18 links)", 450.0, 900.0, "NVIDIA H100/H200 datasheets: NVLink 900 GB/s (SXM5)"),
    ),
    (
        re.compile(r"B200|B100|GB200", re.I),
        Link(
            "NVLink 5 (18 links)",
            900.0,
            1800.0,
            "NVIDIA Blackwell (HGX B200) datasheet: NVLink 1.8 TB/s per GPU",
        ),
    ),
    (
        re.compile(r"MI300X|MI325X", re.I),
        Link(
            "Infinity Fabric (7 links)",
            448.0,
            896.0,
            "AMD Instinct MI300X datasheet: 7 x 128 GB/s Infinity Fabric links",
        ),
    ),
    (
        re.compile(r"MI250", re.I),
        Link(
            "Infinity Fabric (8 links)",
            400.0,
            800.0,
            "AMD Instinct MI250X datasheet: up to 800 GB/s Infinity Fabric",
        ),
    ),
    (
        re.compile(r"V100.*PCIE|RTX|GeForce|T4\b|Tesla P", re.I),
        Link("PCIe Gen3 x16", 15.75, 31.5, "PCI-SIG: Gen3 x16 15.75 GB/s per direction"),
    ),
]

# Inter-node NICs, for reference: the trace does not record which NIC a job used, so hermes
# reports 'unknown' for groups that span nodes (InfiniBand HDR 200 Gb/s = 25 GB/s and NDR
# 400 Gb/s = 50 GB/s per port and direction, NVIDIA ConnectX-6/-7 product briefs).
NICS = {"InfiniBand HDR": 25.0, "InfiniBand NDR": 50.0}

UNKNOWN_LINK = "unknown"


def device_link(device: str | None) -> Link | None:
    if not device:
        return None
    for pat, link in LINKS:
        if pat.search(device):
            return link
    return None


__all__ = ["DEVICES", "LINKS", "NICS", "UNKNOWN_LINK", "DeviceSpec", "Link", "device_link", "device_of_trace",
           "lookup"]  # fmt: skip
