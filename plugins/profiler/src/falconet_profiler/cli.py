"""``falconet profile run|summary|phases|kernels|compare``.

``run`` trains in fresh processes (``falconet train ... profile=true profile_then_stop=true``),
one per trial, and combines their profiles; the others read ``profile.json`` files. Every
command takes ``--json``. A file that is not a profile, or a bad key, exits 2 with one
``error:`` line; a failed trial exits with its status.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

RUN_DEFAULTS = {"val": "false", "plots": "false"}
"""Keys ``profile run`` sets unless given: validation and plots do not change step times."""
OWN_KEYS = ("profile", "profile_then_stop")


def _fail(message: str, status: int = 2) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(status)


def _load(path: str) -> dict[str, Any]:
    from falconet_profiler.report import ProfileFileError, load

    try:
        return load(path)
    except ProfileFileError as exc:
        _fail(str(exc))
        raise  # unreachable: _fail exits


def _echo_json(document: Any) -> None:
    from falconet_profiler.report import json_safe

    click.echo(json.dumps(json_safe(document), indent=1))


@click.group("profile")
def profile() -> None:
    """Why is my training step slow? Profile a window of real steps (falconet-profiler).

    `falconet train ... profile=true` profiles inside a normal run; these commands run
    repeated trials and read the profile.json files they write (docs/profiling.md).
    """


@profile.command("run", context_settings={"ignore_unknown_options": True})
@click.argument("data")
@click.argument("keys", nargs=-1)
@click.option("--model", default="yolo-n", show_default=True, help="Model name or checkpoint.")
@click.option("--repeat", default=1, show_default=True, type=click.IntRange(1), help="Trials.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def run(data: str, keys: tuple[str, ...], model: str, repeat: int, as_json: bool) -> None:
    """Profile training on DATA in REPEAT fresh processes: `falconet profile run coco128.yaml
    --model yolo-n batch=16 graph=compile --repeat 3`.

    KEYS are training keys (`falconet train --help`); `project=` (default runs/profile) and
    `name=` choose the folder holding trial1..N and the combined profile.json. Each trial is
    `falconet train ... profile=true profile_then_stop=true` with val=false and plots=false
    unless given. Trials that disagree give the verdict `mixed`.
    """
    import subprocess

    from falconet.plugins import get_plugins
    from falconet.training.config import ConfigError, check_keys, config_model, parse_cli_pairs
    from falconet.training.run_dir import new_run_dir
    from falconet_profiler.report import format_report, summary_of, write_artifacts
    from falconet_profiler.trials import combine_trials

    try:
        values = parse_cli_pairs(keys)
        check_keys(values, config_model(get_plugins()))
    except ConfigError as exc:
        _fail(str(exc))
    for key in ("model", "data", *OWN_KEYS):
        if key in values:
            _fail(f"{key}= is set by `falconet profile run` itself; remove it")
    parent = new_run_dir(
        values.pop("project", "runs/profile"), values.pop("name", "exp"), weights=False
    ).resolve()
    values = {**RUN_DEFAULTS, **values}
    docs = []
    for trial in range(1, repeat + 1):
        command = [
            sys.executable,
            "-m",
            "falconet",
            "train",
            f"model={model}",
            f"data={data}",
            *(f"{k}={v}" for k, v in values.items()),
            "profile=true",
            "profile_then_stop=true",
            f"project={parent}",
            f"name=trial{trial}",
            "exist_ok=true",
        ]
        log_path = parent / f"trial{trial}.log"
        with log_path.open("w") as handle:
            done = subprocess.run(command, stdout=handle, stderr=subprocess.STDOUT)
        if done.returncode != 0:
            tail = "\n".join(log_path.read_text().splitlines()[-15:])
            _fail(
                f"trial {trial} failed (exit {done.returncode}); {log_path}:\n{tail}",
                done.returncode,
            )
        doc = _load(str(parent / f"trial{trial}"))
        docs.append(doc)
        click.echo(
            f"trial {trial}/{repeat}: {doc['verdict']['name']}, step "
            f"{doc['evidence']['step_ms']:.2f} ms, {doc['evidence']['img_per_s']:.1f} img/s",
            err=True,
        )
    combined = combine_trials(docs)
    combined["trials_dir"] = str(parent)
    write_artifacts(parent, combined)
    if as_json:
        _echo_json({**summary_of(combined), "profile": str(parent / "profile.json")})
    else:
        click.echo(format_report(combined, parent))


@profile.command("summary")
@click.argument("path", metavar="PROFILE.json")
@click.option("--json", "as_json", is_flag=True, help="Print profile_summary.json's content.")
def summary(path: str, as_json: bool) -> None:
    """The verdict, its evidence and the keys to try."""
    from falconet_profiler.report import format_report, summary_of

    doc = _load(path)
    if as_json:
        _echo_json(summary_of(doc))
    else:
        click.echo(format_report(doc))


@profile.command("phases")
@click.argument("path", metavar="PROFILE.json")
@click.option("--json", "as_json", is_flag=True, help="Print the phase tables as JSON.")
def phases(path: str, as_json: bool) -> None:
    """Milliseconds per batch in each phase: synchronised (its own time, and its kernels'),
    and unsynchronised (host time; data is the loader wait)."""
    doc = _load(path)
    fast, slow = doc["unsynced"], doc["synced"]
    if as_json:
        _echo_json({"unsynced": fast, "synced": slow})
        return
    click.echo(f"{'phase':<12} {'sync ms':>9} {'GPU ms':>9} {'share':>7} {'host ms':>9} calls")
    for name in dict.fromkeys([*slow["phases"], *fast["phases"]]):
        s, f = slow["phases"].get(name, {}), fast["phases"].get(name, {})
        gpu = s.get("gpu_ms_per_batch")
        click.echo(
            f"{name:<12} {s.get('ms_per_batch', 0.0):>9.3f} "
            f"{'-' if gpu is None else f'{gpu:.3f}':>9} {s.get('share', 0.0):>7.1%} "
            f"{f.get('ms_per_batch', 0.0):>9.3f} {s.get('calls', 0)}"
        )
    click.echo(
        f"{'step':<12} {slow['step_ms']['mean']:>9.3f} {'':>9} {'':>7} "
        f"{fast['step_ms']['mean']:>9.3f} {slow['batches']} + {fast['batches']} batches"
    )


@profile.command("kernels")
@click.argument("path", metavar="PROFILE.json")
@click.option("--top", default=15, show_default=True, type=click.IntRange(1), help="Rows.")
@click.option(
    "--by-what",
    is_flag=True,
    help="One row per kind of kernel (copy, BatchNorm backward, ...), summed over every "
    "traced kernel (a profile written before these sums: over its top 50 kernels).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
def kernels(path: str, top: int, by_what: bool, as_json: bool) -> None:
    """The kernels that took the most GPU time, per step, with what each does."""
    from falconet_profiler.kernel_names import label

    doc = _load(path)
    gpu = doc.get("gpu")
    # profiles written before the labels existed get them here
    rows = [{**row, "what": label(row["name"])} for row in (gpu or {}).get("top_kernels", [])]
    older = None  # what an older profile's per-kind rows were summed over
    if by_what:
        rows, older = _kinds(doc, rows)
    rows = rows[:top]
    if as_json:
        _echo_json({"gpu_trace": gpu is not None, "kernels": rows})
        return
    if gpu is None:
        click.echo(f"no GPU trace (device {doc['run']['device']}): no kernel figures")
        return
    if older:
        click.echo(f"(this profile predates per-kind sums: summed over {older})")
    click.echo(f"{'ms/step':>8} {'calls/step':>10} {'mean µs':>8} {'share':>6} TC  what")
    for row in rows:
        named = row["what"] if by_what else f"{row['what']}: {row['name'][:70]}"
        click.echo(
            f"{row['ms_per_step']:>8.3f} {row['calls_per_step']:>10.1f} {row['mean_us']:>8.1f} "
            f"{row['share']:>6.1%} {'yes' if row['tensor_core'] else 'no ':<3} {named}"
        )


def _kinds(doc: dict, top_rows: list[dict]) -> tuple[list[dict], str | None]:
    """Kernels by kind: the profile's sums over every traced kernel; for a profile written
    before them, every kernel of its timeline's batches, else its top kernels (and which)."""
    from falconet_profiler.trace import kinds_from_lanes

    gpu = doc.get("gpu") or {}
    if "kernel_kinds" in gpu or not gpu:
        return gpu.get("kernel_kinds", []), None
    if (timeline := kinds_from_lanes(doc.get("lanes"))) is not None:
        kinds, batches = timeline
        return kinds, f"every kernel of its timeline's {batches} batches"
    return _by_what(top_rows), f"its top {len(top_rows)} kernels only"


def _by_what(rows: list[dict]) -> list[dict]:
    """Kernel rows summed by what they do, largest first (Tensor Core if any of them is): for
    profiles written before ``kernel_kinds``, which sums every kernel."""
    groups: dict[str, dict] = {}
    for row in rows:
        group = groups.setdefault(
            row["what"],
            {"what": row["what"], "kernels": 0, "calls_per_step": 0.0, "ms_per_step": 0.0,
             "share": 0.0, "tensor_core": False},
        )  # fmt: skip
        group["kernels"] += 1
        group["calls_per_step"] += row["calls_per_step"]
        group["ms_per_step"] += row["ms_per_step"]
        group["share"] += row["share"]
        group["tensor_core"] |= bool(row["tensor_core"])
    for group in groups.values():
        group["mean_us"] = 1000 * group["ms_per_step"] / max(group["calls_per_step"], 1e-9)
    return sorted(groups.values(), key=lambda g: -g["ms_per_step"])


@profile.command("compare")
@click.argument("a", metavar="A.json")
@click.argument("b", metavar="B.json")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_command(a: str, b: str, as_json: bool) -> None:
    """B against A, figure by figure; a change counts only beyond the trials' spread."""
    from falconet_profiler.trials import NOISE_FLOOR, compare

    result = compare(_load(a), _load(b))
    if as_json:
        _echo_json(result)
        return
    click.echo(f"A: {result['a']['verdict']} ({result['a']['trials']} trials) {a}")
    click.echo(f"B: {result['b']['verdict']} ({result['b']['trials']} trials) {b}")
    click.echo(f"{'figure':<24} {'A':>12} {'B':>12} {'change':>8}  counts")
    for row in result["figures"]:
        relative = "-" if row["relative"] is None else f"{row['relative']:+.1%}"
        mark = "yes" if row["counts"] else "no (within spread)"
        if not row["spread_known"]:
            mark += f" [1 trial: {NOISE_FLOOR:.0%} floor]"
        click.echo(f"{row['figure']:<24} {row['a']:>12.4g} {row['b']:>12.4g} {relative:>8}  {mark}")
