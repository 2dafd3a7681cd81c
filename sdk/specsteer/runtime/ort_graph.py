"""A compiled folder's graph in a raw `onnxruntime.InferenceSession`: what both raw runtimes
share (the device's, `ort_device`, and the batching companion's, `ort_batched`).

It reads the graph's input and output names from genai_config.json, the KV cache's dtype and
shape from the graph, and whether the graph takes `logits_to_keep` (`models.logits_rows`: the
output layer on the last rows only). `terminated_by` turns a cancel event into ONNX Runtime's
terminate flag, which stops a pass between two graph nodes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specsteer.errors import GenerationCancelled
from specsteer.models.logits_rows import LOGITS_TO_KEEP
from specsteer.runtime.base import Flag
from specsteer.runtime.folder import FolderModel, check_rewind

_DTYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
_CANCEL_POLL_S = 0.005  # how often a pass that can be cancelled looks at its events


class OrtGraphModel(FolderModel):
    """A compiled folder loaded in raw ONNX Runtime: the session and the names it is fed by."""

    def __init__(self, folder: str | Path, *, threads: int = 1, verify: bool = False) -> None:
        super().__init__(folder, verify=verify)
        info = self.info
        self.threads = threads
        decoder = info.genai["decoder"]
        options = self._options()
        path = self.folder / decoder.get("filename", "model.onnx")
        try:
            self._ort = ort.InferenceSession(self._graph(path), options,
                                             providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph types
            raise info.load_error(exc) from exc
        names = decoder["inputs"]
        self._layers = int(decoder["num_hidden_layers"])
        self._input_ids = names["input_ids"]
        self._mask = names["attention_mask"]
        self._past = [
            (names["past_key_names"] % i, names["past_value_names"] % i)
            for i in range(self._layers)
        ]
        outs = decoder["outputs"]
        self._logits = outs["logits"]
        self._present = [
            (outs["present_key_names"] % i, outs["present_value_names"] % i)
            for i in range(self._layers)
        ]
        inputs = {i.name: i for i in self._ort.get_inputs()}
        past_key = inputs[self._past[0][0]]
        self._kv_dtype = _DTYPES[past_key.type]
        self._kv_heads = int(past_key.shape[1])
        self._head_size = int(decoder["head_size"])
        self._ids_dtype = np.int32 if inputs[self._input_ids].type == "tensor(int32)" else np.int64
        self._mask_dtype = np.int32 if inputs[self._mask].type == "tensor(int32)" else np.int64
        # the output layer on the last rows only (models.logits_rows); older folders lack it
        self.keeps_rows = any(i.name == LOGITS_TO_KEEP
                              for i in self._ort.get_overridable_initializers())
        self._pad_id = int(info.genai.get("pad_token_id", 0) or 0)
        if not 0 <= self._pad_id < self.vocab_size:
            self._pad_id = 0

    def _options(self) -> ort.SessionOptions:
        """The session's options: its threads, quiet logs, the folder's external weights."""
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.add_session_config_entry(
            "session.model_external_initializers_file_folder_path", str(self.folder)
        )
        return options

    def _graph(self, path: Path) -> str | bytes:
        """What the session loads: the folder's graph file (a subclass may rewrite it)."""
        return str(path)


class CachedSession:
    """What a raw runtime's session is besides its cache: a length a lock guards (held while a
    pass reads or writes the cache), and a rewind that is an index move."""

    def __init__(self, max_length: int) -> None:
        self.max_length = max_length
        self._length = 0
        self._lock = threading.Lock()

    @property
    def length(self) -> int:
        return self._length

    def rewind(self, length: int) -> None:
        with self._lock:
            check_rewind(length, self._length)
            self._length = length


@contextlib.contextmanager
def terminated_by(cancel: Sequence[Flag | None]) -> Iterator[ort.RunOptions | None]:
    """RunOptions whose terminate flag a watcher thread raises once any flag is set; a run
    it stopped comes out as `GenerationCancelled` (ONNX Runtime raises a bare Fail)."""
    events = [event for event in cancel if event is not None]
    if not events:
        yield None
        return
    if any(event.is_set() for event in events):
        raise GenerationCancelled("cancelled before the pass")
    options = ort.RunOptions()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(_CANCEL_POLL_S):
            if any(event.is_set() for event in events):
                options.terminate = True
                return

    watcher = threading.Thread(target=watch, name="specsteer-pass-cancel", daemon=True)
    watcher.start()
    try:
        yield options
    except Exception as exc:
        if options.terminate:
            raise GenerationCancelled("cancelled during the pass") from exc
        raise
    finally:
        done.set()
        watcher.join()
