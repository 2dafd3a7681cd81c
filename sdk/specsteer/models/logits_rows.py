"""The output layer on the rows a pass needs: the compiled graph's `logits_to_keep` input.

A prefill needs the logits of its last position only, but the builder's graph computes the
output layer (hidden x vocabulary, the largest matrix of a small model) for every position:
for Qwen2.5-0.5B that is 136 M of a token's 494 M multiply-adds, 27 % of a prefill. This
rewrite slices the hidden states before the output layer to their last `logits_to_keep`
rows. The input has a default (0 = every row), so a runtime that does not feed it (ONNX
Runtime GenAI, the batching companion) runs the graph exactly as before, and the device's
runtime asks for one row per prefill pass (`runtime.ort_device`).

The rewrite touches `model.onnx` alone (the weights stay in `model.onnx.data`), so an existing
folder is upgraded in seconds (`compile` does it; the artifact hash changes with it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

LOGITS_TO_KEEP = "logits_to_keep"
LOGITS_ROWS = "logits_rows"  # the output's sequence axis, once it can be shorter than the input's
# ops between the output layer and the graph's `logits` output: a final soft-cap (Gemma:
# Div, Tanh, Mul) or a cast; elementwise, so slicing before them is the same as after
_ELEMENTWISE = {"Cast", "Div", "Mul", "Tanh", "Add", "Identity"}
_LINEAR = {"MatMul", "MatMulNBits", "Gemm"}


def output_layer(graph, logits: str = "logits"):
    """The linear node that computes `logits` (walking back over elementwise ops)."""
    producers = {out: node for node in graph.node for out in node.output}
    name = logits
    while (node := producers.get(name)) is not None:
        if node.op_type in _LINEAR:
            return node
        if node.op_type not in _ELEMENTWISE:
            break
        name = node.input[0]
    raise ValueError(f"no MatMul/MatMulNBits computes {logits!r}: not a decoder graph")


def has_logits_to_keep(graph) -> bool:
    return any(init.name == LOGITS_TO_KEEP for init in graph.initializer)


def add_logits_to_keep(model, logits: str = "logits") -> bool:
    """Slice the output layer's input to its last `logits_to_keep` rows (an input defaulting
    to 0: every row); in place. False when the graph has it already."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    if has_logits_to_keep(graph):
        return False
    node = output_layer(graph, logits)
    hidden = node.input[0]
    prefix = "/logits_rows"
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0], np.int64), LOGITS_TO_KEEP),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), prefix + "/end"),
        numpy_helper.from_array(np.array([1], np.int64), prefix + "/axis"),
    ])
    # an input with an initializer of the same name: a default the caller may override
    graph.input.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1]))
    start, sliced = prefix + "/start", prefix + "/hidden"
    at = list(graph.node).index(node)
    for new in reversed([
        helper.make_node("Neg", [LOGITS_TO_KEEP], [start], name=prefix + "/Neg"),
        helper.make_node("Slice", [hidden, start, prefix + "/end", prefix + "/axis"], [sliced],
                         name=prefix + "/Slice"),
    ]):
        graph.node.insert(at, new)
    node.input[0] = sliced
    for output in graph.output:
        if output.name == logits:
            output.type.tensor_type.shape.dim[1].dim_param = LOGITS_ROWS
    return True


def upgrade_folder(folder: Path) -> bool:
    """Add `logits_to_keep` to a compiled folder's graph (weights untouched); False when it
    has it already. The caller rewrites the manifest (the artifact hash changes)."""
    import onnx

    path = folder / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    if not add_logits_to_keep(model):
        return False
    tmp = path.with_name(".model.onnx.tmp")
    onnx.save(model, str(tmp))
    tmp.replace(path)
    return True


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args()
    print("added" if upgrade_folder(args.folder) else "already there")


if __name__ == "__main__":
    _main()
