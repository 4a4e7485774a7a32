"""Stand-in for the board's hbm_runtime module (tests only): runs the ONNX inside a stand-in .hbm
with ONNX Runtime and returns outputs in reverse order, so callers must match by name."""

import json

import numpy as np
import onnxruntime as ort

CALLS = []


class HB_HBMRuntime:
    def __init__(self, path):
        data = open(path, "rb").read()
        magic, header, onnx_bytes = data.split(b"\n", 2)
        if magic != b"HBM-STANDIN":
            raise RuntimeError(f"{path}: not an hbm file")
        self.header = json.loads(header)
        options = ort.SessionOptions()
        options.add_session_config_entry("session.disable_quant_qdq", "1")
        self.session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])
        self.model_names = ["model0"]
        self.input_names = {"model0": [i.name for i in self.session.get_inputs()][::-1]}
        self.output_names = {"model0": [o.name for o in self.session.get_outputs()]}
        self.input_dtypes = {"model0": {n: "float32" for n in self.input_names["model0"]}}

    def run(self, feed):
        CALLS.append({k: v.__array_interface__["data"][0] for k, v in feed.items()})
        for name, array in feed.items():
            assert isinstance(array, np.ndarray) and array.dtype == np.float32, name
        names = self.output_names["model0"]
        values = self.session.run(names, dict(feed))
        return {"model0": dict(reversed(list(zip(names, values, strict=False))))}
