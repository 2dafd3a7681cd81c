"""The w8a8 rewrite: exact against its numpy reference, close to float, rows independent."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specsteer.models.manifest import read_manifest, write_manifest
from specsteer.models.tiny import tiny_model_dir
from specsteer.models.w8a8 import quantize_channels, reference_matmul, rewrite, rewrite_folder
from specsteer.runtime import load_model
from specsteer.runtime.ort_batched import BatchedModel

IN, OUT = 64, 48


def _graph(node, inits) -> onnx.ModelProto:
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["rows", OUT])],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def matmul_graph(weight: np.ndarray) -> onnx.ModelProto:
    node = helper.make_node("MatMul", ["x", "w"], ["y"], name="linear")
    return _graph(node, [numpy_helper.from_array(weight, "w")])


def nbits_graph(weight: np.ndarray, bits: int = 8) -> tuple[onnx.ModelProto, np.ndarray]:
    """An 8-bit block-32 MatMulNBits of `weight` [in, out] and the weight it really holds."""
    blocks = weight.T.reshape(OUT, IN // 32, 32)
    scales = (np.abs(blocks).max(-1) / 127).astype(np.float32)
    q = (np.rint(blocks / scales[..., None]) + 128).astype(np.uint8)
    node = helper.make_node(
        "MatMulNBits", ["x", "q", "s"], ["y"], name="nbits", domain="com.microsoft",
        K=IN, N=OUT, bits=bits, block_size=32, accuracy_level=4,
    )
    held = ((q.astype(np.float32) - 128) * scales[..., None]).reshape(OUT, IN).T
    inits = [numpy_helper.from_array(q, "q"), numpy_helper.from_array(scales.ravel(), "s")]
    return _graph(node, inits), held


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options)
    return session.run(None, {"x": x})[0]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def rows(rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((6, IN)).astype(np.float32)
    x[2, 5] = 300.0  # a "massive activation": must not flatten the other rows
    x[4] = 0.0  # an all-zero row must not divide by zero
    return x


def test_matmul_rewrite_equals_its_reference_and_stays_close_to_float(rng):
    weight = rng.standard_normal((IN, OUT)).astype(np.float32)
    model = matmul_graph(weight)
    assert rewrite(model) == 1
    assert {n.op_type for n in model.graph.node} >= {"MatMulIntegerToFloat", "QuantizeLinear"}
    x = rows(rng)
    got = run(model, x)
    np.testing.assert_allclose(got, reference_matmul(x, *quantize_channels(weight)), rtol=1e-5,
                               atol=1e-5)
    exact = x @ weight
    for row in (0, 1, 3, 5):  # ordinary rows: within ~1 % of float
        err = np.abs(got[row] - exact[row]).max() / np.abs(exact[row]).max()
        assert err < 0.02, (row, err)
    assert not got[4].any()


def test_rows_are_quantized_independently(rng):
    """A batched pass equals each row alone, bit for bit (cross-session batching relies on it)."""
    model = matmul_graph(rng.standard_normal((IN, OUT)).astype(np.float32))
    rewrite(model)
    x = rows(rng)
    together = run(model, x)
    alone = np.concatenate([run(model, x[i : i + 1]) for i in range(len(x))])
    np.testing.assert_array_equal(together, alone)


def test_nbits_rewrite_uses_the_weights_the_node_holds(rng):
    model, held = nbits_graph(rng.standard_normal((IN, OUT)).astype(np.float32))
    x = rows(rng)
    before = run(model, x)
    assert rewrite(model) == 1
    assert [i.name for i in model.graph.initializer if i.name in ("q", "s")] == []
    after = run(model, x)
    np.testing.assert_allclose(after, reference_matmul(x, *quantize_channels(held)), rtol=1e-5,
                               atol=1e-5)
    ordinary = [0, 1, 3, 5]
    err = np.abs(after[ordinary] - before[ordinary]).max() / np.abs(before[ordinary]).max()
    assert err < 0.02


def test_refuses_what_it_cannot_rewrite(rng):
    model, _ = nbits_graph(rng.standard_normal((IN, OUT)).astype(np.float32))
    for attr in model.graph.node[0].attribute:
        if attr.name == "bits":
            attr.i = 4
    with pytest.raises(ValueError, match="only 8-bit"):
        rewrite(model)
    identity = helper.make_node("Identity", ["x"], ["y"])
    with pytest.raises(ValueError, match="no 8-bit MatMulNBits"):
        rewrite(_graph(identity, []))


@pytest.fixture(scope="module")
def tiny_w8a8(tmp_path_factory):
    """The tiny fp32 test model rewritten to w8a8, as `models compile` lays it out."""
    source = tiny_model_dir("llama", seed=0)
    out = tmp_path_factory.mktemp("w8a8") / "tiny-w8a8"
    rewrite_folder(source, out)
    manifest = read_manifest(source)
    write_manifest(out, **{k: manifest[k] for k in ("name", "source_sha256", "architecture",
                                                  "chat_template")}, precision="w8a8")
    return source, out


def test_tiny_model_rewritten_runs_on_both_runtimes(tiny_w8a8):
    source, folder = tiny_w8a8
    fp32, w8a8 = load_model(source), load_model(folder)
    ids = fp32.tokenizer.encode("Dear team, thank you for the meeting notes. 東京 😀")
    ref = fp32.new_session().append(ids)
    got = w8a8.new_session().append(ids)
    assert np.corrcoef(ref.ravel(), got.ravel())[0, 1] > 0.99
    chunked = w8a8.new_session()
    parts = np.concatenate([chunked.append(ids[:7]), chunked.append(ids[7:])])
    np.testing.assert_allclose(parts, got, atol=1e-4)
    batched = BatchedModel(folder).new_session()
    np.testing.assert_allclose(batched.append(ids), got, atol=1e-4)
