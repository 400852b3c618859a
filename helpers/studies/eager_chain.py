"""The naive ``x + bias -> GELU -> LayerNorm`` chain in eager PyTorch, what each of its kernels must
move through memory (notebooks 03 and 04)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bench import peak_memory_bytes as peak_extra_memory  # noqa: F401  (notebook 03 calls it by this name)
from ..bench import profile_kernels  # noqa: F401  (notebook 03 calls it from here)
from ..results import Result
from .roofline import GELU_FLOPS, LAYERNORM_FLOPS

# Which forward op a profiled kernel (or, on the CPU, aten operator) belongs to: the first op one of whose
# fragments is in its name, lower-cased with underscores dropped. LayerNorm's kernels are
# vectorized_layer_norm_kernel, or RowwiseMoments + LayerNormForward on its unvectorised path.
KERNEL_OPS = (("layer_norm", ("layernorm", "rowwisemoments")), ("gelu", ("gelu",)), ("add", ("add",)))


def eager_chain(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None = None,
                ln_bias: torch.Tensor | None = None, eps: float = 1e-5, approximate: str = "none") -> torch.Tensor:
    """``LayerNorm(GELU(x + bias))`` over the last dimension, as three eager PyTorch kernels."""
    return F.layer_norm(F.gelu(x + bias, approximate=approximate), (x.shape[-1],), weight, ln_bias, eps)


def reference64(x: torch.Tensor, bias: torch.Tensor, weight: torch.Tensor | None = None,
                ln_bias: torch.Tensor | None = None, eps: float = 1e-5, approximate: str = "none") -> torch.Tensor:
    """:func:`eager_chain` in float64 on the CPU: the reference every check compares against."""
    def up(t):
        return None if t is None else t.detach().to("cpu", torch.float64)
    return eager_chain(up(x), up(bias), up(weight), up(ln_bias), eps, approximate)


def _check_sizes(m: int, n: int, elem: int) -> None:
    if m < 0 or n < 1 or elem not in (2, 4, 8):
        raise ValueError(f"need m >= 0, n >= 1 and an element size of 2, 4 or 8 bytes; got {m}, {n}, {elem}")


def eager_forward_bytes(m: int, n: int, elem: int) -> dict[str, int]:
    """The bytes each eager forward kernel must move, at least (each input read once, each output
    written once): ``add`` reads x and bias, writes x + bias; ``gelu`` reads and writes a tensor;
    ``layer_norm`` reads and writes a tensor, reads weight and bias, writes mean and rstd (fp32)."""
    _check_sizes(m, n, elem)
    t = m * n * elem
    return {"add": 2 * t + n * elem, "gelu": 2 * t, "layer_norm": 2 * t + 2 * n * elem + 2 * m * 4}


def eager_backward_bytes(m: int, n: int, elem: int) -> dict[str, int]:
    """The least bytes of each eager backward kernel. ``layer_norm_backward`` is two kernels: one reads dy,
    its input, the weight and the statistics and writes dx; a second re-reads dy and the input (and the
    statistics) to sum the weight and bias gradients over rows. ``gelu_backward`` reads the gradient and its
    input, writes a gradient; ``bias_grad`` sums the gradient over rows (one read)."""
    _check_sizes(m, n, elem)
    t, stats = m * n * elem, 2 * m * 4
    dx = 3 * t + n * elem + stats
    weight_grads = 2 * t + stats + 2 * n * elem
    return {"layer_norm_backward": dx + weight_grads, "gelu_backward": 3 * t, "bias_grad": t + n * elem}


def eager_forward_flops(m: int, n: int) -> dict[str, int]:
    """FLOPs of each eager forward kernel by notebook 02's count (``helpers.studies.roofline``): the add 1 per
    element, the GELU ``GELU_FLOPS``, the LayerNorm ``LAYERNORM_FLOPS``."""
    _check_sizes(m, n, 2)
    return {"add": m * n, "gelu": GELU_FLOPS * m * n, "layer_norm": LAYERNORM_FLOPS * m * n}


def kernel_op(name: str) -> str | None:
    """The forward op (``add``, ``gelu``, ``layer_norm``) that a profiled kernel's name belongs to, or None."""
    key = name.lower().replace("_", "")
    return next((op for op, fragments in KERNEL_OPS if any(f in key for f in fragments)), None)


def profiled_ms(rows: list[dict]) -> dict[str, float]:
    """Each forward op's time per call of the chain from :func:`profile_kernels` rows (device time of its
    kernels on a GPU, CPU time of its operators on the CPU), in ms."""
    ms: dict[str, float] = {}
    for r in rows:
        op = kernel_op(r["name"])
        if op is not None:
            ms[op] = ms.get(op, 0.0) + r["us_per_call"] * r["calls"] / 1e3
    return ms


def shares_of_copy(run: Result) -> dict[tuple[str, str], float]:
    """Each timed record of a ``naive_chain`` run as % of that run's copy ceiling, by (pass, op): the
    reference GPU's column beside a learner's own table in notebook 03."""
    return {(r["pass"], r["op"]): 100 * r["gbps"] / r["copy_gbps"] for r in run.records
            if r.get("op") and r.get("gbps") and r.get("copy_gbps")}


def fused_forward_bytes(m: int, n: int, elem: int) -> int:
    """One fused forward pass: read x, write y, read the three parameter vectors, write mean and rstd."""
    _check_sizes(m, n, elem)
    return 2 * m * n * elem + 3 * n * elem + 2 * m * 4


def fused_backward_bytes(m: int, n: int, elem: int) -> int:
    """One fused backward pass: read x and dy, write dx, read mean/rstd and parameters, write three gradients."""
    _check_sizes(m, n, elem)
    return 3 * m * n * elem + 2 * m * 4 + 5 * n * elem
