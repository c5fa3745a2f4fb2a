"""Tools that report where time goes, on what they record: bench_startup.py's first imports
and its workers' memory, bench_first_use.py's medians, collector_log.py's garbage collections
and fp8_crossover.py's shapes and table (their GPU runs are in docs/bench-results/)."""

from __future__ import annotations

import gc
import multiprocessing
import sys
import threading
import time

import pytest


def test_the_first_import_of_a_heavy_module_is_timed_with_its_thread_and_importer(
    load_tool, tmp_path, monkeypatch
):
    bench_startup = load_tool("bench_startup")
    (tmp_path / "heavy_for_the_test.py").write_text("import time\ntime.sleep(0.05)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bench_startup, "HEAVY_IMPORTS", ("heavy_for_the_test",))
    imports = bench_startup._FirstImports(origin=0.0)
    monkeypatch.setattr(sys, "meta_path", [imports, *sys.meta_path])
    monkeypatch.delitem(sys.modules, "heavy_for_the_test", raising=False)

    def importer():
        import heavy_for_the_test  # noqa: F401

    thread = threading.Thread(target=importer, name="the-importer")
    thread.start()
    thread.join()
    ((name, seen),) = imports.found().items()
    assert name == "heavy_for_the_test" and seen["thread"] == "the-importer"
    assert seen["seconds"] >= 0.05 and seen["start_s"] > 0
    assert any("importer" in frame for frame in seen["from"])
    # off the main thread, every first import is listed, heavy or not
    assert [(i["name"], i["thread"]) for i in imports.off_main] == [
        ("heavy_for_the_test", "the-importer")
    ]


def _hold(event, copy: bool) -> None:
    """A forked child: keeps its own copy of the parent's buffer, or only reads it."""
    held = bytes(SHARED) if copy else SHARED  # bytes(): a new object, pages of its own
    assert len(held) == len(SHARED)
    event.wait(30)


SHARED = bytearray()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_workers_memory_tells_a_copy_of_its_own_from_shared_pages(load_tool):
    """``workers_mib``: a forked child that copied a 64 MiB buffer holds it privately; one that
    only reads the parent's shares its pages, so its private memory stays far below that."""
    bench_startup = load_tool("bench_startup")
    SHARED[:] = b"x" * (64 << 20)
    context = multiprocessing.get_context("fork")
    event = context.Event()
    children = {copy: context.Process(target=_hold, args=(event, copy)) for copy in (True, False)}
    try:
        for child in children.values():
            child.start()
        ready = time.monotonic() + 20
        while time.monotonic() < ready:  # until the copying child holds its copy
            mib = bench_startup._memory_mib([children[True].pid])
            if mib and mib["private"] > 64:
                break
            time.sleep(0.05)
        copied = bench_startup._memory_mib([children[True].pid])
        shared = bench_startup._memory_mib([children[False].pid])
        both = bench_startup._memory_mib([c.pid for c in children.values()])
    finally:
        event.set()
        for child in children.values():
            child.join(10)
        SHARED[:] = b""
    assert copied["private"] > 64 and shared["private"] < 16
    assert both["private"] == pytest.approx(copied["private"] + shared["private"], abs=0.2)
    assert bench_startup._memory_mib([children[True].pid]) is None  # gone: no reading


def test_the_collections_of_a_span_are_counted_per_generation_and_the_slow_ones_listed(load_tool):
    collector_log = load_tool("collector_log")
    kept = [[n] for n in range(200_000)]  # a full collection of these takes milliseconds
    gc.disable()  # the two collections below alone, none started by allocations
    try:
        log = collector_log.CollectorLog().start()
        gc.collect(0)
        gc.collect()
        log.stop()
    finally:
        gc.enable()
    gc.collect()  # after stop: not recorded
    summary = log.summary()
    assert {g: v["count"] for g, v in summary["per_generation"].items()} == {"0": 1, "1": 0, "2": 1}
    assert [g for _, g, _ in summary["over_1_ms"]] == [2]
    ((start, _, ms),) = summary["over_1_ms"]
    assert ms >= 1.0 and start >= 0
    # only the collections that started before ``until``
    assert log.summary(until=start)["per_generation"]["2"]["count"] == 0
    del kept


@pytest.fixture(scope="module")
def fp8_crossover(load_tool):
    return load_tool("fp8_crossover")


def test_the_crossover_grid_has_square_widths_and_the_feed_forward_pairs(fp8_crossover):
    assert fp8_crossover.shapes([256, 2048], ffn_up_to=1024) == [
        (256, 256),
        (2048, 2048),
        (256, 1024),
        (1024, 256),
    ]


def test_the_crossover_table_has_a_cell_per_rows_and_a_dash_where_none_ran(fp8_crossover):
    results = [
        {"recipe": "current", "rows": 4096, "in": 256, "out": 256, "speedup": 0.83},
        {"recipe": "delayed", "rows": 4096, "in": 256, "out": 256, "speedup": 0.95},
    ]
    lines = fp8_crossover.table(results, "current", [4096, 16384]).splitlines()
    assert lines[1] == "| in -> out | 4,096 rows | 16,384 rows |"
    assert lines[3] == "| 256 -> 256 | 0.83 | - |"


def test_the_first_use_medians_are_per_mode_over_the_processes_that_ran(load_tool):
    bench_first_use = load_tool("bench_first_use")

    def run(mode, copy, import_torch, end):
        seconds = {"copy": copy, "import_torch": import_torch}
        return {"mode": mode, "seconds": seconds, "ends": {"import_torch": 2.0, "copy": end}}

    runs = [
        run("serial", 1.2, 1.8, 4.0),
        {"mode": "serial", "error": "Traceback ..."},
        run("serial", 1.4, 1.6, 4.6),
        run("serial", 1.3, 2.0, 4.2),
        run("cold", 1.7, 1.9, 4.5),
        {"mode": "driver", "error": "Traceback ..."},
    ]
    got = bench_first_use.medians(runs, ["serial", "cold", "driver"])
    assert got["serial"] == pytest.approx(
        {"copy": 1.3, "import_torch": 1.8, "copy_end": 4.2, "after_torch": 2.2}
    )
    assert got["cold"] == pytest.approx(
        {"copy": 1.7, "import_torch": 1.9, "copy_end": 4.5, "after_torch": 2.5}
    )
    assert got["driver"] == {}  # none of its processes ran through
