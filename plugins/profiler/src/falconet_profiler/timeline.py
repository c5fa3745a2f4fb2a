"""``timeline.html``: one self-contained file (inline CSS, JS and data; no network, no server).

The verdict, evidence, levers and phase table are plain HTML; an inline script draws two SVG
charts from the embedded ``profile.json`` data: per-batch phase bars for every measured batch
(unsynchronised and synchronised) and, with a GPU trace, the kernel lanes of the first
unsynchronised batches (one lane per stream; hover for the kernel's name and duration).
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping
from typing import Any

from falconet_profiler.report import json_safe
from falconet_profiler.window import describe

PHASE_COLOURS = {
    "data": "#e6a23c",
    "to-device": "#909399",
    "forward": "#409eff",
    "loss": "#9b59b6",
    "backward": "#2e7d32",
    "optimizer": "#d35400",
    "ema": "#16a085",
    "other": "#c0c4cc",
}

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:24px 0 8px}
.verdict{font-size:18px;font-weight:600} .reason{color:#444}
table{border-collapse:collapse}
td,th{padding:2px 10px;text-align:right;border-bottom:1px solid #eee}
td:first-child,th:first-child{text-align:left} code{background:#f4f4f4;padding:1px 4px}
.legend span{display:inline-block;margin-right:12px} .legend i{display:inline-block;width:12px;
height:12px;margin-right:4px;vertical-align:-2px} svg text{font:11px system-ui,sans-serif}
.muted{color:#888}
"""

SCRIPT = r"""
(function () {
  const doc = JSON.parse(document.getElementById("profile-data").textContent);
  const colours = JSON.parse(document.getElementById("phase-colours").textContent);
  const NS = "http://www.w3.org/2000/svg";
  function el(name, attrs, parent, text) {
    const node = document.createElementNS(NS, name);
    for (const k in attrs) node.setAttribute(k, attrs[k]);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }
  const batches = doc.batches || [];
  const left = 150, width = 900, row = 16;
  const longest = Math.max(1e-9, ...batches.map(b => b.ms));
  const phases = document.getElementById("phases");
  const svg = el("svg", {width: left + width + 20, height: (batches.length + 2) * row + 10},
                 phases);
  el("text", {x: left, y: 11}, svg, "0 ms");
  el("text", {x: left + width, y: 11, "text-anchor": "end"}, svg, longest.toFixed(2) + " ms");
  batches.forEach((b, i) => {
    const y = (i + 1) * row;
    el("text", {x: 0, y: y + 11}, svg, "#" + b.index + " " + b.part + (b.update ? " *" : ""));
    const total = el("rect", {x: left, y: y + 1, width: b.ms / longest * width, height: row - 3,
                              fill: colours.other, "class": "phase", "data-phase": "other"}, svg);
    el("title", {}, total, "batch " + b.index + ": " + b.ms.toFixed(3) + " ms");
    b.phases.forEach(p => {
      const r = el("rect", {x: left + p.start_ms / longest * width, y: y + 1,
                            width: Math.max(0.5, p.ms / longest * width), height: row - 3,
                            fill: colours[p.name] || "#555", "class": "phase",
                            "data-phase": p.name}, svg);
      el("title", {}, r, p.name + ": " + p.ms.toFixed(3) + " ms");
    });
  });
  const lanes = doc.lanes;
  const box = document.getElementById("kernels");
  let drawn = 0;
  if (lanes && lanes.events.length) {
    const end = Math.max(...lanes.batches.map(b => b[1]),
                         ...lanes.events.map(e => e[1] + e[2]));
    const lsvg = el("svg", {width: left + width + 20, height: (lanes.lanes.length + 2) * row + 10},
                    box);
    el("text", {x: left, y: 11}, lsvg, "0 µs");
    el("text", {x: left + width, y: 11, "text-anchor": "end"}, lsvg, end.toFixed(0) + " µs");
    lanes.batches.forEach(b => {
      const x = left + b[0] / end * width;
      el("line", {x1: x, x2: x, y1: row, y2: (lanes.lanes.length + 1) * row, stroke: "#999",
                  "stroke-dasharray": "3,3"}, lsvg);
      el("text", {x: x + 2, y: (lanes.lanes.length + 1) * row + 11}, lsvg, "batch " + b[2]);
    });
    lanes.lanes.forEach((name, i) => el("text", {x: 0, y: (i + 1) * row + 11}, lsvg, name));
    lanes.events.forEach(e => {
      const r = el("rect", {x: left + e[1] / end * width, y: (e[0] + 1) * row + 1,
                            width: Math.max(0.3, e[2] / end * width), height: row - 3,
                            fill: "#409eff", "class": "kernel"}, lsvg);
      el("title", {}, r, lanes.names[e[3]] + ": " + e[2].toFixed(1) + " µs");
      drawn += 1;
    });
  } else {
    box.textContent = "No GPU trace (device " + doc.run.device + "): no kernel lanes.";
  }
  const status = document.getElementById("status");
  status.textContent = "drawn: " + batches.length + " batches, " + drawn + " kernels";
  document.body.setAttribute("data-rendered", "yes");
})();
"""


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.4g}"
    if isinstance(value, list):
        return "; ".join(map(str, value)) or "-"
    return str(value)


