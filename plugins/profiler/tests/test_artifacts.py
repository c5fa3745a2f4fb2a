"""A real CPU profile of a short run: the four files, their schema, the window under gradient
accumulation, and the timeline rendered by headless Chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from falconet_profiler import SCHEMA
from falconet_profiler.report import ProfileFileError, check, load
from falconet_profiler.window import PHASES_SEEN

EAGER_PHASES = set(PHASES_SEEN) - {"step"}  # "step": only when graph=whole-step replays

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(page: Path) -> subprocess.CompletedProcess[str]:
    """The DOM of ``page`` after its scripts ran, from headless Chromium with no network."""
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_run_folder_holds_the_four_files(profiled_run: Path):
    for name in ("profile.json", "profile_trace.json", "profile_summary.json", "timeline.html"):
        assert (profiled_run / name).stat().st_size > 0, name
    doc = load(profiled_run)
    assert check(doc) == [] and doc["schema"] == SCHEMA
    assert doc["run"]["device"] == "cpu" and doc["gpu"] is None and doc["memory"] is None
    assert doc["window"] == {
        "warmup": 1,
        "steps": 6,
        "unsynced": 3,
        "synced": 3,
        "complete": True,
        "graph_captures": 0,
        "eager_batches": 0,
    }
    assert doc["verdict"]["name"] in ("compute", "dataloader")
    assert doc["verdict"]["gpu_trace"] is False
    assert doc["trials"][0]["run_dir"] == str(profiled_run)
    assert doc["aggregate"]["step_ms"]["n"] == 1
    summary = json.loads((profiled_run / "profile_summary.json").read_text())
    assert summary["verdict"] == doc["verdict"]["name"] and summary["schema"] == SCHEMA
    assert summary["profile"] == "profile.json"


def test_the_window_under_gradient_accumulation(profiled_run: Path):
    """24 images at batch 8: 3 batches an epoch; nbs 16: an optimizer step every 2nd batch
    and at the epoch's end. Batches 1-3 are unsynchronised, 4-6 synchronised."""
    doc = load(profiled_run)
    batches = doc["batches"]
    assert [b["index"] for b in batches] == [1, 2, 3, 4, 5, 6]
    assert [b["part"] for b in batches] == ["unsynced"] * 3 + ["synced"] * 3
    assert [(b["epoch"], b["batch_in_epoch"]) for b in batches] == [
        (0, 2),
        (0, 3),
        (1, 1),
        (1, 2),
        (1, 3),
        (2, 1),
    ]
    assert [b["update"] for b in batches] == [True, True, False, True, True, False]
    assert all(b["images"] == 8 for b in batches)
    fast = doc["unsynced"]
    assert doc["run"]["accumulate"] == 2 and fast["optimizer_steps"] == 2
    plain = [b["ms"] for b in batches[:3] if not b["update"]]
    updating = [b["ms"] for b in batches[:3] if b["update"]]
    expected = sum(plain) / len(plain) + sum(updating) / len(updating)
    assert fast["update_ms"] == pytest.approx(expected, rel=1e-3)
    assert fast["step_ms"]["mean"] == pytest.approx(sum(b["ms"] for b in batches[:3]) / 3, rel=1e-3)
    for batch in batches:
        names = [p["name"] for p in batch["phases"]]
        assert names[:5] == ["data", "to-device", "forward", "loss", "backward"]
        assert names[5:] == (["optimizer", "ema"] if batch["update"] else [])
        assert sum(p["ms"] for p in batch["phases"]) <= batch["ms"] + 1e-3
    assert set(doc["synced"]["phases"]) == EAGER_PHASES
    assert doc["synced"]["phases"]["optimizer"]["calls"] == 2


def test_the_cpu_trace_holds_the_host_phases(profiled_run: Path):
    trace = json.loads((profiled_run / "profile_trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert sum(e["name"].startswith("falconet/batch") for e in spans) == 6
    assert {"falconet/forward", "falconet/backward", "falconet/data"} <= {e["name"] for e in spans}
    assert all(e["dur"] >= 0 and "ts" in e for e in spans)


def test_a_file_that_is_not_a_profile_is_refused(tmp_path: Path, profiled_run: Path):
    with pytest.raises(ProfileFileError, match="not JSON"):
        (tmp_path / "x.json").write_text("{")
        load(tmp_path / "x.json")
    doc = json.loads((profiled_run / "profile.json").read_text())
    doc["schema"] = SCHEMA + 1
    (tmp_path / "future.json").write_text(json.dumps(doc))
    with pytest.raises(ProfileFileError, match=f"schema {SCHEMA + 1}"):
        load(tmp_path / "future.json")
    with pytest.raises(ProfileFileError, match="missing"):
        (tmp_path / "other.json").write_text('{"schema": 1}')
        load(tmp_path / "other.json")


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (apt-get install chromium)")
def test_the_timeline_renders_the_phases_in_headless_chromium(profiled_run: Path):
    done = dump_dom(profiled_run / "timeline.html")
    dom = done.stdout
    assert 'data-rendered="yes"' in dom, done.stderr[-2000:]
    assert "drawn: 6 batches, 0 kernels" in dom
    for phase in EAGER_PHASES:
        assert f'data-phase="{phase}"' in dom, phase
    assert dom.count('class="phase"') >= 6 * 6  # a bar per batch and one per phase
    assert "No GPU trace (device cpu)" in dom
    html = (profiled_run / "timeline.html").read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")
    assert "https://" not in html and "<script src" not in html


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium here (apt-get install chromium)")
def test_the_timeline_draws_kernel_lanes(profiled_run: Path, tmp_path: Path):
    """A GPU profile's lanes (here grafted onto the CPU profile) become one rect per kernel."""
    from falconet_profiler.timeline import render

    doc = load(profiled_run)
    doc["lanes"] = {
        "origin_us": 0.0,
        "batches": [[0.0, 900.0, 1], [900.0, 1800.0, 2]],
        "names": ["sm90_xmma_gemm", "Memcpy HtoD"],
        "lanes": ["kernels, stream 7", "copies, stream 7"],
        "events": [[0, 100.0, 300.0, 0], [0, 1000.0, 300.0, 0], [1, 50.0, 20.0, 1]],
    }
    page = tmp_path / "timeline.html"
    page.write_text(render(doc))
    dom = dump_dom(page).stdout
    assert "drawn: 6 batches, 3 kernels" in dom
    assert dom.count('class="kernel"') == 3 and "kernels, stream 7" in dom
    assert "sm90_xmma_gemm: 300.0 µs" in dom
