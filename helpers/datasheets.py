"""Datasheet numbers of the GPUs the course talks about.

Every rate is the vendor's peak for the *dense* case (no structured sparsity). Tensor-core rates
are with fp32 accumulate, which is what training and these notebooks use (GeForce cards run fp16/bf16
with fp32 accumulate at half their fp16-accumulate rate). ``None`` means the card has no such unit
(V100 and T4 have no bf16 or tf32 tensor cores). These are leads to compare measurements against,
not measurements: notebook 00 measures the card in front of you.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass

_AMPERE_WP = "https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf"
_GA102_WP = "https://www.nvidia.com/content/PDF/nvidia-ampere-ga-102-gpu-architecture-whitepaper-v2.pdf"
_ADA_WP = "https://images.nvidia.com/aem-dam/Solutions/Data-Center/l4/nvidia-ada-gpu-architecture-whitepaper-v2.1.pdf"
_HOPPER_WP = "https://resources.nvidia.com/en-us-tensor-core/gtc22-whitepaper-hopper"
_VOLTA_WP = "https://images.nvidia.com/content/volta-architecture/pdf/volta-architecture-whitepaper.pdf"
_TURING_WP = "https://images.nvidia.com/aem-dam/en-zz/Solutions/design-visualization/technologies/turing-architecture/NVIDIA-Turing-Architecture-Whitepaper.pdf"


@dataclass(frozen=True)
class GpuSpec:
    """One card's datasheet row."""

    name: str
    architecture: str
    year: int | None  # None: a row measured on the card (studies.roofline.measured_spec), not a datasheet's
    bf16_tflops: float | None  # dense tensor-core bf16, fp32 accumulate
    fp16_tflops: float  # dense tensor-core fp16, fp32 accumulate
    tf32_tflops: float | None  # dense tensor-core tf32
    fp32_tflops: float  # plain fp32 FMA on the CUDA cores
    memory_gb: float
    bandwidth_gbps: float  # memory bandwidth, GB/s (1e9 bytes)
    l2_mb: float
    sms: int
    smem_per_sm_kb: int  # largest shared-memory carve-out per SM
    boost_mhz: int
    tdp_w: int
    nvlink_gbps: float | None  # total NVLink bandwidth per GPU, None if it has none
    mig_slices: int  # 0 if no MIG
    source: str
    pattern: str  # regex matched against torch.cuda.get_device_name()

    @property
    def tensor_tflops(self) -> float:
        """The best 16-bit tensor-core rate the card has (bf16 where it exists, else fp16)."""
        return self.bf16_tflops or self.fp16_tflops

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the 16-bit tensor-core roofline turns flat."""
        return self.tensor_tflops * 1e12 / (self.bandwidth_gbps * 1e9)

    def as_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "pattern"}


SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("V100 SXM2", "Volta", 2017, None, 125.0, None, 15.7, 32, 900, 6, 80, 96, 1530, 300, 300, 0,
            "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf; "
            + _VOLTA_WP, r"V100-SXM2"),
    GpuSpec("V100 PCIe", "Volta", 2017, None, 112.0, None, 14.0, 32, 900, 6, 80, 96, 1380, 250, None, 0,
            "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf; "
            + _VOLTA_WP, r"V100-PCIE"),
    GpuSpec("T4", "Turing", 2018, None, 65.0, None, 8.1, 16, 320, 4, 40, 64, 1590, 70, None, 0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/tesla-t4/t4-tensor-core-datasheet-951643.pdf; "
            + _TURING_WP, r"\bT4\b"),
    GpuSpec("A100 40GB SXM", "Ampere", 2020, 312.0, 312.0, 156.0, 19.5, 40, 1555, 40, 108, 164, 1410, 400, 600, 7,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; "
            + _AMPERE_WP, r"A100-SXM4-40GB"),
    GpuSpec("A100 40GB PCIe", "Ampere", 2020, 312.0, 312.0, 156.0, 19.5, 40, 1555, 40, 108, 164, 1410, 250, 600, 7,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
            "(NVLink through a bridge, two cards); " + _AMPERE_WP, r"A100-PCIE-40GB"),
    GpuSpec("A100 80GB SXM", "Ampere", 2020, 312.0, 312.0, 156.0, 19.5, 80, 2039, 40, 108, 164, 1410, 400, 600, 7,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf; "
            + _AMPERE_WP, r"A100-SXM4-80GB"),
    GpuSpec("A100 80GB PCIe", "Ampere", 2020, 312.0, 312.0, 156.0, 19.5, 80, 1935, 40, 108, 164, 1410, 300, 600, 7,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf "
            "(NVLink through a bridge, two cards); " + _AMPERE_WP, r"A100 80GB PCIe"),
    GpuSpec("A10", "Ampere", 2021, 125.0, 125.0, 62.5, 31.2, 24, 600, 6, 72, 100, 1695, 150, None, 0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a10/pdf/datasheet-new/nvidia-a10-datasheet.pdf; "
            "SMs, L2 and shared memory: " + _GA102_WP, r"\bA10\b"),
    GpuSpec("RTX A6000", "Ampere", 2020, 154.8, 154.8, 77.4, 38.7, 48, 768, 6, 84, 100, 1800, 300, 112.5, 0,
            "https://www.nvidia.com/en-us/design-visualization/rtx-a6000/ (datasheet: 309.7 TFLOPS of tensor "
            "performance with sparsity, so 154.8 dense; NVLink through a bridge, two cards); " + _GA102_WP
            + " (appendix table); the seed's \"10,752 CUDA cores\" card", r"RTX A6000"),
    GpuSpec("RTX 6000 Ada", "Ada Lovelace", 2022, 364.2, 364.2, 182.1, 91.1, 48, 960, 96, 142, 100, 2505, 300, None, 0,
            "https://www.nvidia.com/content/dam/en-zz/Solutions/design-visualization/rtx-6000/proviz-print-rtx6000-datasheet-web-2504660.pdf; "
            + _ADA_WP + " (appendix table)", r"RTX 6000 Ada"),
    GpuSpec("L40S", "Ada Lovelace", 2023, 362.05, 362.05, 183.0, 91.6, 48, 864, 96, 142, 100, 2520, 350, None, 0,
            "https://resources.nvidia.com/en-us-l40s/l40s-datasheet-28413; " + _ADA_WP, r"\bL40S\b"),
    GpuSpec("L40", "Ada Lovelace", 2022, 181.05, 181.05, 90.5, 90.5, 48, 864, 96, 142, 100, 2490, 300, None, 0,
            "https://images.nvidia.com/content/Solutions/data-center/vgpu-L40-datasheet.pdf (dense: half its figures "
            "with sparsity); " + _ADA_WP, r"\bL40\b"),
    GpuSpec("RTX 4090", "Ada Lovelace", 2022, 165.2, 165.2, 82.6, 82.6, 24, 1008, 72, 128, 100, 2520, 450, None, 0,
            _ADA_WP + " (appendix table: GeForce rates with fp32 accumulate are half the fp16-accumulate ones)",
            r"RTX 4090"),
    GpuSpec("L4", "Ada Lovelace", 2023, 121.0, 121.0, 60.0, 30.3, 24, 300, 48, 58, 100, 2040, 72, None, 0,
            "https://resources.nvidia.com/en-us-data-center-overview/l4-gpu-datasheet; " + _ADA_WP, r"\bL4\b"),
    GpuSpec("H100 SXM", "Hopper", 2022, 989.4, 989.4, 494.7, 66.9, 80, 3350, 50, 132, 228, 1980, 700, 900, 7,
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet; " + _HOPPER_WP,
            r"H100 80GB HBM3|H100 SXM"),
    GpuSpec("H100 PCIe", "Hopper", 2022, 756.0, 756.0, 378.0, 51.2, 80, 2000, 50, 114, 228, 1755, 350, 600, 7,
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet "
            "(NVLink through a bridge); " + _HOPPER_WP, r"H100 PCIe"),
    GpuSpec("H100 NVL", "Hopper", 2023, 835.5, 835.5, 417.5, 60.0, 94, 3900, 50, 132, 228, 1785, 400, 600, 7,
            "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet (H100 NVL column; "
            "dense: half its figures with sparsity; NVLink through a bridge, two cards); " + _HOPPER_WP,
            r"H100 NVL"),
    GpuSpec("H200", "Hopper", 2024, 989.4, 989.4, 494.7, 66.9, 141, 4800, 60, 132, 228, 1980, 700, 900, 7,
            "https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446 (SXM: rates as H100 SXM); "
            "SMs, shared memory and clock from " + _HOPPER_WP + " (the datasheet omits them); L2: 60 MiB, as the "
            "driver reports it (cudaDevAttrL2CacheSize, results/h200/device.json; NVIDIA publishes no figure)",
            r"(?<!G)H200(?!\s*NVL)"),
)


# PCIe x16, one direction, GB/s: 16 resp. 32 GT/s a lane x 16 lanes x 128/130 encoding / 8 bits
# (PCI Express Base Specification 4.0 and 5.0, PCI-SIG). The links between GPUs without NVLink.
PCIE_X16_GBPS = {"PCIe 4.0 x16": 31.5, "PCIe 5.0 x16": 63.0}


# Dense 16-bit tensor-core FLOPs one SM does per clock (an FMA counts 2): the Ampere SM does 1,024 FMA a clock
# (256 per tensor core, 4 tensor cores: _AMPERE_WP), the Hopper SM twice the Ampere SM's rate clock for clock
# (_HOPPER_WP, "2x the MMA rates of the A100 SM"). The datasheet peak is SMs x this x the clock it assumes.
TENSOR_FLOP_PER_CLOCK_PER_SM = {"Ampere": 2048, "Hopper": 4096}

# Base-2 exponentials (exp2f, the MUFU.EX2 instruction) one SM does per clock: the CUDA C++ Programming Guide's
# table of arithmetic-instruction throughput gives 16 for compute capabilities 8.0 to 9.0
# (https://docs.nvidia.com/cuda/cuda-c-programming-guide/#arithmetic-instructions). At the H100's clock that is
# FlashAttention-3's "3.9 TFLOPS of special functions" beside 989 of matmul (Shah et al. 2024, arXiv:2407.08608).
EXP2_PER_CLOCK_PER_SM = {"Ampere": 16, "Hopper": 16}


# The memory a card shows programs (nvidia-smi's total, MiB): less than the datasheet's GB where ECC or the driver
# keep some. From h2oGPT's benchmark table, which prints each GPU's nvidia-smi memory
# (https://github.com/h2oai/h2ogpt/blob/a65122797d9cda842b57cf73689536571e3d6725/benchmarks/perf.md; the rows are in
# results/external/h2ogpt_generate.json); the A100 40GB's from an nvidia-smi table under driver 580.126.09, the
# course's driver family (https://github.com/bottlerocket-os/bottlerocket-core-kit/pull/834), and Modal's list of
# nvidia-smi totals (https://github.com/modal-labs/modal-client/pull/2797). Drivers of 2021 (470.82) showed the
# A100 40GB 40,536 MiB (https://github.com/nanopool/phoenix-miner/issues/17): the figure moves with the driver.
VISIBLE_MEMORY_MIB = {"RTX 6000 Ada": 49140, "RTX A6000": 46068, "A100 80GB SXM": 81920, "A100 40GB SXM": 40960}


def tensor_clock_mhz(spec: GpuSpec) -> float | None:
    """The SM clock the datasheet's dense 16-bit tensor rate assumes: peak / (SMs x FLOP per clock per SM);
    None for an architecture without a figure in TENSOR_FLOP_PER_CLOCK_PER_SM."""
    per_sm = TENSOR_FLOP_PER_CLOCK_PER_SM.get(spec.architecture)
    return None if per_sm is None else spec.tensor_tflops * 1e12 / (spec.sms * per_sm) / 1e6


def lookup(device_name: str) -> GpuSpec | None:
    """The datasheet row for a device name as ``torch.cuda.get_device_name()`` reports it, or None."""
    if not isinstance(device_name, str) or not device_name.strip():
        raise ValueError(f"device_name must be a non-empty string, got {device_name!r}")
    for spec in SPECS:
        if re.search(spec.pattern, device_name, flags=re.IGNORECASE):
            return spec
    return None


def by_name(name: str) -> GpuSpec:
    """The row whose short name is ``name`` (e.g. "A100 40GB SXM"); KeyError lists the known names."""
    for spec in SPECS:
        if spec.name.lower() == name.lower():
            return spec
    raise KeyError(f"no spec named {name!r}; known: {', '.join(s.name for s in SPECS)}")


# The memory caps (GiB) under which one GPU stands in for the seed's two cards (notebooks 06 and 09);
# None: the whole card.
CAPS: dict[float | None, str] = {None: "whole card", 40: "A100 40GB", 48: "RTX 6000 Ada 48GB"}
