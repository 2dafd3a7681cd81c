"""Rewrite a compiled graph's linear layers to int8 weights x int8 activations (precision `w8a8`).

Why: on a CPU without VNNI (AVX2 only, like the development machine) ONNX Runtime's
`MatMulNBits` kernels are memory-bound at one token but *compute*-bound at a few: scoring 5
draft tokens with the int8 Qwen 1.5B costs 2.5 single-token steps, and speculative verification
lives on multi-token passes. ONNX Runtime's integer GEMM (MLAS u8 x s8 QGEMM) does the same
multiply ~2x faster at 5 rows, and a device's prefill ~2.5x faster (VNNI where the CPU has
it). Each linear layer `y = x @ W` becomes

    W  -> int8 per output channel (symmetric, +-127 on a CPU with VNNI, +-63 elsewhere: see
          WEIGHT_LEVELS), from the int8 block-32 or fp32 weights;
    x  -> uint8 per row (per token, symmetric around 128), quantized inside the graph by one
          `QuantizeLinear` whose block is the whole row (opset 21's blocked quantization);
    y  =  MatMulIntegerToFloat(x_q, W_q, channel_scale) * row_scale.

The two fused kernels (`QuantizeLinear`, and ONNX Runtime's `MatMulIntegerToFloat`, which
scales the integer sums as it writes them) replace seven elementwise passes over activations
and outputs (Div, Round, Add, Cast in; Cast, Mul out): measured per CPU second on one core,
one 64-row linear layer runs 7-37 % faster by shape (docs/BENCHMARKS.md, "Prefill at the
limit"); the integers are the same and the floats differ by rounding order only.

The output layer is left as compiled (8-bit weights in blocks of 32, `MatMulNBits`): its error
lands on the logits as they are, where the hidden layers' is smoothed by the layers after
them. Rewritten too, the Specialist's texts drifted from int8's beyond the paired interval on
email (ROUGE-1 -2.05 over 20 senders; docs/BENCHMARKS.md, "The companion beside the device"),
and it costs no prefill speed: a prefill computes it for its last row only (`logits_rows`).

Per-token activation scales matter twice: a single-scale (per-tensor) quantization of a whole
prompt lets the few "massive activation" tokens flatten every other token (measured: 30 % top-1
agreement on Qwen 0.5B), and rows that never share a scale keep a batched pass equal to each
session alone (cross-session batching relies on it). Quality and speed: docs/models.md.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Collection
from pathlib import Path

import numpy as np

# What the manifest's `builder` ends with for a folder this code rewrote. A new value when the
# graph changes: a folder from an older rewrite is rebuilt by `models compile` and refused by
# name at load time (version 1, seven elementwise passes, prefilled 153 tok/s where version 2
# prefills 212 on one core: docs/BENCHMARKS.md, "Device prefill and decode"; version 2 also
# rewrote the output layer, whose texts drifted from int8's: see the module docstring)
REWRITE = "specsteer w8a8 rewrite 3"

# Without VNNI, MLAS sums pairs of u8 x s8 products in saturating int16: 255 * |w_q| * 2 must
# stay below 32768 or sums silently clip (measured: off by hundreds on random rows). Weights
# therefore use 7 bits of their int8 (+-63, ONNX Runtime's own "reduce_range" on such CPUs) and
# activations the full uint8 (128 +- 127): measured on Qwen 0.5B, clipping the activations to 7
# bits instead doubles the KL to the int8 model (0.064 vs 0.029). With VNNI (one instruction sums
# four products into int32) the full +-127 is exact, and it is what brought the Specialist's
# texts back to int8's (docs/BENCHMARKS.md, "A more faithful w8a8"): the rewrite uses it there,
# the manifest records it (`LEVELS_FIELD`) and a CPU without VNNI refuses such a folder.
WEIGHT_LEVELS = 63
VNNI_WEIGHT_LEVELS = 127
LEVELS_FIELD = "w8a8_weight_levels"
_VNNI_FLAGS = ("avx512_vnni", "avx_vnni")  # /proc/cpuinfo names of the instruction
ACT_LEVELS = 127
ZERO = 128
EPS = 1e-8  # floor of a row's max: an all-zero row quantizes to zeros, not NaN


def is_current(manifest: dict) -> bool:
    """Whether a w8a8 folder's manifest says this code's rewrite made it."""
    return str(manifest.get("builder", "")).endswith(REWRITE)


def cpu_has_vnni(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU sums u8 x s8 products in int32 (x86 VNNI), as Linux reports it; False
    where that cannot be read (other systems get the +-63 weights, exact everywhere)."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines()
                  if line.startswith("flags")), [])
    return any(flag in flags for flag in _VNNI_FLAGS)


def weight_levels() -> int:
    """The weights' levels a rewrite on this machine uses: +-127 with VNNI, else +-63."""
    return VNNI_WEIGHT_LEVELS if cpu_has_vnni() else WEIGHT_LEVELS


