"""Fixtures shared by tests/ and bench/."""

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama causal LM with a character tokenizer, saved once per session."""
    from core.models import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def ray_module_session():
    """One Ray session for a test module (ray.init takes ~9 s here)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
