"""The docs stay true to the code: README vs .ci/run, every hook documented, examples run."""

from __future__ import annotations

import contextlib
import re
import types
from pathlib import Path

import torch

from falconet import hookspecs
from falconet.contract import GraphContext, Progress, StepParts
from falconet.precision import FP32
from falconet.training.phases import Phases

ROOT = Path(__file__).parents[1]


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)


def test_readme_has_exactly_two_commands_and_ci_runs_them():
    blocks = [b.strip() for b in bash_blocks((ROOT / "README.md").read_text())]
    assert blocks == ["uv run falconet train", "uv run pytest"]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    commands = [line for line in ci if line.startswith("uv run")]
    assert commands == blocks


def test_tools_readme_names_every_script_in_tools():
    listed = (ROOT / "tools" / "README.md").read_text()
    scripts = [*(ROOT / "tools").glob("*.py"), *(ROOT / "tools" / "device").glob("*.sh")]
    scripts += (ROOT / "tools" / "device").glob("*.py")
    missing = sorted(p.name for p in scripts if f"`{p.name}`" not in listed)
    assert not missing, f"tools/README.md does not name {missing}"


def test_every_hook_is_documented():
    doc = (ROOT / "docs/plugins.md").read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("register_")]
    assert hooks
    for hook in hooks:
        assert f"| `{hook}` |" in doc, f"{hook} is missing from docs/plugins.md's hook table"


def test_the_minimal_plugin_example_registers_and_runs(falconet_plugins, add_falconet_plugin):
    doc = (ROOT / "docs/plugins.md").read_text()
    (source,) = re.findall(r"```python\n(# acme_falconet/plugin.py\n.*?)```", doc, flags=re.S)
    module = types.ModuleType("acme_falconet.plugin")
    exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    record = add_falconet_plugin(module, name="acme", distribution="acme-falconet")
    assert record.status == "ok", record.failure
    assert falconet_plugins.train_keys.get("acme").keys is module.AcmeKeys
    backend = falconet_plugins.graph_backends.get("acme-channels-last")
    network = torch.nn.Conv2d(3, 4, 3)
    parts = StepParts(
        model=network,
        loss=lambda outputs, targets: (outputs.mean(), {}),
        optimizer=torch.optim.SGD(network.parameters(), lr=0.01),
        precision=types.SimpleNamespace(autocast=lambda device: contextlib.nullcontext()),
        scaler=None,
        ema=None,
        clip_grad=0.0,
        loss_gain=1.0,
        schedule=None,
        progress=Progress(),
        phases=Phases(),
        device=torch.device("cpu"),
    )
    images = torch.rand(1, 3, 8, 8)
    for config in (None, module.AcmeKeys(acme_channels_last=False)):
        context = GraphContext(torch.device("cpu"), FP32, config=config)
        assert backend.decline_reason(context) is None
        step = backend.build_step(parts, context)
        loss, _ = step(images, None, update=False)
        assert torch.allclose(loss, network(images).mean())
