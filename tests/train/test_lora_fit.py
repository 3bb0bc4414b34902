"""A LoRA actor through the whole trainer (``fit`` on a recipe config, Ray, 2 ranks: FSDP2 shards with frozen base
weights and trainable adapters, the reference = the actor with its adapters off): the run trains (the adapters move
the policy: KL to the reference grows from 0), the rollout keeps up with each sync, and a run resumed from the
step-2 checkpoint continues exactly as the uninterrupted one."""

import pytest

pytest.importorskip("peft")

from tests.test_checkpoint import fit_run as run, write_run  # noqa: E402

pytestmark = pytest.mark.ray


@pytest.mark.heavy  # ~16 s
def test_a_lora_run_on_two_ranks_trains_syncs_and_resumes_exactly(ray_module_session, tmp_path, tiny_model_dir):
    conf = write_run(tmp_path, tiny_model_dir, total_steps=4, save_freq=2, critic=False, backend="ray")
    # one mini-batch per step: the first update starts from the base model itself, KL 0 exactly
    lora = ("actor.lora.rank=4", "actor.lora.alpha=8", "actor.optim.lr=0.05", "actor.ppo_mini_batch_size=8")
    whole = run(conf, tmp_path / "whole", *lora)
    assert sorted(whole) == [1, 2, 3, 4]
    assert whole[1]["actor/kl_loss"] == 0.0 and whole[4]["actor/kl_loss"] > 0    # the reference is the base model
    assert all(whole[s]["rollout/logprob_diff_max"] < 1e-4 for s in whole)        # the engine has the merged weights
    resumed = run(conf, tmp_path / "resumed", *lora,
                  f"trainer.resume_mode={tmp_path / 'whole' / 'checkpoints' / 'step_000002'}")
    assert sorted(resumed) == [3, 4] and all(resumed[s] == whole[s] for s in (3, 4))
    # export: merged (a plain HF model) and adapter-only (peft's format) give the same model, not the base one
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from core.export import export

    ckpt = tmp_path / "whole" / "checkpoints" / "step_000004"
    merged = AutoModelForCausalLM.from_pretrained(export(ckpt, tmp_path / "merged", "float32")).eval()
    adapter = export(ckpt, tmp_path / "adapter", "float32", adapter_only=True)
    assert sorted(p.name for p in adapter.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir)).eval()
    ids = torch.arange(3, 40).view(1, -1)
    with torch.no_grad():
        plain = base(ids).logits
        peft_logits = PeftModel.from_pretrained(base, str(adapter)).eval()(ids).logits
        ours = merged(ids).logits
    torch.testing.assert_close(ours, peft_logits, rtol=0, atol=1e-5)
    assert float((ours - plain).abs().max()) > 1e-3
