"""``hybridrl``: every verb's --help shows an example; recipes resolve by name; plan = train --dry-run."""

import pytest

from core.cli import main


@pytest.mark.parametrize("argv", [["train", "--help"], ["plan", "--help"], ["new", "--help"], ["eval", "--help"],
                                  ["export", "--help"], ["selfcheck", "--help"], ["train", "grpo", "--help"],
                                  ["recipes", "--help"], ["config", "--help"], ["report", "--help"],
                                  ["data", "--help"], ["train", "dapo", "--help"]])
def test_every_verb_shows_an_example_in_plain_text_with_each_option_explained(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "example:\n  hybridrl " in text, text
    assert "``" not in text and ":func:" not in text, text  # no RST
    # every option is followed by its explanation (argparse puts it on the same line or the next, indented)
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("  -") and line.strip() not in ("-h, --help", "-h"):
            explained = len(line.strip().split("  ")) > 1 or (i + 1 < len(lines) and lines[i + 1].startswith(" " * 8))
            assert explained, f"{argv}: {line.strip()} has no help"


def test_plan_is_the_dry_run_and_its_exit_code_says_whether_it_fits(capsys):
    assert main(["plan", "dapo", "--config-name", "qwen32b"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("fits")
    assert main(["plan", "dapo", "--config-name", "qwen32b", "trainer.nnodes=1"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_an_unknown_recipe_lists_the_known_ones():
    with pytest.raises(SystemExit, match=r"no recipe 'grpoo' .*recipes here: agent, dapo, distill, grpo, ppo"):
        main(["train", "grpoo"])


def test_recipes_lists_each_recipe_with_what_it_reproduces(capsys):
    assert main(["recipes"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("agent: ") and "\ngrpo: " in text and "\ndapo: " in text
    assert "  cpu              run_smollm2_cpu.sh: val_end >= " in text  # grpo's cpu tier and its bounds
    assert "  full_scale       run_qwen2_7b_gsm8k.sh: val_end >= 0.87" in text


def test_config_show_prints_the_resolved_config_with_a_recipes_own_sections(capsys):
    import yaml

    assert main(["config", "show", "dapo", "--config-name", "qwen32b", "actor.optim.lr=2e-6"]) == 0
    tree = yaml.safe_load(capsys.readouterr().out)
    assert tree["actor"]["optim"]["lr"] == 2e-6 and tree["trainer"]["nnodes"] == 16
    assert tree["trainer"]["async"]["mode"] == "sync"  # every default filled in, under its yaml key
    assert "dapo" in tree and "max_num_gen_batches" in tree["dapo"]  # the recipe's own section
    assert main(["config", "show", "grpo", "actor.optim.lrr=1"]) == 2  # a mistake: one line, as for plan
    assert "did you mean 'lr'" in capsys.readouterr().err


def test_report_summarises_a_run_folder_and_draws_its_curves(tmp_path, capsys):
    import json

    from core.report import read_metrics, report

    rows = [{"step": 0, "val/reward/mean": 0.2}] + [
        {"step": i, "reward/mean": 0.1 * i, "response_length/mean": 10.0 + i, "timing_s/step": 1.0} for i in (1, 2, 3)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["report", str(tmp_path)]) == 0  # the run's folder (or its metrics.jsonl)
    text = capsys.readouterr().out
    assert text.startswith("reward/mean: start 0.100 -> end 0.300") and (tmp_path / "curves.png").is_file(), text
    assert text.rstrip() == report(read_metrics(tmp_path / "metrics.jsonl"), tmp_path / "curves.png")


def test_hydras_flags_answer_or_name_what_does(capsys):
    import yaml

    assert main(["train", "grpo", "--cfg", "job", "trainer.total_steps=3"]) == 0  # prints, starts nothing
    assert yaml.safe_load(capsys.readouterr().out)["trainer"]["total_steps"] == 3
    assert main(["train", "dapo", "--config-name", "qwen32b", "--info"]) == 0
    text = capsys.readouterr().out
    assert text.index("core's defaults") < text.index("recipes/dapo/config.yaml") < text.index("dapo/qwen32b.yaml")
    for flags, says in ((["-m", "actor.optim.lr=1e-6,2e-6"], "--multirun: a sweep is one `hybridrl train` per setting"),
                        (["--cfg", "hydra"], "--cfg hydra: runs use no Hydra runtime config")):
        assert main(["train", "grpo", *flags]) == 2
        assert capsys.readouterr().err.startswith(f"hybridrl: {says}")


def test_eval_help_is_plain_text_with_every_option_explained(capsys):
    import re

    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and "SUPPRESS" not in text  # no raw RST, no argparse internals
    options = re.findall(r"^  (--[a-z-]+)( [A-Z_{},a-z0-9]+)?\n?( +)?(\S.*)?$", text.split("options:")[1], re.M)
    assert len(options) >= 17 and all(o[3] for o in options if o[0] != "--help"), options
    assert "sampling temperature (0: greedy) (default: 0.0)" in text