def _rows(pairs: Mapping[str, Any]) -> str:
    return "".join(
        f"<tr><td>{html.escape(k)}</td><td>{html.escape(_fmt(v))}</td></tr>"
        for k, v in pairs.items()
    )


def render(doc: Mapping[str, Any]) -> str:
    """The HTML page for a ``profile.json`` document."""
    verdict, run = doc["verdict"], doc["run"]
    levers = (
        "".join(
            f"<li><code>{html.escape(lever['set'])}</code> {html.escape(lever['why'])}"
            + (f" (needs: {html.escape(lever['needs'])})" if lever.get("needs") else "")
            + "</li>"
            for lever in verdict["levers"]
        )
        or "<li class=muted>none: no key of falconet addresses this here</li>"
    )
    phase_rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{v['ms_per_batch']:.3f}</td>"
        f"<td>{_fmt(v.get('gpu_ms_per_batch'))}</td><td>{v['share']:.1%}</td>"
        f"<td>{doc['unsynced']['phases'].get(name, {}).get('ms_per_batch', 0.0):.3f}</td></tr>"
        for name, v in doc["synced"]["phases"].items()
    )
    legend = "".join(
        f'<span><i style="background:{colour}"></i>{name}</span>'
        for name, colour in PHASE_COLOURS.items()
    )
    steps = describe([b["ms"] for b in doc["batches"] if b["part"] == "unsynced"])
    data = json.dumps(json_safe(doc)).replace("</", "<\\/")
    title = f"falconet profile: {verdict['name']} ({run['model']}, batch {run['batch']})"
    also = "".join(f"<li>{html.escape(a)}</li>" for a in verdict.get("also", []))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>{STYLE}</style></head>
<body>
<h1>{html.escape(title)}</h1>
<p class="muted">{html.escape(run["run_dir"])} · {html.escape(run["device"])}
{html.escape(str(run.get("device_name", "")))} · {html.escape(run["precision"])} ·
graph={html.escape(run["graph"])} · accumulate {run["accumulate"]} ·
{doc["window"]["unsynced"]} unsynchronised + {doc["window"]["synced"]} synchronised batches
after {doc["window"]["warmup"]} discarded · {len(doc["trials"])} trial(s)</p>
<p class="verdict">verdict: <span id="verdict">{html.escape(verdict["name"])}</span></p>
<p class="reason">{html.escape(verdict["reason"])}</p>
<ul>{also}</ul>
<h2>Levers</h2><ul>{levers}</ul>
<h2>Evidence (unsynchronised half)</h2>
<table>{_rows(doc["evidence"])}
<tr><td>step ms median / min / max</td><td>{steps["median"]:.3f} / {steps["min"]:.3f} /
{steps["max"]:.3f}</td></tr></table>
<h2>Phases, ms per batch</h2>
<table><tr><th>phase</th><th>synchronised</th><th>GPU (kernels)</th><th>share</th>
<th>unsynchronised (host)</th></tr>{phase_rows}</table>
<h2>Per-batch phase bars</h2>
<p class="legend">{legend} <span class="muted">* = optimizer step</span></p>
<div id="phases"></div>
<h2>Kernel lanes (first unsynchronised batches)</h2>
<div id="kernels"></div>
<p id="status" class="muted">the charts need JavaScript</p>
<script type="application/json" id="profile-data">{data}</script>
<script type="application/json" id="phase-colours">{json.dumps(PHASE_COLOURS)}</script>
<script>{SCRIPT}</script>
</body></html>
"""
