"""`models.logits_rows`: the output layer on the last `logits_to_keep` rows, 0 (the default) =
every row, so a runtime that does not feed it runs the graph as before; and the in-place
upgrade of a folder compiled before it existed."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from specsteer.models.compile import add_logits_rows
from specsteer.models.logits_rows import LOGITS_TO_KEEP, add_logits_to_keep, upgrade_folder
from specsteer.models.manifest import check_files, read_manifest, write_manifest
from specsteer.models.tiny import tiny_model_dir
from specsteer.runtime import load_device_model, load_model

HIDDEN, VOCAB = 8, 11


def _decoder_tail(softcap: bool) -> onnx.ModelProto:
    """hidden [1, S, 8] -> final norm -> output layer MatMul (-> Gemma's soft-cap) -> logits."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(HIDDEN, VOCAB)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.ones(HIDDEN, np.float32), "gamma")]
    nodes = [helper.make_node("LayerNormalization", ["hidden", "gamma"], ["normed"]),
             helper.make_node("MatMul", ["normed", "W"], ["raw" if softcap else "logits"])]
    if softcap:
        nodes += [helper.make_node("Div", ["raw", "two"], ["d"]),
                  helper.make_node("Tanh", ["d"], ["t"]),
                  helper.make_node("Mul", ["t", "two"], ["logits"])]
    graph = helper.make_graph(
        nodes, "tail",
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT,
                                       [1, "sequence_length", HIDDEN])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT,
                                       [1, "sequence_length", VOCAB])],
        inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("softcap", [False, True])
def test_the_last_rows_equal_the_full_pass_s(softcap):
    hidden = np.random.default_rng(1).normal(size=(1, 6, HIDDEN)).astype(np.float32)
    before = _session(_decoder_tail(softcap)).run(None, {"hidden": hidden})[0]
    model = _decoder_tail(softcap)
    assert add_logits_to_keep(model)
    assert not add_logits_to_keep(model)  # once only
    session = _session(model)
    assert [i.name for i in session.get_overridable_initializers()] == [LOGITS_TO_KEEP]
    np.testing.assert_array_equal(session.run(None, {"hidden": hidden})[0], before)  # default
    for keep, rows in ((0, 6), (1, 1), (4, 4), (6, 6)):
        out = session.run(None, {"hidden": hidden,
                                 LOGITS_TO_KEEP: np.array([keep], np.int64)})[0]
        assert out.shape == (1, rows, VOCAB)
        np.testing.assert_array_equal(out, before[:, 6 - rows:])


def test_a_graph_without_a_final_norm_is_refused():
    model = _decoder_tail(False)
    model.graph.node[0].op_type = "Relu"  # no normalization before the output layer
    del model.graph.node[0].input[1:]
    with pytest.raises(ValueError, match="no normalization before the layer that computes"):
        add_logits_to_keep(model)


def _strip(folder) -> None:
    """Undo the rewrite in `folder`'s graph: a folder as compiled before it existed."""
    path = folder / "model.onnx"
    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    sliced = next(n for n in graph.node if n.name == "/logits_rows/Slice")
    for node in graph.node:
        node.input[:] = [sliced.input[0] if name == sliced.output[0] else name
                         for name in node.input]
    kept = [n for n in graph.node if not n.name.startswith("/logits_rows/")]
    del graph.node[:]
    graph.node.extend(kept)
    inits = [i for i in graph.initializer
             if i.name != LOGITS_TO_KEEP and not i.name.startswith("/logits_rows/")]
    del graph.initializer[:]
    graph.initializer.extend(inits)
    inputs = [i for i in graph.input if i.name != LOGITS_TO_KEEP]
    del graph.input[:]
    graph.input.extend(inputs)
    onnx.save(model, str(path))
    manifest = read_manifest(folder)
    derived = {"manifest_version", "vocab_size", "context_length", "files", "artifact_sha256",
               "prefill_macs_per_token"}
    write_manifest(folder, **{k: v for k, v in manifest.items() if k not in derived})


def test_an_older_folder_is_upgraded_in_place(tmp_path):
    source = tiny_model_dir("llama", seed=0)
    folder = tmp_path / "tiny"
    shutil.copytree(source, folder)
    _strip(folder)
    ids = list(range(5, 70))
    old = load_device_model(folder, threads=1)
    assert not old.keeps_rows
    expected = old.new_session().append(ids)
    np.testing.assert_array_equal(old.new_session().append(ids, rows=1)[0], expected[-1])
    before = read_manifest(folder)

    assert add_logits_rows(folder)
    assert not add_logits_rows(folder) and not upgrade_folder(folder)
    after = read_manifest(folder)
    check_files(folder, after, full_hash=True)
    assert after["artifact_sha256"] != before["artifact_sha256"]
    assert "prefill_macs_per_token" not in before and after["prefill_macs_per_token"] > 0
    upgraded = ("files", "artifact_sha256", "prefill_macs_per_token")
    assert {k: v for k, v in after.items() if k not in upgraded} == \
        {k: v for k, v in before.items() if k not in upgraded}
    new = load_device_model(folder, threads=1)
    assert new.keeps_rows
    np.testing.assert_array_equal(new.new_session().append(ids, rows=1)[0], expected[-1])
    np.testing.assert_allclose(load_model(folder).new_session().append(ids), expected, atol=1e-5)


def test_w8a8_keeps_the_slice_and_an_older_w8a8_folder_takes_it(tmp_path):
    """The w8a8 rewrite quantizes the sliced rows (its own quantize nodes read the slice);
    a w8a8 folder rewritten before the slice existed gets it in front of those nodes."""
    from specsteer.models.w8a8 import rewrite_folder

    source = tiny_model_dir("llama", seed=0)
    ids = list(range(5, 70))
    for name, strip in (("new", False), ("old", True)):
        int8 = tmp_path / f"{name}-source"
        shutil.copytree(source, int8)
        if strip:
            _strip(int8)
        folder = tmp_path / name
        rewrite_folder(int8, folder)
        write_manifest(folder, name="tiny-w8a8", precision="w8a8", chat_template="chatml")
        if strip:
            assert not load_device_model(folder, threads=1).keeps_rows
            assert add_logits_rows(folder)
        model = load_device_model(folder, threads=1)
        assert model.keeps_rows
        full = model.new_session().append(ids)
        session = model.new_session()
        np.testing.assert_array_equal(session.append(ids, rows=1)[0], full[-1])
        assert session._binding.get_outputs()[0].shape() == [1, 1, model.vocab_size]
