"""Reward-model scoring and Bradley-Terry (core/train/reward_model.py) on a tiny real model: batched left-padded
scores equal a direct transformers forward on each text, the loss and accuracy by hand, and a reward model with
another tokenizer gets the conversation re-tokenised in its own template."""

import math

import pytest
import torch

from core.train.reward_model import (bradley_terry_loss, left_padded, load_reward_model, rm_token_ids,
                                       same_tokenization, sequence_scores)
from core.models import _char_tokenizer, load_tokenizer


@pytest.fixture(scope="module")
def rm(tiny_model_dir):
    torch.manual_seed(0)  # the new score head
    return load_reward_model(str(tiny_model_dir))


TEXTS = ["user: 3 + 4?\nassistant: 7", "user: hi\nassistant: hello there, friend", "a", "user: 12 * 12?\nassistant: 144"]


@pytest.mark.parametrize("max_tokens", [8192, 40])  # one batch; several (sorted by length)
def test_batched_scores_equal_a_direct_forward_on_each_text(rm, tiny_model_dir, max_tokens):
    tok = load_tokenizer(str(tiny_model_dir))
    seqs = [tok(t)["input_ids"] for t in TEXTS]
    got = sequence_scores(rm, seqs, tok.pad_token_id, max_tokens=max_tokens)
    with torch.no_grad():
        direct = torch.stack([rm(input_ids=torch.tensor([s])).logits[0, 0] for s in seqs])
    assert direct.std() > 1e-3                                   # the texts score differently
    torch.testing.assert_close(got, direct, atol=1e-5, rtol=1e-5)


