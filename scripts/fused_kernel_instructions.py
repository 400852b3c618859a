"""The fused bias + GELU + LayerNorm forward's instruction mix per element, from its SASS, without a GPU.

    python scripts/fused_kernel_instructions.py [--arch 90] [--ns 1024 2048 4096 8192] [--gelu erf_exp2]

Compiles the forward with the launch table's settings for each dtype and N for an sm_<arch> target (Triton's
bundled ptxas and nvdisasm; no driver needed), finds the row-block loop (the longest backward branch) and
counts its instructions per element of the tile. Set against the issue budget: an SM issues four warp
instructions a clock (128 thread instructions), so at copy bandwidth B [bytes/clock/SM] and b bytes moved per
element a kernel may spend 128 b / B instructions per element before issue, not memory, sets its pace.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile real kernels, also on a machine without a GPU
import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from helpers.kernels import fused_bias_gelu_layernorm as K  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FP32_PIPE = ("FFMA", "FMUL", "FADD", "FSETP", "FSEL", "FMNMX")
_INSTRUCTION = re.compile(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)")


def compile_forward(n: int, dtype: torch.dtype, arch: int, gelu: str = "auto"):
    """The forward as the launch table would launch it for rows of width ``n`` (affine; ``gelu`` as in
    :func:`~helpers.kernels.fused_bias_gelu_layernorm.forward`)."""
    cfg = K.forward_config(n, dtype)
    ptr = f"*{ {torch.float32: 'fp32', torch.bfloat16: 'bf16'}[dtype] }"
    signature = {"X": ptr, "B": ptr, "W": ptr, "LB": ptr, "Y": ptr, "MEAN": "*fp32", "RSTD": "*fp32",
                 "M": "i32", "N": "i32", "eps": "fp32"}
    mode = K.GELU_MODES[K.AUTO_GELU[dtype] if gelu == "auto" else gelu]
    constants = {"BLOCK_N": cfg.block_n, "ROWS": cfg.rows, "SINGLE": cfg.block_n >= n, "GELU": mode,
                 "LAYERNORM": True, "HAS_W": True, "HAS_LB": True,
                 "EVEN_N": cfg.block_n == n, "FAST": True, "PREFETCH": cfg.prefetch, "STAGES": cfg.stages}
    signature |= dict.fromkeys(constants, "constexpr")
    aligned = {(i,): [["tt.divisibility", 16]] for i in (*range(7), 8)}  # pointers and N, as Triton specialises them
    kernel = triton.compile(ASTSource(K._forward_kernel, signature, constants, aligned),
                            target=GPUTarget("cuda", arch, 32), options={"num_warps": cfg.num_warps})
    return kernel, cfg


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--ns", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--gelu", default="auto", choices=["auto", *K.GELU_MODES])
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_{args.arch}, GELU {args.gelu}; per element of the loop's tile:")
    for dname, dtype in DTYPES.items():
        for n in args.ns:
            kernel, cfg = compile_forward(n, dtype, args.arch, args.gelu)
            mix = loop_mix(kernel.asm["cubin"])
            per_thread = cfg.rows * cfg.block_n / (32 * cfg.num_warps)
            fp32 = sum(mix[op] for op in FP32_PIPE)
            print(f"{dname} N={n:5d} ({cfg.rows} rows, {cfg.num_warps} warps): {sum(mix.values()) / per_thread:5.1f} "
                  f"instructions, {fp32 / per_thread:4.1f} on the fp32 pipe, {mix['MUFU'] / per_thread:4.2f} MUFU; "
                  f"most: {', '.join(f'{op} {c / per_thread:.1f}' for op, c in mix.most_common(6))}")


if __name__ == "__main__":
    main()
