"""recipes/vlm: the shapes task is held out by content with balanced colours, the blank control is blank, the
reward is right by hand, the configs validate, geo3k is prepared as verl does, the full-scale script plans and fits,
and (slow) the CPU tier reproduces recipes/vlm/expected.yaml."""

from pathlib import Path

import pytest

from core.cli import recipe_module
from core.data.dataset import load_rl_parquet
from core.expected import load_expected
from core.rewards import load_reward_fn
from core.run import load_run_config
from tests.recipes.plans import plan
from tests.recipes.tiers import reproduce

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "vlm"
EXPECTED = load_expected(RECIPE)


def test_the_test_pictures_are_held_out_by_content_and_balanced(tmp_path):
    data = recipe_module(RECIPE, "data")
    paths = data.write(tmp_path, train=400, test=48, align=200)
    parts = {name: load_rl_parquet(path) for name, path in paths.items()}

    def key(row):
        return row["extra_info"]["colour"], row["extra_info"]["shape"], row["images"][0].tobytes()

    train = {key(r) for r in parts["train"] + parts["align"]}
    test = [key(r) for r in parts["test"]]
    assert len(set(test)) == 48 and not set(test) & train               # no test picture is trained on
    assert [r["ground_truth"] for r in parts["test"][:4]] == list(data.COLOURS)  # 12 of each colour
    assert parts["align"][0]["ground_truth"] == f"A {parts['align'][0]['extra_info']['colour']} " \
                                                f"{parts['align'][0]['extra_info']['shape']}."
    background = data.draw(None, "square", 0, 0, 10).tobytes()
    assert all(r["images"][0].tobytes() == background for r in parts["test_blank"])
    assert {r["data_source"] for r in parts["test_blank"]} == {"hybridrl/vlm_shapes_blank"}
    assert [r["ground_truth"] for r in parts["test_blank"]] == [r["ground_truth"] for r in parts["test"]]


def test_reward_by_hand():
    fn = load_reward_fn(RECIPE / "reward.py")
    src = "hybridrl/vlm_shapes"
    assert fn(src, "Red.", "red")["score"] == pytest.approx(1.0)
    assert fn(src, "The shape is red.", "red")["score"] == pytest.approx(0.9)
    assert fn(src, "blue", "red")["score"] == pytest.approx(0.1)
    assert fn(src, "The shape is blue.", "red")["score"] == pytest.approx(0.0)
    assert fn(src + "_blank", "red", "red")["score"] == pytest.approx(1.0)
    assert fn("hiyouga/geometry3k", "<think>x</think> so \\boxed{12}", "12")["score"] == pytest.approx(1.0)
    assert fn("hiyouga/geometry3k", "\\boxed{12}", "12")["score"] == pytest.approx(0.9)


def test_the_config_validates():
    cfg = load_run_config(RECIPE, "config")
    assert cfg.actor.model == cfg.rollout.model == "outputs/models/smolvlm_shapes"
    assert cfg.actor.temperature == cfg.algo.sampling.temperature


def test_alignment_trains_on_the_caption_tokens_only(tmp_path):
    from core.vision_models import smolvlm_from_smollm2
    from core.vision_processors import load_processor

    data, align = recipe_module(RECIPE, "data"), recipe_module(RECIPE, "align")
    processor = load_processor(smolvlm_from_smollm2(tmp_path / "vlm"))
    rows = load_rl_parquet(data.write(tmp_path, train=4, test=8, align=3)["align"])
    inputs = align.batch_inputs(processor, rows)
    tok = processor.tokenizer
    for b, row in enumerate(rows):
        labelled = inputs["labels"][b][inputs["labels"][b] != -100]
        assert tok.decode(labelled) == row["ground_truth"] + "<|im_end|>"


def test_image_data_on_an_engine_without_image_support_fails_before_ray(tmp_path):
    from core.checks import ConfigError
    from core.trainer import load_inputs

    paths = recipe_module(RECIPE, "data").write(tmp_path, train=16, test=8, align=1)
    text_model = ["actor.model=SmolLM2-135M-Instruct", "rollout.model=SmolLM2-135M-Instruct"]
    cfg = load_run_config(RECIPE, "config", [f"data.train_files=[{paths['train']}]",
                                             f"data.val_files=[{paths['test']}]", *text_model, "rollout.backend=vllm"])
    with pytest.raises(ConfigError, match=r"train.parquet: row 1: image prompts run on the embedded engine without "
                                          r"the agent loop for now; this run has rollout.backend=vllm"):
        load_inputs(cfg, tmp_path / "run")
    cfg = load_run_config(RECIPE, "config", [f"data.train_files=[{paths['train']}]", "data.val_files=[]", *text_model])
    with pytest.raises(ValueError, match=r"train.parquet: row 1: image prompts, but the rollout model has no image"):
        load_inputs(cfg, tmp_path / "run2")  # a text-only model: no processor to expand the pictures


