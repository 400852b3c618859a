"""Exercises of notebook 00 (set-up and the two ceilings): the clock behind the datasheet's FLOP/s, and the
share of the datasheet's bandwidth a copy reaches."""
from __future__ import annotations

from .. import results, datasheets
from .checks import NumberCheck


def _datasheet_clock() -> tuple[float, str]:
    h200 = datasheets.by_name("H200")
    per_sm = datasheets.TENSOR_FLOP_PER_CLOCK_PER_SM[h200.architecture]
    mhz = datasheets.tensor_clock_mhz(h200)
    return mhz, (f"datasheet (helpers.datasheets): {h200.tensor_tflops:g} TFLOP/s dense bf16 / ({h200.sms} SMs x "
                 f"{per_sm:,} FLOP per clock per SM) = {mhz:,.0f} MHz, below the {h200.boost_mhz:,} MHz boost clock: "
                 "the tensor-core rate is not quoted at the boost clock")


DATASHEET_CLOCK = NumberCheck(
    "00.1", "the SM clock (MHz) that the H200 datasheet's dense bf16 TFLOP/s assumes",
    _datasheet_clock, tolerance=0.02, relative=True, unit="MHz")


def _copy_share() -> tuple[float, str]:
    saved = results.reference("ceilings")
    copy = next(r for r in saved.records if r["what"] == "copy")
    datasheet = datasheets.lookup(saved.provenance["gpu"]).bandwidth_gbps
    share = 100 * copy["gbps"] / datasheet
    return share, (f"results/{saved.path.parent.name}/ceilings.json ({saved.describe()}): the copy of "
                   f"{copy['bytes'] / 2**30:g} GiB "
                   f"moved {copy['gbps']:,.0f} GB/s against the datasheet's {datasheet:,.0f} GB/s: {share:.1f}%")


COPY_SHARE = NumberCheck(
    "00.2", "the % of the datasheet's HBM bandwidth that the device copy reached on the reference H100",
    _copy_share, tolerance=5.0, relative=False, unit="%")

CHECKS = (DATASHEET_CLOCK, COPY_SHARE)
