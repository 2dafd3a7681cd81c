"""Compile a fetched GGUF into an ONNX Runtime GenAI folder (build time only).

GGUF → dequantized Hugging Face folder (transformers' GGUF loader) → onnxruntime-genai's model
builder at int4/int8/fp32 → the output layer on the rows a pass asks for
(`specsteer.models.logits_rows`) → tokenizer.json + `specsteer.json` manifest (`w8a8`: the
int8 folder with its linear layers rewritten by `specsteer.models.w8a8`). Each heavy step runs in
its own subprocess so its memory is returned before the next one starts, and the result is
built in a temporary folder and renamed into place, so a half-built model is never used.
torch/transformers are needed here only, never on the device at run time. Nothing touches a hub.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from specsteer.errors import ModelError, ModelNotFetched
from specsteer.models import w8a8
from specsteer.models.fetch import verify
from specsteer.models.logits_rows import prefill_macs, upgrade_folder
from specsteer.models.manifest import read_manifest, write_manifest
from specsteer.models.registry import PRECISIONS, ModelSpec, compiled_dir, get_spec, gguf_path
from specsteer.models.source import inspect

_OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def export_hf(gguf: Path, out: Path, dtype: str = "float32") -> None:
    """Dequantize `gguf` with transformers and write a plain safetensors HF folder to `out`.

    `save_pretrained` refuses GGUF-loaded models, so the state dict is written directly; the
    tied lm_head is dropped and the GGUF quantization marker removed so the builder (and vLLM)
    read plain weights of `dtype` (fp32 for the builder; `models export-hf` states its own).
    `w8a8`: fp32 with every linear layer but the output one quantized per output channel to
    int8 and activations per token at run time (`compressed-tensors`' W8A8 scheme), which
    vLLM's CPU build multiplies in int8 (VNNI) instead of fp32.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    _keep_gguf_special_tokens(tokenizer, gguf)
    weights = "float32" if dtype == "w8a8" else dtype
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, weights)
    )
    compressor = _quantize_w8a8(model) if dtype == "w8a8" else None
    state = model.state_dict()
    if getattr(model.config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    save_file({k: v.contiguous() for k, v in state.items()}, out / "model.safetensors",
              metadata={"format": "pt"})
    model.config.architectures = [type(model).__name__]
    model.config.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    config_path = out / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("quantization_config", None)
    config["dtype"] = weights  # what the weights are: engines that read it ("auto") load them so
    _flatten_rope_parameters(config)
    config_path.write_text(json.dumps(config, indent=2))
    if compressor is not None:
        compressor.update_config(str(out))  # the scheme, as vLLM's loader reads it


def _quantize_w8a8(model):
    """Quantize `model`'s linear layers in place to compressed-tensors' W8A8 (int8 weights, a
    symmetric scale per output channel from its min/max; int8 activations per token, dynamic);
    the output layer stays fp32 (the logits the ratio test reads). Returns the compressor,
    which writes the scheme into config.json."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationScheme,
        apply_quantization_config,
    )
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES
    from compressed_tensors.quantization.utils import calculate_qparams

    scheme = QuantizationScheme(targets=["Linear"], **PRESET_SCHEMES["W8A8"])
    apply_quantization_config(model, QuantizationConfig(
        config_groups={"group_0": scheme}, ignore=["lm_head"], format="int-quantized"))
    for module in model.modules():
        args = getattr(getattr(module, "quantization_scheme", None), "weights", None)
        if args is None:
            continue
        weight = module.weight.data
        scale, zero_point = calculate_qparams(
            weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True), args)
        module.weight_scale.data.copy_(scale)
        module.weight_zero_point.data.copy_(zero_point)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format="int-quantized")
    compressor.compress_model(model)
    return compressor


def _keep_gguf_special_tokens(tokenizer, gguf: Path) -> None:
    """Make the saved tokenizer add the start/end tokens the GGUF says the model was trained with.

    transformers' GGUF reading of these flags changes between versions (5.19 drops Gemma-3's
    `add_bos_token`, so its tokenizer.json would encode without <bos> and every Gemma prompt
    would start wrong); the file's own metadata is the reference, whatever transformers is here.
    """
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    for key, attribute in (("tokenizer.ggml.add_bos_token", "add_bos_token"),
                           ("tokenizer.ggml.add_eos_token", "add_eos_token")):
        field = fields.get(key)
        if field is not None and hasattr(tokenizer, attribute):
            setattr(tokenizer, attribute, bool(field.contents()))


def _flatten_rope_parameters(config: dict) -> None:
    """Give the builder the flat RoPE fields it reads, when transformers wrote them per layer type.

    transformers >= 5 writes `rope_parameters` as {layer_type: {rope_type, rope_theta, ...}}
    for models mixing sliding and full attention (Gemma-3); onnxruntime-genai's builder reads
    `rope_parameters["rope_type"]` (KeyError otherwise) and the sliding layers' base as
    `rope_local_base_freq`. The global (full-attention) entry is copied to the top of the dict,
    the sliding one's theta added; the per-type entries stay, so nothing is lost.
    """
    rope = config.get("rope_parameters")
    if not isinstance(rope, dict) or "rope_type" in rope or not rope:
        return
    if not all(isinstance(v, dict) for v in rope.values()):
        return
    full = rope.get("full_attention") or next(iter(rope.values()))
    for key, value in full.items():
        rope.setdefault(key, value)
    rope.setdefault("rope_type", "default")
    local = rope.get("sliding_attention", {}).get("rope_theta")
    if local is not None:
        rope.setdefault("rope_local_base_freq", local)


def _run_step(cmd: list[str], log: Path, what: str) -> None:
    env = {**os.environ, **_OFFLINE_ENV}
    with open(log, "ab") as f:
        f.write(f"\n$ {' '.join(cmd)}\n".encode())
        f.flush()
        result = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
    if result.returncode != 0:
        tail = log.read_text(errors="replace")[-1500:]
        raise ModelError(f"{what} failed (exit {result.returncode}); log {log}:\n{tail}")


def compile_model(
    name: str,
    precision: str | None = None,
    *,
    force: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Path:
    """Compile model `name` (the registry's or an added one) at `precision` (default: its
    own); return the folder."""
    spec = get_spec(name)
    precision = precision or spec.default_precision
    if precision not in PRECISIONS:
        raise ModelError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    say = progress or (lambda _msg: None)
    dest = compiled_dir(spec, precision)
    if dest.exists() and not force:
        if precision == "w8a8" and not w8a8.is_current(read_manifest(dest)):
            say(f"{spec.name} w8a8: {dest} holds an older SDK's rewrite (docs/models.md); "
                "rewriting it")
        elif precision == "w8a8" and w8a8.cpu_refusal(read_manifest(dest)):
            say(f"{spec.name} w8a8: {dest} was rewritten for a CPU with VNNI; rewriting it "
                "for this one")
        else:
            if add_logits_rows(dest):
                say(f"{spec.name} {precision}: added the last-rows output layer to {dest}")
            say(f"{spec.name} {precision}: already compiled at {dest}")
            return dest
    if precision == "w8a8":  # a rewrite of the int8 folder: the source is read for that one
        source = compile_model(name, "int8", progress=progress)
    else:
        source = gguf_path(spec)  # an added model: the user's GGUF file or Hugging Face folder
        if not source.exists() and not spec.source:
            raise ModelNotFetched(
                f"{spec.name} is not fetched; run `specsteer models fetch {spec.name}`"
            )
        verify(spec, source)
    dest.parent.mkdir(parents=True, exist_ok=True)
    for stale in dest.parent.glob(f".{dest.name}.*"):  # left by a compile that was killed
        shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    log = dest.parent / f"{dest.name}.log"
    log.write_text("")
    try:
        started = time.monotonic()
        out = work / "onnx"
        extra = {}
        if precision == "w8a8":
            extra[w8a8.LEVELS_FIELD] = _rewrite_w8a8(spec, source, out, log, say)
        else:
            _build(spec, source, precision, work, log, say)
        upgrade_folder(out)
        _write_manifest(spec, precision, out, time.monotonic() - started, **extra)
        install_folder(out, dest)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    say(f"{spec.name} {precision}: compiled to {dest}")
    return dest


def _build(spec: ModelSpec, source: Path, precision: str, work: Path, log: Path, say) -> None:
    """The builder's folder of `source` (a GGUF, dequantized first, or an added Hugging Face
    folder) at `precision`, in `work`/onnx; an added model keeps its own chat template."""
    hf_dir, out = work / "hf", work / "onnx"
    if source.is_dir():
        say(f"{spec.name}: building from the Hugging Face folder {source} (log: {log})")
        builder_input(source, hf_dir)
    else:
        say(f"{spec.name}: dequantizing the GGUF with transformers (log: {log})")
        _run_step([sys.executable, "-m", "specsteer.models.compile", "export", str(source),
                   str(hf_dir)], log, "GGUF export")
    say(f"{spec.name}: building the ONNX Runtime GenAI model at {precision}")
    _run_step([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf_dir),
               "-o", str(out), "-p", precision, "-e", "cpu", "-c", str(work / "cache")],
              log, "onnxruntime-genai model builder")
    if not (out / "tokenizer.json").exists():
        if not (hf_dir / "tokenizer.json").exists():
            raise ModelError(f"{source} gave no tokenizer.json (the builder could not convert "
                             "its tokenizer); add a folder with a tokenizer.json")
        shutil.copy2(hf_dir / "tokenizer.json", out / "tokenizer.json")
    if spec.source:
        template = inspect(source).chat_template
        (out / "chat_template.jinja").unlink(missing_ok=True)
        if template:
            (out / "chat_template.jinja").write_text(template)


def builder_input(folder: Path, dest: Path) -> None:
    """A Hugging Face folder as the builder reads it: links to every file, and a config.json
    with the flat RoPE fields it wants (`_flatten_rope_parameters`)."""
    dest.mkdir(parents=True)
    for item in folder.iterdir():
        if item.name != "config.json":
            (dest / item.name).symlink_to(item.resolve())
    config = json.loads((folder / "config.json").read_text())
    _flatten_rope_parameters(config)
    (dest / "config.json").write_text(json.dumps(config, indent=2))


def _rewrite_w8a8(spec: ModelSpec, source: Path, out: Path, log: Path, say) -> int:
    """The int8 folder `source` with its linear layers rewritten to w8a8, built in `out`, with
    the weights' levels this CPU multiplies exactly; returns them."""
    levels = w8a8.weight_levels()
    say(f"{spec.name}: rewriting the int8 model's linear layers to w8a8, weights over "
        f"+-{levels} (log: {log})")
    _run_step([sys.executable, "-m", "specsteer.models.w8a8", str(source), str(out),
               "--levels", str(levels)], log, "w8a8 rewrite")
    return levels


