"""Every ``falconet profile`` command, run as the installed command in a subprocess."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_summary(falconet_cli, profiled_run: Path):
    done = falconet_cli("profile", "summary", str(profiled_run / "profile.json"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("profile: ") and "no GPU trace (device cpu)" in done.stdout
    assert "phases (synchronised, ms per batch): data" in done.stdout
    as_json = json.loads(falconet_cli("profile", "summary", "--json", str(profiled_run)).stdout)
    assert as_json["kind"] == "falconet-profile-summary" and as_json["gpu_trace"] is False


def test_summary_says_there_is_no_gpu_trace_whatever_the_verdict(
    falconet_cli, profiled_run: Path, tmp_path: Path
):
    """A CPU run whose step waited for data: the verdict is ``dataloader``, and the summary
    must still say that kernel figures were not measured."""
    doc = json.loads((profiled_run / "profile.json").read_text())
    doc["verdict"].update(
        name="dataloader", reason="the step waited for the next batch 54% of its time (>= 20%)"
    )
    assert doc["verdict"]["gpu_trace"] is False
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(doc))
    done = falconet_cli("profile", "summary", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("profile: dataloader: ")
    assert "no GPU trace (device cpu): kernel figures were not measured" in done.stdout


def test_phases(falconet_cli, profiled_run: Path):
    done = falconet_cli("profile", "phases", str(profiled_run / "profile.json"))
    assert done.returncode == 0, done.stderr
    rows = {line.split()[0] for line in done.stdout.splitlines()[1:]}
    assert {"data", "forward", "backward", "optimizer", "ema", "other", "step"} <= rows
    tables = json.loads(falconet_cli("profile", "phases", "--json", str(profiled_run)).stdout)
    assert tables["synced"]["phases"]["forward"]["ms_per_batch"] > 0


def test_kernels_without_a_gpu_trace(falconet_cli, profiled_run: Path):
    done = falconet_cli("profile", "kernels", "--top", "5", str(profiled_run / "profile.json"))
    assert done.returncode == 0 and "no GPU trace (device cpu)" in done.stdout
    rows = json.loads(falconet_cli("profile", "kernels", "--json", str(profiled_run)).stdout)
    assert rows == {"gpu_trace": False, "kernels": []}


def test_kernels_with_a_gpu_trace(falconet_cli, profiled_run: Path, tmp_path: Path):
    """The kernel table of a profile whose gpu section holds two kernels."""
    doc = json.loads((profiled_run / "profile.json").read_text())
    doc["gpu"] = {
        "top_kernels": [
            {
                "name": "sm90_xmma_gemm",
                "calls_per_step": 2.0,
                "ms_per_step": 1.5,
                "mean_us": 750.0,
                "share": 0.75,
                "tensor_core": True,
            },
            {
                "name": "elementwise_kernel",
                "calls_per_step": 10.0,
                "ms_per_step": 0.5,
                "mean_us": 50.0,
                "share": 0.25,
                "tensor_core": False,
            },
        ]
    }
    (tmp_path / "gpu.json").write_text(json.dumps(doc))
    done = falconet_cli("profile", "kernels", "--top", "1", str(tmp_path / "gpu.json"))
    lines = done.stdout.splitlines()
    assert len(lines) == 2 and "matrix product: sm90_xmma_gemm" in lines[1] and "yes" in lines[1]
    gpu_json = str(tmp_path / "gpu.json")
    rows = json.loads(falconet_cli("profile", "kernels", "--json", gpu_json).stdout)
    assert [k["name"] for k in rows["kernels"]] == ["sm90_xmma_gemm", "elementwise_kernel"]
    assert rows["kernels"][0]["what"] == "matrix product"


def test_kernels_by_what_they_do(falconet_cli, profiled_run: Path, tmp_path: Path):
    """``--by-what`` prints the profile's sums over every kernel, by kind."""
    doc = json.loads((profiled_run / "profile.json").read_text())
    doc["gpu"] = {
        "top_kernels": [],
        "kernel_kinds": [
            {"what": "Inductor BatchNorm reduction", "calls_per_step": 250.0,
             "ms_per_step": 1.4, "mean_us": 5.6, "share": 0.7, "tensor_core": False},
            {"what": "convolution forward (fp16)", "calls_per_step": 41.0,
             "ms_per_step": 0.6, "mean_us": 14.6, "share": 0.3, "tensor_core": True},
        ],
    }  # fmt: skip
    (tmp_path / "gpu.json").write_text(json.dumps(doc))
    args = ("profile", "kernels", "--by-what", str(tmp_path / "gpu.json"))
    text = falconet_cli(*args).stdout.splitlines()
    assert text[0].split() == ["ms/step", "calls/step", "mean", "µs", "share", "TC", "what"]
    assert text[1].split()[:5] == ["1.400", "250.0", "5.6", "70.0%", "no"]
    assert text[1].endswith("Inductor BatchNorm reduction") and len(text) == 3


