"""helpers.finetune.launch_replay: a step's launch timeline, replayed with scaled kernels (the timeline itself needs a
GPU's profiler; these build it by hand and from a hand-written Kineto trace)."""
import pytest

from helpers.finetune.launch_replay import Launch, Sync, Timeline, from_trace

# device-bound: the host issues both kernels long before the device finishes the first
DEVICE_BOUND = Timeline((Launch(0, 5, 100, "gemm"), Launch(10, 105, 100, "elementwise")), (Sync(20, 210),))
# host-bound: the device finishes each kernel before the host issues the next
HOST_BOUND = Timeline((Launch(0, 5, 10, "gemm"), Launch(100, 105, 10, "elementwise")), (Sync(110, 120),))


@pytest.mark.parametrize("timeline", [DEVICE_BOUND, HOST_BOUND])
def test_unscaled_replay_gives_back_the_measured_step(timeline):
    assert timeline.replay(lambda name: 1.0) == pytest.approx(timeline.wall_us())


def test_a_device_bound_step_follows_its_kernels():
    assert DEVICE_BOUND.replay(lambda name: 2.0) == pytest.approx(5 + 400 + 5)  # latency, two kernels, sync's return
    assert DEVICE_BOUND.replay(lambda name: 0.5) == pytest.approx(5 + 100 + 5)


def test_a_host_bound_step_hides_most_of_a_slower_device():
    """Only the last kernel's extra time shows: the first one's hides behind the host issuing the second."""
    assert HOST_BOUND.replay(lambda name: 2.0) == pytest.approx(120 + 10)
    assert HOST_BOUND.replay(lambda name: 0.5) == pytest.approx(120 - 5)
    assert HOST_BOUND.replay(lambda name: 2.0 if name == "gemm" else 1.0) == pytest.approx(120)  # hidden entirely


def test_the_host_comes_back_later_from_a_sync_when_the_device_is_slower():
    """A sync mid-step (a loss read with .item()) delays every launch after it by the device's extra time."""
    timeline = Timeline((Launch(0, 5, 50, "a"), Launch(70, 75, 10, "b")), (Sync(10, 60), Sync(80, 90)))
    assert timeline.replay(lambda name: 1.0) == pytest.approx(90)
    # a: 5..105; the host returns at 110 (50 later); b issued at 120, starts 125, ends 135; the end sync: 140
    assert timeline.replay(lambda name: 2.0 if name == "a" else 1.0) == pytest.approx(140)


def test_host_issue_time_leaves_out_the_time_blocked():
    timeline = Timeline((Launch(0, 5, 50, "a"), Launch(70, 75, 10, "b")), (Sync(10, 60), Sync(80, 90)))
    assert timeline.host_issue_us() == pytest.approx(70 - 50)  # 70 us to the last launch, 50 of them blocked
    assert timeline.device_us() == 60 and timeline.wall_us() == 90
    assert DEVICE_BOUND.launch_latency_us() == 5


def test_a_timeline_needs_a_final_sync_after_the_device():
    with pytest.raises(ValueError, match="at least one launch"):
        Timeline((Launch(0, 5, 10, "a"),), ())
    with pytest.raises(ValueError, match="before the device finished"):
        Timeline((Launch(0, 5, 10, "a"),), (Sync(1, 12),))


def test_from_trace_joins_each_device_event_to_its_launch():
    trace = {"traceEvents": [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 1000, "dur": 4,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 1010, "dur": 4, "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "triton_norm", "ts": 1105, "dur": 10, "args": {"correlation": 8}},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 1005, "dur": 100, "args": {"correlation": 7}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 999, "dur": 6, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "ts": 1020, "dur": 100, "args": {}},
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 0, "args": {"correlation": 9}}]}
    timeline = from_trace(trace)
    assert [launch.name for launch in timeline.launches] == ["gemm", "triton_norm"]
    assert timeline.launches[1] == Launch(1010, 1105, 10, "triton_norm")
    assert timeline.syncs == (Sync(1020, 1120),)
    assert timeline.wall_us() == 120 and timeline.replay(lambda name: 1.0) == pytest.approx(120)


def test_a_record_round_trip_keeps_the_replay():
    from helpers.finetune.launch_replay import from_record, to_record

    timeline = Timeline((Launch(1000, 1005, 50, "gemm_bf16"), Launch(1070, 1075, 10, "vectorized_elementwise")),
                        (Sync(1010, 1060), Sync(1080, 1090)))
    record = to_record(timeline, name=lambda kernel: kernel.split("_")[0])
    assert record["launches"][0] == [0, 5, 50, "gemm"] and record["syncs"][-1] == [80, 90]
    assert record["wall_us"] == 90 and record["host_issue_us"] == 20 and record["launch_count"] == 2
    back = from_record(record)
    assert back.replay(lambda part: 2.0 if part == "gemm" else 1.0) == pytest.approx(140)


def test_events_saved_beside_the_results_file_come_back(tmp_path):
    from helpers.finetune.launch_replay import load_events, save_events, to_record

    timeline = Timeline((Launch(1000, 1005, 50, "gemm"),), (Sync(1010, 1060),))
    record = {"model": "7b", "batch_size": 4, **to_record(timeline)}
    save_events(tmp_path / "step_timeline.json", [record])
    back = load_events(tmp_path / "step_timeline.json")["7b:4"]
    assert back.wall_us() == timeline.wall_us() and back.replay(lambda name: 1.0) == pytest.approx(60)
