"""Stand-in for hbdk4.compiler.onnx (tests only)."""

from hbdk4.compiler import Module


def export(model_proto):
    return Module(model_proto.SerializeToString())