def test_the_report_names_the_kinds_that_took_the_kernel_time(profiled_run: Path):
    """The report's kernel line: the three kinds with their ms a step; a profile written
    before the per-kind sums keeps its top three kernels' labels."""
    from falconet_profiler.report import format_report

    doc = json.loads((profiled_run / "profile.json").read_text())
    doc["evidence"]["kernel_kinds"] = [
        ["Inductor BatchNorm pointwise", 1.582],
        ["Inductor BatchNorm reduction", 1.278],
        ["convolution weight gradient (fp16)", 1.235],
    ]
    lines = format_report(doc).splitlines()
    assert (
        "  kernel time by kind (ms a step): Inductor BatchNorm pointwise 1.58, "
        "Inductor BatchNorm reduction 1.28, convolution weight gradient (fp16) 1.24"
    ) in lines
    doc["evidence"]["kernel_kinds"] = []
    doc["evidence"]["top_kernels"] = ["triton_red_fused__native_batch_norm_legit_functional_17"]
    assert "  top kernels: Inductor BatchNorm reduction" in format_report(doc).splitlines()


def test_kernels_by_what_from_an_older_profiles_timeline(
    falconet_cli, profiled_run: Path, tmp_path: Path
):
    """A profile without per-kind sums but with its timeline: every kernel of the timeline's
    batches, by kind, per batch (copies and memsets on their own lanes left out)."""
    doc = json.loads((profiled_run / "profile.json").read_text())
    doc["gpu"] = {"top_kernels": []}
    doc["lanes"] = {
        "origin_us": 0.0,
        "batches": [[0.0, 100.0, 5], [100.0, 200.0, 6]],
        "names": ["triton_red_fused__native_batch_norm_legit_functional_1", "Memcpy HtoD"],
        "lanes": ["kernels, stream 7", "copies, stream 7"],
        "events": [[0, 1.0, 4.0, 0], [0, 6.0, 4.0, 0], [0, 101.0, 4.0, 0], [1, 0.0, 50.0, 1]],
    }
    (tmp_path / "lanes.json").write_text(json.dumps(doc))
    text = falconet_cli("profile", "kernels", "--by-what", str(tmp_path / "lanes.json"))
    lines = text.stdout.splitlines()
    assert "every kernel of its timeline's 2 batches" in lines[0]
    assert lines[2].split()[:3] == ["0.006", "1.5", "4.0"] and len(lines) == 3
    assert lines[2].endswith("Inductor BatchNorm reduction")


def test_kernels_by_what_in_an_older_profile(falconet_cli, profiled_run: Path, tmp_path: Path):
    """A profile without per-kind sums: ``--by-what`` sums its top kernels of one kind (two
    copy variants become one row) and says that it covers only those."""
    doc = json.loads((profiled_run / "profile.json").read_text())
    copy = "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda<c10::Half>>"
    rows = [
        (copy + "(a)", 30.0, 0.6, False),
        ("sm90_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwc", 10.0, 0.8, True),
        (copy + "(b)", 10.0, 0.3, False),
    ]
    total = sum(ms for _, _, ms, _ in rows)
    doc["gpu"] = {
        "top_kernels": [
            {"name": name, "calls_per_step": calls, "ms_per_step": ms,
             "mean_us": 1000 * ms / calls, "share": ms / total, "tensor_core": tc}
            for name, calls, ms, tc in rows
        ]
    }  # fmt: skip
    (tmp_path / "gpu.json").write_text(json.dumps(doc))
    args = ("profile", "kernels", "--by-what", "--json", str(tmp_path / "gpu.json"))
    kinds = json.loads(falconet_cli(*args).stdout)["kernels"]
    assert [k["what"] for k in kinds] == ["copy (fp16)", "convolution forward (fp16)"]
    assert kinds[0]["kernels"] == 2 and kinds[0]["calls_per_step"] == 40.0
    assert kinds[0]["ms_per_step"] == pytest.approx(0.9)
    assert kinds[0]["mean_us"] == pytest.approx(22.5) and not kinds[0]["tensor_core"]
    text = falconet_cli(*[a for a in args if a != "--json"]).stdout.splitlines()
    assert "summed over its top 3 kernels only" in text[0]
    assert text[2].endswith("copy (fp16)") and len(text) == 4


