"""The SASS of a compiled Triton kernel, read without a GPU: the opcode mix of its main loop.

Triton bundles ``nvdisasm``; a kernel compiled for an ``sm_<arch>`` target (``triton.compile`` with a
``GPUTarget``, no driver needed) is disassembled and its longest loop (the body between a label and the last
branch back to it) counted by opcode. Per unit of work (an element, a weight) those counts are what the SMs
must issue, so they set a ceiling on speed before memory does.
"""
from __future__ import annotations

import collections
import os
import re
import subprocess
import tempfile

import triton

_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")
# opcodes by the pipe that runs them on Hopper: fp32 arithmetic; integer and logic (a warp instruction every
# other clock: the nf4 lookups' limit). IMAD runs on the fp32 pipe's multiply-add units, counted apart.
FP32_PIPE = ("FFMA", "FMUL", "FADD", "FSETP", "FSEL", "FMNMX")
INTEGER_PIPE = ("PRMT", "LOP3", "SHF", "LEA", "IADD3", "ISETP", "SEL", "MOV", "IMNMX", "VIADD", "PLOP3")


def loop_mix(cubin: bytes) -> collections.Counter:
    """Opcode counts of the longest loop (the body between a label and the last branch back to it)."""
    nvdisasm = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "nvdisasm")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([nvdisasm, "-c", f.name], capture_output=True, text=True, check=True).stdout
    lines = [line for line in sass.splitlines() if _INSTRUCTION.match(line) or re.match(r"^\s*\.L\w+:", line)]
    labels, body = {}, []
    for i, line in enumerate(lines):
        if m := re.match(r"^\s*(\.L\w+):", line):
            labels[m.group(1)] = i
        target = m.group(1) if (m := re.search(r"BRA\s+`?\(?(\.L\w+)", line)) else None
        if target in labels and i - labels[target] > len(body):
            body = lines[labels[target]:i + 1]
    return collections.Counter(m.group(1) for line in body if (m := _INSTRUCTION.match(line)))