def test_left_padding_puts_every_last_token_in_the_last_column():
    b = left_padded([[5, 6, 7], [8]], pad_id=0)
    assert b["input_ids"].tolist() == [[5, 6, 7], [0, 0, 8]]
    assert b["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1]] and b["position_ids"].tolist() == [[0, 1, 2], [0, 0, 0]]


def test_bradley_terry_loss_and_accuracy_by_hand():
    loss, acc = bradley_terry_loss(torch.tensor([2.0, 0.0]), torch.tensor([1.0, 1.0]))
    assert loss.item() == pytest.approx((math.log1p(math.exp(-1)) + math.log1p(math.exp(1))) / 2) == pytest.approx(0.8133, abs=1e-4)
    assert acc.item() == 0.5
    _, tie = bradley_terry_loss(torch.tensor([1.0]), torch.tensor([1.0]))
    assert tie.item() == 0.0                                     # a tie is not a correct ranking
    chosen = torch.tensor([0.3, -0.2], requires_grad=True)
    bradley_terry_loss(chosen, torch.tensor([0.0, 0.0]))[0].backward()
    torch.testing.assert_close(chosen.grad, -torch.sigmoid(-chosen.detach()) / 2)  # d/dc -log sigmoid(c - r)


def other_tokenizer():
    """A reward model's own tokenizer: another vocabulary (a smaller character set) and another chat template."""
    tok = _char_tokenizer(100)
    tok.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok


def test_the_same_tokenization_passes_ids_and_another_re_tokenises_the_conversation(tiny_model_dir):
    policy = load_tokenizer(str(tiny_model_dir))
    prompts = [[{"role": "user", "content": "3 + 4?"}], [{"role": "user", "content": "hi"}]]
    prompt_ids = [policy.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
                  for p in prompts]
    response_ids = [policy("7")["input_ids"] + [policy.eos_token_id], policy("hello")["input_ids"]]
    assert same_tokenization(policy, load_tokenizer(str(tiny_model_dir)))
    same = rm_token_ids(prompt_ids, response_ids, prompts, policy, load_tokenizer(str(tiny_model_dir)))
    assert same == [p + r for p, r in zip(prompt_ids, response_ids)]
    rm_tok = other_tokenizer()
    assert not same_tokenization(policy, rm_tok)
    got = rm_token_ids(prompt_ids, response_ids, prompts, policy, rm_tok)
    # the response as the policy's tokenizer decodes it (this character tokenizer spaces its characters), special
    # tokens (the EOS) dropped, as the assistant's turn in the reward model's template
    texts = [policy.decode(r, skip_special_tokens=True) for r in response_ids]
    assert texts[0] == "7"
    expected = [f"<user>3 + 4?<assistant>{texts[0]}", f"<user>hi<assistant>{texts[1]}"]
    # the first response ended with EOS: so does its re-tokenised form (the reward model reads its score there)
    assert got == [rm_tok(t, add_special_tokens=False)["input_ids"] + eos
                   for t, eos in zip(expected, [[rm_tok.eos_token_id], []])]
    assert got[0] != same[0]


def test_the_role_re_tokenises_for_a_reward_model_with_its_own_tokenizer(tiny_model_dir, tmp_path):
    """A reward model folder with another tokenizer: the role scores the conversation in that tokenizer's ids, as
    scoring those ids directly does; without the rows' chat messages it says what it needs."""
    import shutil

    from core.config import RewardModelConfig
    from core.train.reward_model import RewardModelWorker
    from core.rollout.batch import assemble
    from core.protocol import Batch
    from core.worker import RoleSpec
    from core.worker_group import LocalWorkerGroup, WorkerError

    rm_dir = tmp_path / "rm"
    shutil.copytree(tiny_model_dir, rm_dir)
    for f in rm_dir.glob("*token*"):
        f.unlink()
    other_tokenizer().save_pretrained(rm_dir)
    policy = load_tokenizer(str(tiny_model_dir))
    prompts = [[{"role": "user", "content": "3 + 4?"}], [{"role": "user", "content": "what is 12 * 12?"}]]
    p_ids = [policy.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False) for p in prompts]
    r_ids = [policy("7")["input_ids"] + [policy.eos_token_id], policy("144, I think")["input_ids"]]
    batch = assemble(p_ids, r_ids, [[0.0] * len(r) for r in r_ids], 1, policy.pad_token_id)
    batch = batch.union(Batch(non_tensors={"prompt": prompts}))
    cfg = RewardModelConfig(model=str(rm_dir), dtype="float32")
    group = LocalWorkerGroup({"reward_model": RoleSpec(RewardModelWorker, {"cfg": cfg, "policy_model": str(tiny_model_dir)})})
    try:
        got = group.role("reward_model").call_rank0(RewardModelWorker.compute_rm_scores, batch)["rm_scores"]
        with pytest.raises(WorkerError, match="needs the rows' chat messages"):
            group.role("reward_model").call_rank0(RewardModelWorker.compute_rm_scores, batch.select(
                "input_ids", "attention_mask", "responses", "response_mask"))
    finally:
        group.shutdown()
    torch.manual_seed(0)  # the role's seed: the same new score head
    rm_tok = other_tokenizer()
    seqs = rm_token_ids(p_ids, r_ids, prompts, policy, rm_tok)
    want = sequence_scores(load_reward_model(str(rm_dir)), seqs, rm_tok.pad_token_id)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.manual_seed(0)
    same = sequence_scores(load_reward_model(str(rm_dir)), [p + r for p, r in zip(p_ids, r_ids)], 0)
    assert not torch.allclose(got, same)  # the policy's own ids would have scored otherwise