def add_logits_rows(folder: Path) -> bool:
    """Give a folder compiled before `models.logits_rows` existed its `logits_to_keep` input
    (the graph file only, in seconds) and a new manifest; False when it has it already."""
    manifest = read_manifest(folder)
    if not upgrade_folder(folder):
        return False
    derived = {"manifest_version", "vocab_size", "context_length", "files", "artifact_sha256",
               "prefill_macs_per_token"}
    write_manifest(folder, **{k: v for k, v in manifest.items() if k not in derived},
                   prefill_macs_per_token=prefill_macs(folder, int(manifest["vocab_size"])))
    return True


def install_folder(out: Path, dest: Path) -> None:
    """Move the finished build `out` to `dest`, replacing an older one (same filesystem)."""
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(out, dest)


def _write_manifest(spec: ModelSpec, precision: str, folder: Path, seconds: float,
                    **extra: object) -> None:
    import onnxruntime_genai

    vocab = json.loads((folder / "genai_config.json").read_text())["model"]["vocab_size"]
    write_manifest(
        folder,
        name=spec.name,
        precision=precision,
        prefill_macs_per_token=prefill_macs(folder, int(vocab)),
        source_sha256=spec.sha256,
        **({"source": spec.source} if spec.source else {}),
        architecture=spec.architecture,
        chat_template=spec.chat_template,
        builder=f"onnxruntime-genai {onnxruntime_genai.__version__}"
        + (f" int8 + {w8a8.REWRITE}" if precision == "w8a8" else ""),
        compile_seconds=round(seconds, 1),
        **extra,
    )


def _main() -> None:
    parser = argparse.ArgumentParser(description="internal build steps of specsteer models compile")
    sub = parser.add_subparsers(dest="step", required=True)
    export = sub.add_parser("export")
    export.add_argument("gguf", type=Path)
    export.add_argument("out", type=Path)
    export.add_argument("--dtype", default="float32",
                        choices=("float32", "bfloat16", "float16", "w8a8"))
    args = parser.parse_args()
    if args.step == "export":
        export_hf(args.gguf, args.out, args.dtype)


if __name__ == "__main__":
    _main()
