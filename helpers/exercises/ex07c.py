"""Exercise of appendix 07c (the QLoRA step compared): how much of the stock step's kernel time its eager
attention takes, the part the course's FlashAttention replaces."""
from __future__ import annotations

from .. import results
from .checks import NumberCheck


def _attention_share() -> tuple[float, str]:
    run = results.reference("qlora_pacing")
    batch = max(r["batch_size"] for r in run.records)
    stock = next(r for r in run.records if r["variant"] == "stock" and r["batch_size"] == batch)
    share = 100 * stock["attention ms"] / stock["kernel_ms"]
    return share, (f"results/{run.path.parent.name}/qlora_pacing.json ({run.describe()}): the stock step at batch "
                   f"{batch}, {stock['attention ms']:.0f} ms of attention kernels in {stock['kernel_ms']:.0f} ms of "
                   f"kernels: {share:.0f}%")


ATTENTION_SHARE = NumberCheck("07c.1", "the % of the stock 7B QLoRA step's kernel time in attention, on the "
                              "reference H100 at the loss curve's batch", _attention_share, tolerance=10.0,
                              relative=False, unit="%")

CHECKS = (ATTENTION_SHARE,)
