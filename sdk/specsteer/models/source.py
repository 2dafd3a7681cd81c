"""What a model a user brings is: a GGUF file or a Hugging Face folder, its architecture, its
chat template, and whether SpecSteer can compile and run it (`specsteer models add`).

Supported architectures are those every step of the path handles, each tested on a model of
its own (tests/models/test_add.py): transformers' GGUF loader (for a GGUF file), onnxruntime-
genai's model builder, and the device's runtime, which keeps one key/value cache per layer
(`past_key_values.N`). `refusal` says in one line why anything else is refused.

The GGUF header is read here (magic, version, key/value metadata): the `gguf` package parses
every tensor and the whole vocabulary first (minutes on a slow machine), and this needs only a
few keys, so a file that is not a model is refused at once.
"""

from __future__ import annotations

import json
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from specsteer.errors import ModelError

# GGUF `general.architecture` / HF `architectures[0]` of the decoders SpecSteer compiles
SUPPORTED = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3": "Gemma3ForCausalLM",
}
FAMILIES = {cls: family for family, cls in SUPPORTED.items()}
# why the others are refused, by what they are (GGUF architecture or HF class fragments)
_WHY = (
    (("moe", "Moe", "gpt_oss", "GptOss", "minimax"),
     "a mixture-of-experts model (the device's runtime runs dense decoders)"),
    (("mamba", "Mamba", "lfm2", "Lfm2", "Hybrid", "rwkv"),
     "a state-space or hybrid model: its cache is not one key/value pair per layer, which is "
     "what the device's runtime keeps and rewinds"),
    (("t5", "T5", "Whisper", "bert", "Bert"),
     "an encoder or encoder-decoder model, not a decoder that writes text"),
    (("VL", "Vision", "ConditionalGeneration", "Audio", "MM"),
     "a multimodal model (take its text decoder alone)"),
)
_GGUF_MAGIC = b"GGUF"
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class ModelSource:
    """A model file or folder a user brings, as inspected (nothing compiled yet)."""

    path: Path
    kind: str  # "gguf" | "hf"
    family: str  # a key of SUPPORTED
    title: str  # the model's own name, from its metadata (else the file or folder name)
    chat_template: str | None  # the Jinja chat template it carries, None for a base model

    @property
    def default_name(self) -> str:
        """A registry name from the title: lower case, dashes."""
        name = re.sub(r"[^a-z0-9.]+", "-", self.title.lower()).strip("-.")
        return name or "model"


def inspect(path: str | Path) -> ModelSource:
    """The model at `path`, or a ModelError saying in one line why it cannot be added."""
    source = Path(path).expanduser()
    if source.is_dir():
        return _hf_folder(source)
    if not source.is_file():
        raise ModelError(f"{source} does not exist")
    with open(source, "rb") as f:
        if f.read(4) != _GGUF_MAGIC:
            raise ModelError(f"{source} is not a model: neither a GGUF file nor a Hugging Face "
                             "folder (a folder with config.json and its weights)")
        meta = gguf_metadata(f)
    arch = str(meta.get("general.architecture", ""))
    family = _family(arch, source)
    title = str(meta.get("general.name") or source.stem)
    template = meta.get("tokenizer.chat_template")
    return ModelSource(source, "gguf", family, title, str(template) if template else None)


def gguf_metadata(f: BinaryIO) -> dict[str, Any]:
    """The key/value metadata of a GGUF file opened at offset 4 (after the magic); arrays are
    skipped (the vocabulary), every other value read."""
    version = struct.unpack("<I", f.read(4))[0]
    if version < 2:
        raise ModelError(f"GGUF version {version} is too old (2 or later)")
    _tensors, count = struct.unpack("<QQ", f.read(16))
    meta: dict[str, Any] = {}
    for _ in range(count):
        key = _string(f)
        kind = struct.unpack("<I", f.read(4))[0]
        if kind == _ARRAY:
            _skip_array(f)
        else:
            meta[key] = _value(f, kind)
    return meta


def _string(f: BinaryIO) -> str:
    (length,) = struct.unpack("<Q", f.read(8))
    return f.read(length).decode("utf-8", errors="replace")


def _value(f: BinaryIO, kind: int) -> Any:
    if kind == _STRING:
        return _string(f)
    if kind not in _SCALARS:
        raise ModelError(f"damaged GGUF metadata (value type {kind})")
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _skip_array(f: BinaryIO) -> None:
    kind, count = struct.unpack("<IQ", f.read(12))
    if kind == _STRING:
        for _ in range(count):
            (length,) = struct.unpack("<Q", f.read(8))
            f.seek(length, 1)
    elif kind in _SCALARS:
        f.seek(count * struct.calcsize(_SCALARS[kind]), 1)
    elif kind == _ARRAY:
        for _ in range(count):
            _skip_array(f)
    else:
        raise ModelError(f"damaged GGUF metadata (array of value type {kind})")


def _hf_folder(folder: Path) -> ModelSource:
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{folder} is not a model: a Hugging Face folder has a config.json")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{config_path} is not valid JSON ({exc})") from exc
    classes = config.get("architectures") or [config.get("model_type", "")]
    if not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise ModelError(f"{folder} holds no weights (*.safetensors or *.bin)")
    family = FAMILIES.get(classes[0]) or _family(str(classes[0]), folder)
    return ModelSource(folder, "hf", family, config.get("_name_or_path") or folder.name,
                       _hf_chat_template(folder))


def _hf_chat_template(folder: Path) -> str | None:
    """The folder's own chat template: chat_template.jinja, else tokenizer_config.json's."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    config = folder / "tokenizer_config.json"
    if config.is_file():
        template = json.loads(config.read_text()).get("chat_template")
        if isinstance(template, str):
            return template
    return None


def _family(arch: str, source: Path) -> str:
    """The supported family of `arch` (a GGUF architecture or an HF class), or the refusal."""
    if arch in SUPPORTED:
        return arch
    if arch in FAMILIES:
        return FAMILIES[arch]
    raise ModelError(f"{source} is {refusal(arch)}")


def refusal(arch: str) -> str:
    """Why a model of architecture `arch` cannot be added, as the end of a sentence."""
    supported = ", ".join(SUPPORTED)
    for marks, why in _WHY:
        if any(mark in arch for mark in marks):
            return f"a {arch!r} model: {why}; supported: {supported}"
    return (f"a {arch or 'unknown'!r} model, which onnxruntime-genai's model builder (or "
            f"transformers' GGUF loader) does not build; supported: {supported}")
