"""``rollout.agent.runner`` is checked before anything starts: the file, the async function it names, the backend
and async mode it can run with -- one line each, naming the key."""

import pytest

from core.config import ConfigError
from core.run import load_recipe_config
from core.checks import check_files, check_run
from core.rollout.agent_server.runner import load_runner


def problems(tmp_path, *overrides):
    cfg, _ = load_recipe_config("recipes/agent", "openai_cpu", list(overrides))
    with pytest.raises(ConfigError) as e:
        check_run(cfg)
        check_files(cfg, missing_data_ok=True)
    return str(e.value)


def test_the_recipes_runner_is_found_in_its_folder_and_loads():
    cfg, _ = load_recipe_config("recipes/agent", "openai_cpu", [])
    assert cfg.rollout.agent.runner.endswith("recipes/agent/openai_agent.py:run")
    check_run(cfg)
    check_files(cfg, missing_data_ok=True)
    assert load_runner(cfg.rollout.agent.runner).__name__ == "run"


def test_a_runner_that_cannot_run_is_named_before_the_run(tmp_path):
    (tmp_path / "sync_agent.py").write_text("def run(client, row):\n    return ''\n")
    assert "'runx' is not defined" in problems(tmp_path, "rollout.agent.runner=openai_agent.py:runx")
    assert "did you mean 'run'" in problems(tmp_path, "rollout.agent.runner=openai_agent.py:runx")
    assert "must be async" in problems(tmp_path, f"rollout.agent.runner={tmp_path}/sync_agent.py:run")
    assert "not found" in problems(tmp_path, f"rollout.agent.runner={tmp_path}/nowhere.py:run")
    assert "rollout.backend=sglang has no rollout server" in problems(tmp_path, "rollout.backend=sglang")
    check_run(load_recipe_config("recipes/agent", "openai_cpu", ["rollout.backend=vllm"])[0])  # vLLM serves it
    assert "streaming is not supported" in problems(tmp_path, "trainer.async.mode=streaming")
    with pytest.raises(ValueError, match="not an async function"):
        load_runner(f"{tmp_path}/sync_agent.py:run")
