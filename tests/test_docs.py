"""The docs stay true to the code: README vs .ci/run, every hook documented, examples run."""

from __future__ import annotations

import re
import types
from pathlib import Path

import torch

from falconet import hookspecs
from falconet.interfaces import DispatchContext

ROOT = Path(__file__).parents[1]


def bash_blocks(markdown: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", markdown, flags=re.S)


def test_readme_has_exactly_two_commands_and_ci_runs_them():
    blocks = [b.strip() for b in bash_blocks((ROOT / "README.md").read_text())]
    assert blocks == ["uv run falconet train", "uv run pytest"]
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    commands = [line for line in ci if line.startswith("uv run")]
    assert commands == blocks


def test_every_hook_is_documented():
    doc = (ROOT / "docs/plugins.md").read_text()
    hooks = [name for name in dir(hookspecs) if name.startswith("register_")]
    assert len(hooks) == 7
    for hook in hooks:
        assert f"| `{hook}` |" in doc, f"{hook} is missing from docs/plugins.md's hook table"


def test_the_minimal_plugin_example_registers_and_runs(falconet_plugins, add_falconet_plugin):
    doc = (ROOT / "docs/plugins.md").read_text()
    (source,) = re.findall(r"```python\n(# acme_falconet/plugin.py\n.*?)```", doc, flags=re.S)
    module = types.ModuleType("acme_falconet.plugin")
    exec(compile(source, "docs/plugins.md", "exec"), module.__dict__)
    record = add_falconet_plugin(module, name="acme", distribution="acme-falconet")
    assert record.status == "ok", record.failure
    backend = falconet_plugins.graph_backends.get("acme-channels-last")
    network = torch.nn.Conv2d(3, 4, 3)
    context = DispatchContext(device=torch.device("cpu"), precision="fp32")
    images = torch.rand(1, 3, 8, 8)
    assert torch.allclose(backend.wrap(network, context)(images), network(images))