def cpu_refusal(manifest: dict) -> str | None:
    """Why this CPU cannot run the folder of `manifest` exactly (None: it can): 8-bit weights
    without VNNI saturate MLAS's int16 sums silently, a wrong text and no error."""
    if int(manifest.get(LEVELS_FIELD, WEIGHT_LEVELS)) <= WEIGHT_LEVELS or cpu_has_vnni():
        return None
    return (f"its w8a8 weights use 8 bits (+-{manifest[LEVELS_FIELD]}), exact only on a CPU with "
            "VNNI, and this CPU has none (its integer sums would saturate); run `specsteer "
            f"models compile {manifest.get('name', 'NAME')} --precision w8a8 --force` on this "
            "machine (seconds: +-63 weights from the int8 folder), or run int8, a device's "
            "default on such a CPU (docs/models.md)")


def quantize_channels(weight: np.ndarray, levels: int = WEIGHT_LEVELS
                      ) -> tuple[np.ndarray, np.ndarray]:
    """`weight` [in, out] float -> (int8 [in, out], float32 scale [out]), symmetric per column
    over +-`levels`."""
    if not 1 <= levels <= VNNI_WEIGHT_LEVELS:
        raise ValueError(f"weight levels must be in [1, {VNNI_WEIGHT_LEVELS}], not {levels}")
    scale = np.abs(weight).max(axis=0) / levels
    scale[scale == 0] = 1.0
    q = np.clip(np.rint(weight / scale), -levels, levels).astype(np.int8)
    return q, scale.astype(np.float32)


def reference_matmul(x: np.ndarray, weight_q: np.ndarray, weight_scale: np.ndarray) -> np.ndarray:
    """What the rewritten graph computes for rows `x` [..., in] (numpy, for tests)."""
    x = x.astype(np.float32)
    row_max = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(EPS))
    row_scale = row_max / np.float32(ACT_LEVELS)
    x_q = np.rint(x / row_scale).astype(np.int32)
    acc = x_q @ weight_q.astype(np.int32)
    return acc.astype(np.float32) * row_scale * weight_scale