def test_a_run_with_a_reward_model_trains_on_its_weighted_scores(tmp_path, tiny_model_dir):
    """use_reward_model: the role is placed, every sample gets rm_scores, and the trained scores are
    reward_function_weight x the function's + reward_model_weight x the model's (here the model's alone, x 2)."""
    from core.checks import problems
    from core.loop import Roles, prompts_from_rows, step
    from core.placement import place
    from core.run import load_run_config
    from core.roles import role_specs
    from tests.test_checkpoint import write_run

    conf = write_run(tmp_path, tiny_model_dir, total_steps=1, save_freq=0)
    overrides = [f"trainer.output_dir={tmp_path / 'out'}", "+use_reward_model=true",
                 f"+reward_model.model={tiny_model_dir}", "+reward_model.dtype=float32",
                 "+algo.reward_function_weight=0.0", "+algo.reward_model_weight=2.0",
                 "placement.roles={actor: main, rollout: main, ref: main, reward_model: main}"]
    cfg = load_run_config(conf, overrides=overrides)
    assert problems(cfg) == [] and "reward_model" in role_specs(cfg)
    placement = place(cfg.placement, role_specs(cfg), "local")
    try:
        roles = Roles(actor=placement["actor"], rollout=placement["rollout"], ref=placement["ref"],
                      reward_model=placement["reward_model"])
        from core.data.dataset import load_rl_parquet
        from core.rewards import load_reward_fn

        rows = load_rl_parquet([str(tmp_path / "train.parquet")])[:2]
        reward_fn = load_reward_fn(cfg.reward.path, cfg.reward.name)
        batch, m = step(roles, prompts_from_rows(rows), cfg.algo, reward_fn)
        # a per-data_source choice: the reward model scores only the listed sources; these rows keep the function's
        from dataclasses import replace
        other, _ = step(roles, prompts_from_rows(rows), replace(cfg.algo, reward_model_sources=["elsewhere"]), reward_fn)
    finally:
        placement.shutdown()
    assert batch["rm_scores"].shape == (8,) and batch["rm_scores"].std() > 0
    torch.testing.assert_close(batch["scores"], 2.0 * batch["rm_scores"])
    assert m["reward/model_mean"] == pytest.approx(float(batch["rm_scores"].mean()))
    assert m["reward/mean"] == pytest.approx(2.0 * m["reward/model_mean"], rel=1e-5) and "timing_s/reward_model" in m
    assert "rm_scores" in other and not torch.allclose(other["scores"], 2.0 * other["rm_scores"])
    k = other["scores"] * 7                                                 # the function's scores: k / 7
    assert torch.allclose(k, k.round(), atol=1e-4)
    # the checks name what a reward model needs
    bad = load_run_config(conf, overrides=[f"trainer.output_dir={tmp_path / 'out'}", "+use_reward_model=true"])
    found = problems(bad)
    assert any("reward_model.model is empty" in p for p in found)
    assert any("placement.roles has no pool for reward_model" in p for p in found)
    stray = load_run_config(conf, overrides=[f"trainer.output_dir={tmp_path / 'out'}", "+algo.reward_function_weight=0.5"])
    assert any("use_reward_model is false" in p for p in problems(stray))


def test_the_role_scores_batches_with_a_checkpoint_that_names_no_pad_token(tiny_model_dir, tmp_path):
    """transformers refuses batches of a sequence classifier whose config has no pad_token_id (Llama-3-style
    checkpoints); the role gives it the padding it uses."""
    import json
    import shutil

    from core.config import RewardModelConfig
    from core.train.reward_model import RewardModelWorker
    from core.worker import RoleSpec
    from core.worker_group import LocalWorkerGroup
    from tests.train.test_micro_batches import uneven_batch

    rm_dir = tmp_path / "nopad"
    shutil.copytree(tiny_model_dir, rm_dir)
    config = json.loads((rm_dir / "config.json").read_text())
    config["pad_token_id"] = None
    (rm_dir / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no padding token"):  # what the role avoids
        load_reward_model(str(rm_dir))(input_ids=torch.ones(2, 3, dtype=torch.long))
    cfg = RewardModelConfig(model=str(rm_dir), dtype="float32")
    group = LocalWorkerGroup({"reward_model": RoleSpec(RewardModelWorker, {"cfg": cfg, "policy_model": str(tiny_model_dir)})})
    try:
        got = group.role("reward_model").call_rank0(RewardModelWorker.compute_rm_scores, uneven_batch([3, 5], [2, 4]))
    finally:
        group.shutdown()
    assert got["rm_scores"].shape == (2,) and torch.isfinite(got["rm_scores"]).all()
