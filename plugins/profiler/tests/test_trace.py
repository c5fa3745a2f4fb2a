"""Kernel figures from a synthetic Kineto trace (the JSON torch.profiler exports)."""

from __future__ import annotations

import pytest

from falconet_profiler.trace import analyse, host_trace, is_tensor_core, kernel_kinds, top_kernels


class Trace:
    def __init__(self):
        self.events = []
        self.correlation = 0

    def span(self, cat, name, ts, dur, **extra):
        self.events.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **extra})

    def launch(self, host_ts, gpu_ts, dur, name, cat="kernel", stream=7):
        self.correlation += 1
        self.span(
            "cuda_runtime", "cudaLaunchKernel", host_ts, 5, args={"correlation": self.correlation}
        )
        self.span(cat, name, gpu_ts, dur, tid=stream, args={"correlation": self.correlation})


GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64"
ADD = "void at::native::vectorized_elementwise_kernel<4, add>"


@pytest.fixture
def trace():
    """What the callback traces: the synchronised half, here two batches of 1000 µs."""
    t = Trace()
    for batch, index in ((0, 5), (1000, 6)):
        t.span("user_annotation", f"falconet/batch {index} synced", batch, 1000)
        t.span("user_annotation", "falconet/forward", batch, 500)
        t.span("user_annotation", "falconet/backward", batch + 500, 500)
        t.span("cuda_runtime", "cudaDeviceSynchronize", batch + 499, 1)  # the clock's own
        t.launch(batch + 10, batch + 100, 300, GEMM)  # forward
        t.launch(batch + 40, batch + 400, 100, "Memcpy HtoD (Pageable -> Device)", "gpu_memcpy")
        t.launch(batch + 510, batch + 520, 50, ADD)  # backward
        t.launch(batch + 530, batch + 570, 50, ADD)
    t.span("gpu_user_annotation", "falconet/batch 5 synced", 0, 1000)  # ignored
    t.launch(-50, -40, 30, ADD)  # before the window: not counted
    t.launch(1990, 2010, 20, ADD)  # launched in batch 6's backward, runs just after it
    t.span("cuda_runtime", "cudaStreamSynchronize", 800, 20)
    t.span("cuda_runtime", "cudaStreamSynchronize", 1800, 20)
    t.span("cuda_runtime", "cudaMalloc", 1200, 40)
    return {"traceEvents": t.events}


def test_kernel_figures_per_traced_batch(trace):
    gpu = analyse(trace)
    assert gpu["traced_batches"] == 2
    assert gpu["kernels_per_step"] == pytest.approx(3.5)  # 7 kernels over 2 batches
    assert gpu["mean_kernel_us"] == pytest.approx((2 * 400 + 20) / 7)
    assert gpu["kernel_ms_per_step"] == pytest.approx(0.41)
    # GPU busy per batch: [100, 500] (GEMM, copy) and [520, 620] (adds) = 500 µs; batch 6
    # also owns the late add it launched: (500 + 520) / 2
    assert gpu["gpu_ms_per_step"] == pytest.approx(0.51)
    assert gpu["memcpy_per_step"] == pytest.approx(1.0)
    assert gpu["host_syncs_per_step"] == pytest.approx(1.0)  # the clock's are left out
    assert gpu["sync_calls"] == {"cudaStreamSynchronize": 2}
    assert gpu["cuda_malloc_per_step"] == pytest.approx(0.5)
    assert gpu["launches_per_step"] == pytest.approx(4.5)  # 9 launches in the two batches


def test_kernels_by_time_tensor_cores_and_phases(trace):
    gpu = analyse(trace)
    top = gpu["top_kernels"]
    assert [row["name"] for row in top] == [GEMM, ADD]
    assert top[0]["tensor_core"] and not top[1]["tensor_core"]
    assert top[0]["calls_per_step"] == pytest.approx(1.0)
    assert top[0]["ms_per_step"] == pytest.approx(0.3)
    assert gpu["tensor_core_share"] == pytest.approx(600 / (600 + 220))
    assert gpu["phase_gpu_ms"] == {
        "forward": pytest.approx(0.4),  # GEMM and copy
        "backward": pytest.approx(0.11),  # the adds
    }


def test_kernel_kinds_sum_every_kernel_not_only_the_top_ones():
    """61 kernels of a few µs each outweigh one of 100 µs, and are not in the top 50."""
    kernels = [{"name": "sm90_xmma_wgrad_f16f16_nhwc", "dur": 100.0}] + [
        {"name": f"triton_red_fused__native_batch_norm_legit_functional_{i}", "dur": 4.0}
        for i in range(61)
    ]
    assert len(top_kernels(kernels, 2)) == 50
    kinds = kernel_kinds(kernels, 2)
    assert [k["what"] for k in kinds] == [
        "Inductor BatchNorm reduction",
        "convolution weight gradient (fp16)",
    ]
    assert kinds[0]["calls_per_step"] == pytest.approx(30.5)
    assert kinds[0]["ms_per_step"] == pytest.approx(61 * 4 / 1000 / 2)
    assert kinds[0]["mean_us"] == pytest.approx(4.0) and not kinds[0]["tensor_core"]
    assert kinds[1]["tensor_core"]
    assert sum(k["share"] for k in kinds) == pytest.approx(1.0)


def test_lanes_hold_the_first_traced_batches(trace):
    lanes = analyse(trace)["lanes"]
    assert lanes["lanes"] == ["kernels, stream 7", "copies, stream 7"]
    assert [b[2] for b in lanes["batches"]] == [5, 6]
    assert len(lanes["events"]) == 9 and lanes["events"][0][1] == 100  # µs from batch 5's start
    assert lanes["names"][lanes["events"][0][3]] == GEMM


def test_a_trace_without_gpu_events_gives_nothing():
    cpu = {
        "traceEvents": [
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "falconet/batch 0 unsynced",
                "ts": 0,
                "dur": 10,
            }
        ]
    }
    assert analyse(cpu) is None
    assert analyse({"traceEvents": []}) is None


@pytest.mark.parametrize(
    ("name", "tensor"),
    [
        ("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_nn", True),
        ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32", True),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", True),
        ("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc", True),
        ("implicit_convolve_sgemm", False),
        ("triton_poi_fused_add_mul_0", False),
    ],
)
def test_tensor_core_names(name, tensor):
    assert is_tensor_core(name) is tensor


def test_host_trace_is_a_chrome_trace_of_the_phases():
    batches = [
        {
            "index": 2,
            "part": "unsynced",
            "epoch": 0,
            "images": 8,
            "start_ms": 1.0,
            "ms": 3.0,
            "phases": [
                {"name": "data", "start_ms": 0.0, "ms": 1.0},
                {"name": "forward", "start_ms": 1.0, "ms": 2.0},
            ],
        }
    ]
    trace = host_trace(batches)
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"]) for e in spans] == [
        ("falconet/batch 2 unsynced", 1000.0, 3000.0),
        ("falconet/data", 1000.0, 1000.0),
        ("falconet/forward", 2000.0, 2000.0),
    ]
