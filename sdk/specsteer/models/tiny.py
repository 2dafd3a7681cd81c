"""Tiny deterministic random-weight models for fast tests (build time: torch + transformers).

A byte-level BPE tokenizer trained on a fixed corpus (so any text encodes) and a 2-layer
Llama- or Qwen2-architecture model initialised from a seed, compiled by the same
onnxruntime-genai builder as the real models and cached by recipe hash. Two seeds give two
different models over one tokenizer: a same-tokenizer Specialist/Generalist pair in a few MB.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from specsteer.errors import ModelError
from specsteer.models.compile import install_folder
from specsteer.models.logits_rows import prefill_macs, upgrade_folder
from specsteer.models.manifest import write_manifest
from specsteer.models.registry import home

# 2: manifests carry prefill_macs_per_token (the warm-start estimate reads it)
RECIPE_VERSION = 2
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = """\
Dear team, thank you for the meeting notes. I will send the revised draft of the report by
Friday. The results of the experiment show that retrieval improves the quality of personalized
generation. We propose a method that steers a large model with a small private model on the
device. Please find attached the slides; let me know if you have questions or comments.
Subject: Re: the budget for next quarter. I think we should keep the numbers as they are.
Abstract: Language models can be adapted to the style of a user with a few examples of their
writing. In this paper we study speculative decoding, verification and recovery of tokens.
Notes: buy milk, call Anna at 10:30, review pull request #42, email the landlord about rent.
0123456789 + - * / = ( ) [ ] { } < > ! ? . , ; : ' " @ # $ % & _ ~ é ü ñ 東京 😀
"""


def _recipe(arch: str, seed: int, vocab: int, heads: int = 4, kv_heads: int = 2) -> dict:
    return {
        "version": RECIPE_VERSION,
        "arch": arch,
        "seed": seed,
        "vocab": vocab,
        "hidden": 64,
        "layers": 2,
        "heads": heads,
        "kv_heads": kv_heads,
        "intermediate": 128,
        "logits_to_keep": True,  # the graph's output layer on the rows asked for (logits_rows)
    }


# Heads of the tiny models a vLLM engine can run: its CPU attention takes head sizes of 32 and
# more, and the default recipe's are 16 (64 hidden / 4 heads)
ENGINE_HEADS = {"heads": 2, "kv_heads": 1}


def tiny_model_dir(arch: str = "llama", seed: int = 0, vocab: int = 512, *, heads: int = 4,
                   kv_heads: int = 2) -> Path:
    """Cached folder of the tiny model with this recipe (built on first use)."""
    recipe = _recipe(arch, seed, vocab, heads, kv_heads)
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    dest = home() / "test-models" / f"tiny-{arch}-s{seed}-{key}"
    return _built_once(dest / "specsteer.json", lambda: build_tiny_model(dest, recipe))


def tiny_hf_dir(arch: str = "llama", seed: int = 0, vocab: int = 512, *, heads: int = 4,
                kv_heads: int = 2) -> Path:
    """The HF (safetensors) folder of the same tiny model: the weights `tiny_model_dir` compiled,
    for engines that load HF folders (vLLM). Built next to the compiled folder."""
    compiled = tiny_model_dir(arch, seed, vocab, heads=heads, kv_heads=kv_heads)
    dest = compiled.with_name(compiled.name + "-hf")
    # a compiled folder cached before HF ones were kept
    return _built_once(dest / "config.json",
                       lambda: _export_to(_recipe(arch, seed, vocab, heads, kv_heads), dest))


def _built_once(marker: Path, build: Callable[[], object]) -> Path:
    """The cached folder holding `marker`, built first when missing by one process at a time:
    parallel test workers share the cache, and a second builder would replace the folder
    under the first one's readers."""
    if not marker.exists():
        from filelock import FileLock  # comes with the build tools (torch)

        marker.parent.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(marker.parent.parent / ".build.lock"):
            if not marker.exists():
                build()
    return marker.parent


