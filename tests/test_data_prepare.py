"""One way to a recipe's data: ``hybridrl data prepare``, and ``hybridrl train`` itself, write the files a config
names that are missing, with the recipe's ``data.py`` (``core.data.recipe_data``); ``hybridrl new`` then
``hybridrl train`` of the copy works from an empty folder. Copies of the recipes go into a temporary folder."""

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from core.cli import main as cli_main
from core.data.recipe_data import parse_srcs, recipe_datasets
from core.report import read_metrics
from core.scaffold import tiny_data, tiny_overrides

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p.parent.name for p in (ROOT / "recipes").glob("*/data.py"))


@pytest.fixture()
def here(tmp_path, monkeypatch):
    """An empty working directory holding a copy of the grpo recipe under recipes/."""
    shutil.copytree(ROOT / "recipes" / "grpo", tmp_path / "recipes" / "grpo", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_recipe_writes_each_dataset_its_yamls_name(recipe):
    """Each data file a recipe's yaml names lies in a folder its data.py's DATASETS writes."""
    import yaml

    folder = ROOT / "recipes" / recipe
    datasets = recipe_datasets(folder)
    named = {Path(f).parent.name for y in folder.glob("*.yaml") if y.name != "expected.yaml"
             for key in ("train_files", "val_files")
             for f in ((yaml.safe_load(y.read_text()) or {}).get("data") or {}).get(key) or []}
    assert named and named <= set(datasets), (recipe, named - set(datasets))
    assert all(d.about for d in datasets.values())


def test_data_prepare_writes_what_the_config_names_once(here, capsys):
    assert cli_main(["data", "prepare", "grpo", "--config-name", "demo_cpu"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("data: writing outputs/data/arith_v2/ -- a + b and a * b"), out
    for split in ("train", "test"):
        assert len(pd.read_parquet(here / "outputs" / "data" / "arith_v2" / f"{split}.parquet")) > 0
    assert cli_main(["data", "prepare", "grpo", "--config-name", "demo_cpu"]) == 0
    assert "data: writing" not in capsys.readouterr().out  # there already: nothing rewritten


def test_data_prepare_reads_the_src_named_for_a_dataset(here, capsys):
    src = here / "raw"
    (src / "gsm8k").mkdir(parents=True)
    rows = '{"question": "What is 6 x 7?", "answer": "6 x 7 = 42\\n#### 42"}\n'
    (src / "gsm8k" / "train.jsonl").write_text(rows * 3)
    (src / "gsm8k" / "test.jsonl").write_text(rows)
    assert cli_main(["data", "prepare", "grpo", "--src", f"gsm8k={src}"]) == 0
    df = pd.read_parquet(here / "outputs" / "data" / "gsm8k" / "train.parquet")
    assert len(df) == 3 and df.iloc[0]["reward_model"]["ground_truth"] == "42"
    assert "output the final answer after" in df.iloc[0]["prompt"][0]["content"]  # the recipe's own template
    assert f"; from {src}" in capsys.readouterr().out


def test_src_flags_name_one_dataset_or_every_one():
    assert parse_srcs(["hub", "dapo_math=/d/x.parquet", "/data/shared"]) == {None: "/data/shared",
                                                                            "dapo_math": "/d/x.parquet"}


def test_a_missing_file_no_dataset_writes_names_what_the_recipe_can_write(here, capsys):
    rc = cli_main(["plan", "grpo", "--config-name", "demo_cpu", "data.val_files=[outputs/data/mine/test.parquet]"])
    out = capsys.readouterr().out
    assert rc == 0 and ("warning: data.val_files: outputs/data/mine/test.parquet not found; grpo's data.py writes "
                        "gsm8k/, arith_v2/ under a data folder, not mine/") in out, out


def test_new_then_train_of_the_copy_works_from_an_empty_folder(here, tiny_model_dir):
    """The copy's own config names its data; the run writes it (arith_v2, train and held-out test) and trains 2
    steps on a tiny model."""
    assert cli_main(["new", "myalgo", "--from", "grpo", "--no-check"]) == 0
    tiny = [o for o in tiny_overrides(here, tiny_model_dir) if not o.startswith(("++data.train_files", "++data.val",
                                                                               "++reward."))]
    tiny.append("data.filter_overlong_prompts=false")  # the tiny model's tokenizer spells prompts out longer
    r = subprocess.run([sys.executable, "-m", "core.cli", "train", "myalgo", "--config-name", "demo_cpu", *tiny],
                       capture_output=True, text=True, timeout=600, cwd=here)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "data: writing outputs/data/arith_v2/" in r.stdout
    assert (here / "outputs" / "data" / "arith_v2" / "train.parquet").is_file()
    # the held-out score before the first step (the copy's val_files, written too), then the 2 steps
    assert [m["step"] for m in read_metrics(here / "out" / "metrics.jsonl")] == [0, 1, 2]


def test_too_few_rows_left_after_the_length_filter_is_one_line_naming_the_keys(here, tiny_model_dir, capsys):
    tiny = tiny_overrides(here, tiny_model_dir)
    tiny_data(here)
    rc = cli_main(["train", "grpo", *tiny, "data.filter_overlong_prompts=true", "rollout.max_prompt_length=4"])
    err = capsys.readouterr().err
    assert rc == 2 and err == ("hybridrl: data.train_files: 0 rows left (the note above says what was dropped), "
                               "fewer than data.prompts_per_step=2; add data, lower data.prompts_per_step, or raise "
                               "rollout.max_prompt_length=4\n"), err


def test_a_folder_the_config_partly_names_elsewhere_is_not_overwritten(here, capsys):
    """A train file of the user's in a gsm8k/ folder, the val file missing: writing the dataset there would replace
    the user's file; nothing is written, and the missing file is named."""
    mine = here / "mine" / "gsm8k"
    mine.mkdir(parents=True)
    (mine / "train.parquet").write_bytes(b"the user's own")
    rc = cli_main(["data", "prepare", "grpo", f"data.train_files=[{mine / 'train.parquet'}]",
                   f"data.val_files=[{mine / 'test.parquet'}]"])
    assert rc == 2 and (mine / "train.parquet").read_bytes() == b"the user's own"
    assert f"data.val_files: {mine / 'test.parquet'} not found" in capsys.readouterr().err


def test_a_src_for_a_dataset_the_recipe_does_not_have_is_named(here, capsys):
    assert cli_main(["data", "prepare", "grpo", "--src", "gsm8K=/x"]) == 2
    assert "--src gsm8K=...: grpo's data.py has no dataset 'gsm8K'; did you mean 'gsm8k'?" in capsys.readouterr().err


def test_a_hub_dataset_with_the_hub_off_is_one_line_naming_it_and_src(tmp_path):
    """``hybridrl data prepare prime --config-name eurus7b`` reads its training set from the hub; offline (and with an empty HF cache) that
    is exit 2 and one line naming the hub dataset and ``--src`` -- whether or not `datasets` is installed."""
    shutil.copytree(ROOT / "recipes" / "prime", tmp_path / "recipes" / "prime",
                    ignore=shutil.ignore_patterns("__pycache__", "outputs"))
    for name in ("aime24", "amc23", "minerva_math"):  # the held-out files there already: only the hub set is missing
        (tmp_path / "outputs" / "data" / name).mkdir(parents=True)
        (tmp_path / "outputs" / "data" / name / "test.parquet").touch()
    env = {k: v for k, v in __import__("os").environ.items() if k != "HYBRIDRL_DEBUG"}
    env |= {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "core.cli", "data", "prepare", "prime", "--config-name", "eurus7b"], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and r.stderr.count("\n") == 1, r.stderr
    from recipes.prime.data import EURUS_HUB

    assert r.stderr == (f"hybridrl: {EURUS_HUB} train: the hub is unreachable (offline: HF_HUB_OFFLINE=1); pass "
                        f"--src FILE (a .parquet / .jsonl of {EURUS_HUB})\n"), r.stderr
