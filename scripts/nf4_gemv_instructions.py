"""The nf4 matrix-vector kernel's instructions per weight, from its SASS, without a GPU.

    python scripts/nf4_gemv_instructions.py [--arch 90] [--tiles 16x2048x4 32x1024x8]

Compiles the one-row kernel (bf16 x, nested statistics, one weight) for an sm_<arch> target with each tile
(block_n x block_k x warps, one chunk loaded ahead) and each place for the 16-entry table (``Config.table``:
byte planes in registers, or pairs in shared memory), then counts the main loop's instructions per weight
(``helpers.sass.loop_mix``) by pipe, and the registers a thread. The budget they meet: to keep up with the
H200's HBM an SM must retire about 40 weights a clock, while its integer pipe issues 64 thread-instructions a
clock and all its pipes together 128.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

os.environ["TRITON_INTERPRET"] = "0"  # compile real kernels, also on a machine without a GPU
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from helpers.kernels import nf4_gemv as K  # noqa: E402
from helpers.sass import FP32_PIPE, INTEGER_PIPE, loop_mix  # noqa: E402

SIZES = ("M", "N", "N_0", "N_1", "K", "stride_xm", "chunks_per_split")


def compile_one_row(cfg: K.Config, arch: int):
    """The kernel as ``nf4_matmul`` launches it for one bf16 row of x against one nested-statistics weight with
    blocksize 64 (Llama's), with ``cfg``'s tile and table."""
    names = K._nf4_matmul_kernel.arg_names
    pointers = {"X": "*bf16", "GATE": "*bf16", "BIAS": "*bf16", "OUT": "*bf16", "CODE": "*fp32", "CODE2": "*fp32"}
    signature = {a: "i32" if a in SIZES else pointers.get(a, "*i32" if a.startswith("W") else
                                                        "*u8" if a.startswith("ABSMAX") and "2" not in a else "*fp32")
                 for a in names}
    constants = {"QB": 64, "NESTED_QB": 256, "BLOCK_M": 1, "BLOCK_N": cfg.block_n, "BLOCK_K": cfg.block_k,
                 "NESTED": True, "HAS_BIAS": False, "PARTIAL": cfg.split_k > 1, "WEIGHTS": 1, "ASM": True,
                 "DOT_FP32": False, "PRECISION": "tf32", "STAGES": cfg.num_stages, "PREFETCH": cfg.prefetch,
                 "SWIGLU": False, "SHARED": cfg.table == "shared"}
    signature |= dict.fromkeys(constants, "constexpr")
    # pointers, K and the row stride as Triton specialises them (multiples of 16)
    aligned = {(names.index(a),): [["tt.divisibility", 16]] for a in names
               if signature[a].startswith("*") or a in ("K", "stride_xm")}
    return triton.compile(ASTSource(K._nf4_matmul_kernel, signature, constants, aligned),
                          target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": cfg.num_warps, "num_stages": cfg.num_stages})


def registers(cubin: bytes) -> int:
    """Registers a thread, from ``cuobjdump -res-usage``."""
    cuobjdump = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([cuobjdump, "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    return int(re.search(r"REG:(\d+)", usage).group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", type=int, default=90)
    parser.add_argument("--tiles", nargs="+", default=["16x2048x4", "32x1024x8"],
                        help="block_n x block_k x num_warps")
    args = parser.parse_args()
    print(f"triton {triton.__version__}, sm_{args.arch}, one bf16 row of x; per weight of the loop's tile:")
    for tile in args.tiles:
        block_n, block_k, warps = map(int, tile.split("x"))
        for table in K.TABLES:
            cfg = K.Config(block_n, block_k, warps, prefetch=True, table=table)
            kernel = compile_one_row(cfg, args.arch)
            mix = loop_mix(kernel.asm["cubin"])
            per_thread = block_n * block_k / (32 * warps)
            share = {name: sum(mix[op] for op in ops) / per_thread
                     for name, ops in (("integer", INTEGER_PIPE), ("fp32", FP32_PIPE), ("IMAD", ("IMAD",)),
                                       ("shared loads", ("LDS",)))}
            print(f"{tile:>10} table in {table:9}: {sum(mix.values()) / per_thread:4.2f} instructions, "
                  + ", ".join(f"{v:4.2f} {k}" for k, v in share.items())
                  + f"; {registers(kernel.asm['cubin'])} registers; most: "
                  + ", ".join(f"{op} {c / per_thread:.2f}" for op, c in mix.most_common(5)))


if __name__ == "__main__":
    main()