def _export_to(recipe: dict, dest: Path) -> None:
    """Export a recipe's HF folder and move it to `dest` whole."""
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        _export(recipe, work / "hf")
        install_folder(work / "hf", dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _train_tokenizer(vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    return tok


# transformers (config, model) class names per tiny architecture, and what each needs beyond
# the common fields: the decoders `specsteer models add` supports, one tiny model each
_ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": None}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM",
             {"original_max_position_embeddings": 2048, "pad_token_id": 0}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", {"head_dim": 16, "sliding_window": 64}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"head_dim": 16, "sliding_window": 64}),
}


def _export(recipe: dict, out: Path) -> None:
    import torch
    import transformers

    tok = _train_tokenizer(recipe["vocab"])
    out.mkdir(parents=True, exist_ok=True)
    tok.save(str(out / "tokenizer.json"))
    common = dict(
        vocab_size=tok.get_vocab_size(),
        hidden_size=recipe["hidden"],
        intermediate_size=recipe["intermediate"],
        num_hidden_layers=recipe["layers"],
        num_attention_heads=recipe["heads"],
        num_key_value_heads=recipe["kv_heads"],
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        bos_token_id=tok.token_to_id("<|im_start|>"),
        eos_token_id=tok.token_to_id("<|im_end|>"),
    )
    torch.manual_seed(recipe["seed"])
    if recipe["arch"] not in _ARCHS:
        raise ModelError(f"tiny models come in {', '.join(_ARCHS)}, not {recipe['arch']!r}")
    config_class, model_class, extra = _ARCHS[recipe["arch"]]
    config = getattr(transformers, config_class)(**common, **extra)
    model = getattr(transformers, model_class)(config)
    with torch.no_grad():  # larger weights than the default init, so distributions are peaked
        for param in model.parameters():
            if param.dim() == 2:
                param.normal_(0.0, 0.2)
    model.config.architectures = [type(model).__name__]
    model.save_pretrained(out)
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "eos_token": "<|im_end|>",
                "bos_token": "<|im_start|>",
                "pad_token": "<|endoftext|>",
                "model_max_length": 2048,
            }
        )
    )


def build_tiny_model(dest: Path, recipe: dict) -> Path:
    """Build, compile (fp32) and cache a tiny model; atomic like `models compile`."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        hf_dir, out = work / "hf", work / "onnx"
        _export(recipe, hf_dir)
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "onnxruntime_genai.models.builder",
                "-i",
                str(hf_dir),
                "-o",
                str(out),
                "-p",
                "fp32",
                "-e",
                "cpu",
                "-c",
                str(work / "cache"),
            ],
            capture_output=True,
            text=True,
            env=env,
        )
        if result.returncode != 0:
            raise ModelError(f"building the tiny model failed:\n{result.stderr[-1500:]}")
        shutil.copy2(hf_dir / "tokenizer.json", out / "tokenizer.json")
        upgrade_folder(out)
        write_manifest(
            out,
            prefill_macs_per_token=prefill_macs(out, tok_vocab(hf_dir)),
            name=f"tiny-{recipe['arch']}-s{recipe['seed']}",
            precision="fp32",
            source_sha256="",
            architecture=recipe["arch"],
            chat_template="chatml",
            recipe=recipe,
        )
        install_folder(out, dest)
        install_folder(hf_dir, dest.with_name(dest.name + "-hf"))  # same weights, HF layout
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return dest


def tiny_hf_folder(arch: str, seed: int = 0, vocab: int = 512) -> Path:
    """Cached Hugging Face folder (safetensors, config, tokenizer) of a tiny model: what a user
    would bring to `specsteer models add`, one per supported architecture."""
    recipe = _recipe(arch, seed, vocab)
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    dest = home() / "test-models" / f"hf-{arch}-s{seed}-{key}"
    return _built_once(dest / "config.json", lambda: _export_to(recipe, dest))


def tok_vocab(hf_dir: Path) -> int:
    """The vocabulary size an exported tiny folder's config holds."""
    return int(json.loads((hf_dir / "config.json").read_text())["vocab_size"])


def hf_reference_dir(dest: Path, recipe: dict) -> Path:
    """Export only the HF folder of a recipe (for transformers-vs-ORT comparisons in tests)."""
    _export(recipe, dest)
    return dest
