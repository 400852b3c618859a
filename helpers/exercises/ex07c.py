"""Exercise of appendix 07c (the QLoRA step compared): how much of the stock step's device time the matrix
products take, the bound on what faster element-wise kernels can buy."""
from __future__ import annotations

from .. import results
from .checks import NumberCheck


def _matmul_share() -> tuple[float, str]:
    run = results.reference("qlora_pacing")
    batch = max(r["batch_size"] for r in run.records)
    stock = next(r for r in run.records if r["variant"] == "stock" and r["batch_size"] == batch)
    share = 100 * stock["matmul ms"] / stock["kernel_ms"]
    return share, (f"results/{run.path.parent.name}/qlora_pacing.json ({run.describe()}): the stock step at batch "
                   f"{batch}, {stock['matmul ms']:.0f} ms of matrix products in {stock['kernel_ms']:.0f} ms of "
                   f"kernels: {share:.0f}%")


MATMUL_SHARE = NumberCheck("07c.1", "the % of the stock 7B QLoRA step's kernel time in matrix products, on the "
                           "reference H100 at the loss curve's batch", _matmul_share, tolerance=10.0,
                           relative=False, unit="%")

CHECKS = (MATMUL_SHARE,)
