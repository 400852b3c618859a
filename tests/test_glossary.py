"""notebooks/GLOSSARY.md defines the course's terms, and every link to it from a notebook or the README lands."""
import json
import re

from helpers.results import REPO_ROOT

GLOSSARY = REPO_ROOT / "notebooks" / "GLOSSARY.md"
REQUIRED = ("warp", "program", "CTA", "thread block", "SM", "coalesced access", "occupancy", "register",
            "shared memory", "SRAM", "L2", "HBM", "bandwidth", "arithmetic intensity", "roofline", "ridge point",
            "memory-bound", "compute-bound", "kernel launch", "launch overhead", "CUDA graph", "kernel fusion", "ulp",
            "MUFU", "libdevice", "minimax", "erf", "GELU", "LayerNorm", "RMSNorm", "TMA", "warp specialisation",
            "tensor core", "bf16", "fp16", "fp32", "online softmax", "FlashAttention", "KV cache", "paged attention",
            "nf4", "double quantisation", "QLoRA", "LoRA", "gradient checkpointing", "FSDP", "DDP", "all-reduce",
            "NVLink", "autotuning", "Triton interpreter", "torch compile", "Inductor", "SDPA", "cuDNN attention",
            "nbval", "smoke scale", "full scale")


def anchors() -> set[str]:
    return {line[3:].strip().lower().replace(" ", "-") for line in GLOSSARY.read_text().splitlines()
            if line.startswith("## ")}


def test_every_required_term_has_a_heading():
    missing = [t for t in REQUIRED if t.lower().replace(" ", "-") not in anchors()]
    assert not missing, missing


def test_every_link_into_the_glossary_lands_on_a_heading():
    link = re.compile(r"GLOSSARY\.md#([^)\s]+)\)")
    texts = {p.name: "".join("".join(c["source"]) for c in json.loads(p.read_text())["cells"])
             for p in [*REPO_ROOT.glob("notebooks/*.ipynb"), *REPO_ROOT.glob("notebooks/appendix/*.ipynb")]}
    texts["README.md"] = (REPO_ROOT / "README.md").read_text()
    texts["GLOSSARY.md"] = GLOSSARY.read_text().replace("](#", "](GLOSSARY.md#")
    broken = {name: sorted(set(link.findall(text)) - anchors()) for name, text in texts.items()}
    assert not {k: v for k, v in broken.items() if v}, broken
