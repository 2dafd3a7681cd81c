"""The output layer on the rows a pass needs: the compiled graph's `logits_to_keep` input.

A prefill needs the logits of its last position only, but the builder's graph computes the
output layer (hidden x vocabulary, the largest matrix of a small model) for every position:
for Qwen2.5-0.5B that is 136 M of a token's 494 M multiply-adds, 27 % of a prefill. This
rewrite slices the final normalization's output, which only the output layer reads, to its
last `logits_to_keep` rows; a w8a8 rewrite of the graph (`models.w8a8`) keeps the slice.
The input has a default (0 = every row), so a runtime that does not feed it (ONNX Runtime
GenAI, the batching companion) runs the graph exactly as before, and the device's runtime
asks for one row per prefill pass (`runtime.ort_device`).

The rewrite touches `model.onnx` alone (the weights stay in `model.onnx.data`), so an existing
folder is upgraded in seconds (`compile` does it; the artifact hash changes with it).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

LOGITS_TO_KEEP = "logits_to_keep"
LOGITS_ROWS = "logits_rows"  # the output's sequence axis, once it can be shorter than the input's
# the decoder's final normalization, whose output feeds the output layer alone
_NORMS = {"SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization",
          "LayerNormalization", "SkipLayerNormalization", "RMSNormalization"}
_PREFIX = "/logits_rows"


def final_norm(graph, logits: str = "logits"):
    """The normalization whose output the output layer reads: walking back from `logits`
    along first inputs, over the output layer (MatMul, MatMulNBits, or w8a8's quantize and
    MatMulInteger nodes) and any soft-cap or cast after it."""
    producers = {out: node for node in graph.node for out in node.output}
    name = logits
    while (node := producers.get(name)) is not None:
        if node.op_type in _NORMS:
            return node
        name = node.input[0]
    raise ValueError(f"no normalization before the layer that computes {logits!r}: "
                     "not a decoder graph")


def has_logits_to_keep(graph) -> bool:
    return any(init.name == LOGITS_TO_KEEP for init in graph.initializer)


def add_logits_to_keep(model, logits: str = "logits") -> bool:
    """Slice the final normalization's output to its last `logits_to_keep` rows (an input
    defaulting to 0: every row) for everything that reads it; in place. False when the graph
    has it already."""
    from onnx import TensorProto, helper, numpy_helper

    graph = model.graph
    if has_logits_to_keep(graph):
        return False
    norm = final_norm(graph, logits)
    hidden, start, sliced = norm.output[0], _PREFIX + "/start", _PREFIX + "/hidden"
    for node in graph.node:
        node.input[:] = [sliced if name == hidden else name for name in node.input]
    graph.initializer.extend([
        numpy_helper.from_array(np.array([0], np.int64), LOGITS_TO_KEEP),
        numpy_helper.from_array(np.array([np.iinfo(np.int64).max], np.int64), _PREFIX + "/end"),
        numpy_helper.from_array(np.array([1], np.int64), _PREFIX + "/axis"),
    ])
    # an input with an initializer of the same name: a default the caller may override
    graph.input.append(helper.make_tensor_value_info(LOGITS_TO_KEEP, TensorProto.INT64, [1]))
    at = list(graph.node).index(norm) + 1
    for new in reversed([
        helper.make_node("Neg", [LOGITS_TO_KEEP], [start], name=_PREFIX + "/Neg"),
        helper.make_node("Slice", [hidden, start, _PREFIX + "/end", _PREFIX + "/axis"],
                         [sliced], name=_PREFIX + "/Slice"),
    ]):
        graph.node.insert(at, new)
    for output in graph.output:
        if output.name == logits:
            output.type.tensor_type.shape.dim[1].dim_param = LOGITS_ROWS
    return True


def linear_macs(model, vocab_size: int) -> tuple[int, int]:
    """(multiply-adds per token of every linear layer but the output layer, the output
    layer's), from the graph's weight shapes: MatMulNBits' K x N, or a constant weight's of
    MatMul / MatMulInteger / MatMulIntegerToFloat (w8a8); the output layer is the one whose
    width is the vocabulary."""
    from onnx import helper

    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    body = head = 0
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
            k, n = attrs["K"], attrs["N"]
        elif node.op_type in ("MatMul", "MatMulInteger", "MatMulIntegerToFloat") \
                and len(shape := shapes.get(node.input[1], [])) == 2:
            k, n = shape
        else:
            continue
        if n == vocab_size:
            head += k * n
        else:
            body += k * n
    return body, head


def prefill_macs(folder: Path, vocab_size: int) -> int:
    """Multiply-adds per prompt token of a prefill that computes its last row only (every
    linear layer but the output layer; attention over the prefix is on top)."""
    import onnx

    return linear_macs(onnx.load(str(folder / "model.onnx"), load_external_data=False),
                       vocab_size)[0]


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
