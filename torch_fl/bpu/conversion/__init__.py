"""From a partition's FX graph to a (quantized) ONNX model: freezing, export, Q/DQ, calibration."""
