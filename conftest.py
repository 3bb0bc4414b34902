"""Fixtures shared by tests/ and bench/."""

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random Llama causal LM with a character tokenizer, saved once per session."""
    from core.models import tiny_random_model

    return tiny_random_model(tmp_path_factory.mktemp("tiny") / "model")
