"""falconet-profiler is a well-behaved plugin (falconet-testing's contract)."""

from __future__ import annotations

from falconet_testing.contracts import PluginContract


class TestProfilerPlugin(PluginContract):
    plugin = "falconet_profiler"
    distribution = "falconet-profiler"


def test_its_keys_are_its_own_and_known_to_the_core(falconet_plugins, add_falconet_plugin):
    """``profile*`` are declared by the plugin (``register_train_keys``): ``describe_keys``
    lists them with falconet-profiler as the owner, and install_hints names the distribution
    for each, so a run without the plugin says what to install."""
    import falconet_profiler
    from falconet.install_hints import known_provider
    from falconet.training.config import TrainConfig, build_config, config_model, describe_keys
    from falconet_profiler.callback import Profiler

    record = add_falconet_plugin(
        falconet_profiler, name="profiler", distribution="falconet-profiler"
    )
    assert record.status == "ok", record.failure
    model = config_model(falconet_plugins)
    owned = [key for key, *_, owner in describe_keys(model) if owner == "falconet-profiler"]
    assert owned == ["profile", "profile_warmup", "profile_steps", "profile_then_stop"]
    assert not set(owned) & set(TrainConfig.model_fields)
    assert all(known_provider("train_keys", key) == "falconet-profiler" for key in owned)
    assert not Profiler.wanted(build_config(model))
    assert Profiler.wanted(build_config(model, {"profile": "true"}))
