"""``hybridrl``: every verb's --help shows an example; recipes resolve by name; plan = train --dry-run."""

import pytest

from core.cli import main


@pytest.mark.parametrize("argv", [["train", "--help"], ["plan", "--help"], ["new", "--help"], ["eval", "--help"],
                                  ["export", "--help"], ["selfcheck", "--help"], ["train", "grpo", "--help"]])
def test_every_verb_shows_an_example(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    text = capsys.readouterr().out
    assert "example:\n  hybridrl " in text, text


def test_plan_is_the_dry_run_and_its_exit_code_says_whether_it_fits(capsys):
    assert main(["plan", "dapo", "--config-name", "qwen32b"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("fits")
    assert main(["plan", "dapo", "--config-name", "qwen32b", "trainer.nnodes=1"]) == 1
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_an_unknown_recipe_lists_the_known_ones():
    with pytest.raises(SystemExit, match=r"no recipe 'grpoo' .*recipes here: agent, dapo, grpo, ppo"):
        main(["train", "grpoo"])
