"""The w8a8 rewrite: exact against its numpy reference, close to float, rows independent."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specsteer.errors import ModelNotCompiled
from specsteer.models import w8a8
from specsteer.models.manifest import read_manifest, write_manifest
from specsteer.models.tiny import tiny_model_dir
from specsteer.models.w8a8 import quantize_channels, reference_matmul, rewrite, rewrite_folder
from specsteer.runtime import load_model
from specsteer.runtime.folder import ModelFolder
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


def test_the_output_layer_is_kept_as_compiled(rng):
    """The linear layer that writes the logits stays an 8-bit MatMulNBits (its error would land
    on the logits unsmoothed); the one before it is rewritten."""
    hidden, held = nbits_graph(rng.standard_normal((IN, OUT)).astype(np.float32))
    head_w = rng.standard_normal((OUT, OUT)).astype(np.float32)
    graph = hidden.graph
    graph.node[0].output[0] = "h"
    graph.node.append(helper.make_node("MatMul", ["h", "head"], ["y"], name="head"))
    graph.initializer.append(numpy_helper.from_array(head_w, "head"))
    x = rows(rng)
    assert rewrite(hidden, keep_outputs=["y"]) == 1
    ops = [n.op_type for n in hidden.graph.node]
    assert ops[-1] == "MatMul" and "MatMulIntegerToFloat" in ops and "MatMulNBits" not in ops
    after = run(hidden, x)
    np.testing.assert_allclose(after, reference_matmul(x, *quantize_channels(held)) @ head_w,
                               rtol=1e-4, atol=1e-3)  # the head in float, as compiled
    assert held.shape == (IN, OUT)


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
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    [head] = [n for n in graph.node if "logits" in n.output]
    assert head.op_type == "MatMul"  # the output layer as compiled (fp32 in the tiny model)
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


def test_vnni_is_read_from_the_cpu_flags(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n")
    assert w8a8.cpu_has_vnni(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx_vnni\n")
    assert w8a8.cpu_has_vnni(info)
    info.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnnix\n")
    assert not w8a8.cpu_has_vnni(info)  # a flag, not a substring
    assert not w8a8.cpu_has_vnni(tmp_path / "absent")  # unknown: the +-63 that is exact anywhere


def test_8_bit_weights_are_used_only_with_vnni(monkeypatch, rng):
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: True)
    assert w8a8.weight_levels() == 127
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: False)
    assert w8a8.weight_levels() == 63
    q, _ = quantize_channels(rng.standard_normal((IN, OUT)).astype(np.float32), 127)
    assert np.abs(q).max() == 127
    with pytest.raises(ValueError, match="levels"):
        quantize_channels(np.ones((2, 2), np.float32), 128)


@pytest.mark.skipif(not w8a8.cpu_has_vnni(), reason="+-127 weights are exact only with VNNI")
def test_8_bit_weights_are_exact_on_this_vnni_cpu(rng):
    weight = rng.standard_normal((IN, OUT)).astype(np.float32)
    model = matmul_graph(weight)
    rewrite(model, levels=127)
    x = rows(rng) * 50  # activations at the full uint8 range: where int16 pair sums saturate
    np.testing.assert_allclose(run(model, x), reference_matmul(x, *quantize_channels(weight, 127)),
                               rtol=1e-5, atol=1e-3)


def test_a_folder_with_8_bit_weights_is_refused_without_vnni(tiny_w8a8, monkeypatch, tmp_path):
    """A folder rewritten for a VNNI CPU, carried to one without: refused with the command that
    rewrites it, never run with silently saturated sums."""
    source, folder = tiny_w8a8
    eight = tmp_path / "tiny-w8a8-127"
    rewrite_folder(source, eight, levels=127)
    manifest = read_manifest(source)
    write_manifest(eight, **{k: manifest[k] for k in ("name", "source_sha256", "architecture",
                                                    "chat_template")}, precision="w8a8",
                   **{w8a8.LEVELS_FIELD: 127})
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: False)
    with pytest.raises(ModelNotCompiled, match="VNNI.*--precision w8a8"):
        ModelFolder.open(eight)
    with pytest.raises(ModelNotCompiled, match="VNNI"):
        load_model(eight)
    ModelFolder.open(folder)  # +-63: runs anywhere
    monkeypatch.setattr(w8a8, "cpu_has_vnni", lambda: True)
    assert ModelFolder.open(eight).manifest[w8a8.LEVELS_FIELD] == 127