def _nbits_weight(node, arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Dequantized [in, out] float32 weight of an 8-bit `MatMulNBits` node."""
    import onnx

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("bits") != 8:
        bits = attrs.get("bits")
        raise ValueError(f"{node.name}: only 8-bit MatMulNBits can be rewritten (bits={bits})")
    extra = [name for name in node.input[3:] if name]
    if extra and (len(node.input) > 4 or node.input[3] not in arrays):
        raise ValueError(f"{node.name}: MatMulNBits with g_idx or bias inputs is not supported")
    q = arrays[node.input[1]].astype(np.float32)
    n, blocks, block = q.shape
    scales = arrays[node.input[2]].astype(np.float32).reshape(n, blocks, 1)
    zero = arrays[node.input[3]].astype(np.float32).reshape(n, blocks, 1) if extra else 128.0
    weight = ((q - zero) * scales).reshape(n, blocks * block)[:, : attrs["K"]]
    return weight.T


def rewrite(model, keep_outputs: Collection[str] = (), levels: int = WEIGHT_LEVELS) -> int:
    """Rewrite `model` (an onnx.ModelProto with its weights loaded) in place, weights over
    +-`levels`; return how many linear layers were rewritten. MatMul nodes count only when
    their weight is a constant; a linear node that writes one of `keep_outputs` (the output
    layer's logits) is kept."""
    from onnx import helper, numpy_helper

    graph = model.graph
    arrays = {init.name: init for init in graph.initializer}

    def array(name: str) -> np.ndarray:
        return numpy_helper.to_array(arrays[name])

    if max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
           default=0) < 21:
        raise ValueError("w8a8 needs opset 21 or later (blocked QuantizeLinear)")
    consts = {
        "w8a8/axes": np.array([-1], np.int64),
        "w8a8/eps": np.array(EPS, np.float32),
        "w8a8/levels": np.array(ACT_LEVELS, np.float32),
        "w8a8/one": np.array(1.0, np.float32),
        "w8a8/zero": np.array(ZERO, np.uint8),
    }
    nodes, dropped, quantized_inputs, count = [], set(), {}, 0
    kept = set(keep_outputs)
    for node in graph.node:
        is_linear = ((node.op_type == "MatMulNBits" and node.domain == "com.microsoft") or (
            node.op_type == "MatMul" and node.input[1] in arrays
            and len(arrays[node.input[1]].dims) == 2
        )) and not kept.intersection(node.output)
        if not is_linear:
            nodes.append(node)
            continue
        if node.op_type == "MatMulNBits":
            weight = _nbits_weight(node, {n: array(n) for n in node.input[1:] if n})
            dropped.update(n for n in node.input[1:] if n)
        else:
            weight = array(node.input[1]).astype(np.float32)
            dropped.add(node.input[1])
        w_q, w_scale = quantize_channels(weight, levels)
        prefix = f"w8a8/{count}/{node.name}"
        graph.initializer.extend([numpy_helper.from_array(w_q, prefix + "/weight"),
                                  numpy_helper.from_array(w_scale, prefix + "/scale")])
        x = node.input[0]
        if x not in quantized_inputs:  # q/k/v or gate/up share their input: quantize it once
            q = f"w8a8/x{len(quantized_inputs)}"
            nodes += [
                helper.make_node("Abs", [x], [q + "/abs"]),
                helper.make_node("ReduceMax", [q + "/abs", "w8a8/axes"], [q + "/max"], keepdims=1),
                helper.make_node("Max", [q + "/max", "w8a8/eps"], [q + "/max_eps"]),
                helper.make_node("Div", [q + "/max_eps", "w8a8/levels"], [q + "/scale"]),
                # zero points in the scales' shape (one per row), as blocked quantization wants
                helper.make_node("Shape", [q + "/scale"], [q + "/rows"]),
                helper.make_node("Expand", ["w8a8/zero", q + "/rows"], [q + "/zero"]),
                helper.make_node("QuantizeLinear", [x, q + "/scale", q + "/zero"], [q + "/u8"],
                                 axis=-1, block_size=weight.shape[0]),
            ]
            quantized_inputs[x] = (q + "/u8", q + "/scale")
        x_q, x_scale = quantized_inputs[x]
        nodes += [
            helper.make_node("MatMulIntegerToFloat",
                             [x_q, prefix + "/weight", "w8a8/one", prefix + "/scale", "w8a8/zero"],
                             [prefix + "/cols"], domain="com.microsoft"),
            helper.make_node("Mul", [prefix + "/cols", x_scale], list(node.output)),
        ]
        count += 1
    if not count:
        raise ValueError("no 8-bit MatMulNBits or constant-weight MatMul to rewrite")
    still_used = {name for node in nodes for name in node.input}
    kept = [i for i in graph.initializer if i.name not in dropped or i.name in still_used]
    kept += [numpy_helper.from_array(v, k) for k, v in consts.items()]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    del graph.node[:]
    graph.node.extend(nodes)
    return count


def rewrite_folder(source: Path, out: Path, levels: int = WEIGHT_LEVELS) -> int:
    """Write `source` (a compiled folder) to `out` with its graph rewritten, weights over
    +-`levels`; the manifest is left to the caller (it hashes the result and records
    `levels`). Returns how many linear layers were rewritten."""
    import onnx

    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.startswith(("model.onnx", "specsteer.json")):
            shutil.copy2(item, out / item.name)
    model = onnx.load(str(source / "model.onnx"))
    genai = json.loads((source / "genai_config.json").read_text())["model"]["decoder"]
    count = rewrite(model, keep_outputs=[genai["outputs"]["logits"]], levels=levels)
    onnx.save(model, str(out / "model.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="model.onnx.data", size_threshold=1024)
    return count


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--levels", type=int, default=WEIGHT_LEVELS)
    args = parser.parse_args()
    count = rewrite_folder(args.source, args.out, args.levels)
    print(f"rewrote {count} linear layers, weights over +-{args.levels}")


if __name__ == "__main__":
    _main()
