"""Fixtures shared by tests/ and bench/, and the CI check that what ``make test`` installs imports."""

import importlib
import os

import pytest

# What ``make test`` installs for the tests (pyproject's [dev] and [math] extras; swanlab is a dependency). Their
# tests skip where a user has not installed them; in CI (``CI=true``) a broken install must fail the run, not turn
# those tests into quiet skips.
CI_IMPORTS = ("hypothesis", "math_verify", "matplotlib", "megatron.core", "mkdocs", "peft", "swanlab")


def pytest_sessionstart(session):
    # make test-vllm's venv holds vLLM and pytest only (its tests need none of these): the Makefile says so
    if os.environ.get("CI") != "true" or os.environ.get("HYBRIDRL_DEV_IMPORTS") == "0":
        return
    for name in CI_IMPORTS:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 -- any failure to import is a broken install
            pytest.exit(f"CI: {name} does not import ({type(e).__name__}: {e}); `make test` installs it "
                        "(pyproject.toml [dev] / [math]) and its tests would only skip", returncode=3)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama causal LM with a character tokenizer, saved once per session."""
    from core.models import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="session")
def ray_shared():
    """One local Ray for every test that needs one (a ``ray.init`` costs 5-9 s on 2 cores: once per run, not once
    per module). 8 logical CPUs: each test's pools fit beside what an earlier test's workers still hold; the tests
    shut their worker groups down. ``address="local"``: never a cluster already up on the host."""
    import ray

    if not ray.is_initialized():  # a run under test (fit with backend ray) may have started one already
        ray.init(address="local", num_cpus=8, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def ray_module_session(ray_shared):
    """The shared Ray session, for a module whose tests start worker groups themselves."""
    yield


def pytest_runtest_logreport(report):
    """``HYBRIDRL_SKIP_REPORT=<file>``: every skipped test and its reason appended to the file, one line each, so
    ``.ci/run`` can list all skips of all its targets together at the end (a new skip is seen, not scrolled past)."""
    path = os.environ.get("HYBRIDRL_SKIP_REPORT")
    if not path or not report.skipped or (report.when == "teardown"):
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    reason = reason.removeprefix("Skipped: ").replace("\n", " ")
    with open(path, "a") as f:
        f.write(f"{report.nodeid}\t{reason}\n")