def geo3k_folder(tmp_path, train, test):
    """A copy of hiyouga/geometry3k as the hub stores it: data/{split}-00000-of-00001.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    from core.data.multimodal import png_bytes

    (tmp_path / "data").mkdir(parents=True)
    for split, rows in (("train", train), ("test", test)):
        table = pa.Table.from_pylist([{"images": [png_bytes(Image.new("RGB", (40, 30), colour))], "problem": problem,
                                       "answer": answer} for problem, answer, colour in rows])
        pq.write_table(table, tmp_path / "data" / f"{split}-00000-of-00001.parquet")
    return tmp_path


def test_geo3k_is_verls_prompt_and_its_test_problems_are_held_out_by_content(tmp_path):
    data = recipe_module(RECIPE, "data")
    src = geo3k_folder(tmp_path / "geo3k_src", train=[("<image>Find x.", "12", (1, 2, 3)),
                                                      ("<image>Find y.", "3", (9, 9, 9)),      # = a test row
                                                      ("<image>Find y.", "3", (8, 8, 8))],     # its picture differs
                       test=[("<image>Find y.", "3", (9, 9, 9))])
    paths = data.write_geo3k(tmp_path / "out", str(src))
    train, test = load_rl_parquet(paths["train"]), load_rl_parquet(paths["test"])
    assert [r["ground_truth"] for r in train] == ["12", "3"] and len(test) == 1
    assert train[0]["prompt"] == [{"role": "user", "content": "<image>Find x. You FIRST think about the reasoning "
                                   "process as an internal monologue and then provide the final answer. The reasoning "
                                   "process MUST BE enclosed within <think> </think> tags. The final answer MUST BE "
                                   "put in \\boxed{}."}]
    assert train[0]["data_source"] == "hiyouga/geometry3k" and train[0]["images"][0].size == (40, 30)
    bad = geo3k_folder(tmp_path / "bad", train=[("<image>Find x.", "12", (1, 2, 3)), ("<image>Find z.", "", (0, 0, 0))],
                       test=[("<image>Find y.", "3", (9, 9, 9))])
    with pytest.raises(ValueError, match=r"train-00000-of-00001.parquet: row 2: no answer"):
        data.write_geo3k(tmp_path / "out2", str(bad))


def test_full_scale_script_plans_and_fits(capsys):
    """The Qwen2.5-VL-7B geo3k yaml, planned: verl's settings compose and validate, the planner counts the vision
    tower, and the plan fits one node of 8 x 80 GB."""
    rc, out = plan(capsys, "vlm", "geo3k_qwen7b")
    assert rc == 0, out[-2000:]
    assert "Qwen/Qwen2.5-VL-7B-Instruct on 8 cuda rank(s)" in out
    assert "samples per step           2560" in out and "4 x 640 samples" in out
    assert "vision tower + connector 0.68B (32 blocks, width 1280)" in out
    assert "vision encoder activations (checkpointed)" in out
    assert out.rstrip().endswith("fits")
    cfg = load_run_config(RECIPE, "geo3k_qwen7b")
    assert (cfg.algo.sampling.n, cfg.actor.kl_loss_coef, cfg.data.prompts_per_step) == (5, 0.01, 512)
    assert (cfg.rollout.max_prompt_length, cfg.algo.sampling.max_new_tokens) == (1024, 2048)


@pytest.mark.slow
def test_cpu_tier_reproduces_expected_yaml(tmp_path):
    """The real CPU tier (about 7 minutes on 2 cores with bf16): caption alignment, then GRPO on the shapes task."""
    reproduce(RECIPE, EXPECTED["cpu"], tmp_path / "run", "recipes/vlm cpu tier", MODEL_DIR=str(tmp_path / "aligned"))
    assert (tmp_path / "run" / "curves.png").is_file()
