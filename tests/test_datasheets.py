import pytest

from helpers import datasheets, results

REQUIRED = ["V100 SXM2", "A100 40GB SXM", "A100 40GB PCIe", "A100 80GB SXM", "A10", "RTX A6000", "RTX 6000 Ada",
            "L40", "L40S", "RTX 4090", "L4", "T4", "H100 SXM", "H100 NVL", "H200"]


@pytest.mark.parametrize("name", REQUIRED)
def test_required_cards_have_complete_cited_rows(name):
    spec = datasheets.by_name(name)
    assert spec.source.startswith("http")
    for field in ("fp16_tflops", "fp32_tflops", "memory_gb", "bandwidth_gbps", "l2_mb", "sms",
                  "smem_per_sm_kb", "boost_mhz", "tdp_w"):
        assert getattr(spec, field) > 0, field
    if spec.bf16_tflops is not None:
        assert spec.bf16_tflops <= spec.fp16_tflops
        assert spec.tf32_tflops < spec.bf16_tflops


@pytest.mark.parametrize("device_name,expected", [
    ("NVIDIA H200", "H200"),
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA RTX 6000 Ada Generation", "RTX 6000 Ada"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA L40", "L40"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA RTX A6000", "RTX A6000"),
    ("NVIDIA H100 NVL", "H100 NVL"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA L4", "L4"),
    ("Tesla T4", "T4"),
    ("Tesla V100-SXM2-32GB", "V100 SXM2"),
])
def test_lookup_by_driver_name(device_name, expected):
    assert datasheets.lookup(device_name).name == expected


def test_lookup_does_not_confuse_similar_names():
    assert datasheets.lookup("NVIDIA H200 NVL") is None  # a different power/clock envelope: not in the table
    assert datasheets.lookup("NVIDIA GH200 480GB") is None  # the Grace Hopper superchip: another memory and TDP
    assert datasheets.lookup("NVIDIA A10G") is None  # AWS's variant: other SMs and tensor rates, no public datasheet
    assert datasheets.lookup("NVIDIA A100-SXM4-40GB").name == "A100 40GB SXM"  # not the A10


def test_h200_l2_is_what_its_driver_reports():
    saved = results.load("device", gpu="h200").records[0]
    assert datasheets.by_name("H200").l2_mb == saved["l2_bytes"] / 2**20


def test_lookup_rejects_bad_input():
    with pytest.raises(ValueError):
        datasheets.lookup("")
    with pytest.raises(KeyError, match="known"):
        datasheets.by_name("GTX 480")


def test_ridge_points_the_course_quotes():
    # notebook 02 compares these three: about 200, 380 and 206 FLOP/byte
    assert datasheets.by_name("A100 40GB SXM").ridge_flops_per_byte == pytest.approx(200, rel=0.02)
    assert datasheets.by_name("RTX 6000 Ada").ridge_flops_per_byte == pytest.approx(380, rel=0.02)
    assert datasheets.by_name("H200").ridge_flops_per_byte == pytest.approx(206, rel=0.02)


def test_seed_cards_facts():
    a100, ada = datasheets.by_name("A100 40GB SXM"), datasheets.by_name("RTX 6000 Ada")
    assert (a100.nvlink_gbps, a100.mig_slices, a100.tdp_w) == (600, 7, 400)
    assert (ada.nvlink_gbps, ada.mig_slices, ada.memory_gb, ada.tdp_w) == (None, 0, 48, 300)


def test_tensor_clock_is_the_datasheet_rate_over_sms_and_flop_per_clock():
    a100 = datasheets.by_name("A100 40GB SXM")
    assert datasheets.tensor_clock_mhz(a100) == pytest.approx(1410, rel=0.002)  # its boost
    h200 = datasheets.by_name("H200")
    assert datasheets.tensor_clock_mhz(h200) == pytest.approx(1830, rel=0.002)  # below its 1,980 MHz boost clock
    assert datasheets.tensor_clock_mhz(h200) < h200.boost_mhz
    assert datasheets.tensor_clock_mhz(datasheets.by_name("V100 SXM2")) is None  # no per-SM figure for Volta
