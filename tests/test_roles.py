"""Which worker runs each role, and with what config (``core.roles.role_specs``)."""

from dataclasses import fields

from core.config import ActorConfig, RunConfig, validate
from core.roles import role_specs
from core.train.fsdp import FSDPActor
from core.train.lora import LoraReference


def test_the_reference_is_the_actors_config_frozen():
    """Every setting of the actor's forward reaches the reference (it was copied field by field: a new field, or
    share_prompt / remove_padding / gradient_checkpointing, stayed at its default there)."""
    cfg = validate(RunConfig, {"actor": {"model": "m", "dtype": "float32", "micro_batch_size": 3, "share_prompt": False,
                                         "remove_padding": False, "max_tokens_per_micro": 512, "temperature": 0.7,
                                         "gradient_checkpointing": True, "kl_loss_coef": 0.01},
                               "rollout": {"model": "m"}, "algo": {"sampling": {"temperature": 0.7}}})
    spec = role_specs(cfg)["ref"]
    ref = spec.kwargs["cfg"]
    assert spec.cls is FSDPActor and ref.trainable is False
    differ = {f.name for f in fields(ActorConfig) if getattr(ref, f.name) != getattr(cfg.actor, f.name)}
    assert differ == {"trainable"}


def test_a_lora_actors_reference_is_its_own_base_model():
    cfg = validate(RunConfig, {"actor": {"lora": {"rank": 4}, "kl_loss_coef": 0.01}})
    spec = role_specs(cfg)["ref"]
    assert spec.cls is LoraReference and "cfg" not in spec.kwargs