def test_compare_counts_only_beyond_the_spread(falconet_cli, profiled_run: Path, tmp_path: Path):
    doc = json.loads((profiled_run / "profile.json").read_text())

    def variant(name: str, steps: list[float]) -> str:
        changed = json.loads(json.dumps(doc))
        mean = sum(steps) / len(steps)
        changed["trials"] = [{**doc["trials"][0], "step_ms": s} for s in steps]
        changed["aggregate"]["step_ms"] = {
            "mean": mean,
            "median": mean,
            "std": 1.0,
            "min": min(steps),
            "max": max(steps),
            "n": len(steps),
        }
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(changed))
        return str(path)

    a = variant("a", [100.0, 104.0, 102.0])
    overlapping = variant("b", [103.0, 107.0, 105.0])
    apart = variant("c", [60.0, 62.0, 61.0])
    same = json.loads(falconet_cli("profile", "compare", "--json", a, overlapping).stdout)
    row = next(r for r in same["figures"] if r["figure"] == "step_ms")
    assert row["spread_known"] and not row["counts"] and "step_ms" not in same["changed"]
    faster = json.loads(falconet_cli("profile", "compare", "--json", a, apart).stdout)
    row = next(r for r in faster["figures"] if r["figure"] == "step_ms")
    assert row["counts"] and row["relative"] == pytest.approx(-41 / 102)
    text = falconet_cli("profile", "compare", a, apart).stdout
    assert "step_ms" in text and "-40.2%" in text
    single = falconet_cli("profile", "compare", str(profiled_run), str(profiled_run))
    assert single.returncode == 0 and "1 trial: 5% floor" in single.stdout


def test_a_bad_file_exits_2(falconet_cli, tmp_path: Path):
    (tmp_path / "x.json").write_text("[]")
    done = falconet_cli("profile", "summary", str(tmp_path / "x.json"))
    assert done.returncode == 2 and "not a falconet profile" in done.stderr


def test_run_repeats_fresh_trials_and_combines_them(falconet_cli, run_keys, tmp_path: Path):
    keys = [f"{k}={v}" for k, v in run_keys.items() if k != "data"]
    done = falconet_cli(
        "profile",
        "run",
        run_keys["data"],
        "--model",
        "yolo-n",
        *keys,
        "epochs=2",
        "nbs=8",  # accumulate 1: the window is batches 0-1, inside epoch 1
        "profile_warmup=0",
        "profile_steps=2",
        f"project={tmp_path}",
        "name=twice",
        "--repeat",
        "2",
        "--json",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    folder = tmp_path / "twice"
    assert summary["profile"] == str(folder / "profile.json") and summary["trials"] == 2
    assert summary["aggregate"]["step_ms"]["n"] == 2
    assert done.stderr.count("trial ") >= 2
    combined = json.loads((folder / "profile.json").read_text())
    assert [t["run_dir"] for t in combined["trials"]] == [
        str(folder / "trial1"),
        str(folder / "trial2"),
    ]
    assert combined["verdict"]["trials"] == [t["verdict"] for t in combined["trials"]]
    for trial in ("trial1", "trial2"):
        assert (folder / trial / "profile_trace.json").exists()
        assert not (folder / trial / "weights" / "last.pt").exists()  # stopped mid-epoch 1
    assert (folder / "timeline.html").exists() and (folder / "profile_summary.json").exists()


def test_run_refuses_keys_it_sets_itself(falconet_cli, run_keys):
    done = falconet_cli("profile", "run", run_keys["data"], "profile=false")
    assert done.returncode == 2 and "profile= is set by `falconet profile run`" in done.stderr
    done = falconet_cli("profile", "run", run_keys["data"], "epoch=3")
    assert done.returncode == 2 and "did you mean epochs=?" in done.stderr
