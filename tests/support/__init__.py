"""Helpers shared by the test lanes and the benchmarks (scripts/bench_*.py import only these).

- process: the repository root, stand-in builds, fresh interpreters;
- sshd: a real OpenSSH server on loopback (SshServer) and HOME/XDG isolation (isolated_env);
- models, zoo: models written here (tests/compile's set; the architecture families);
- public_zoo: torchvision / timm / transformers models built from their own definitions;
- trained: ImageNet-trained MobileNetV2 features and real photos from inside wheels;
- ort: ONNX Runtime's static QDQ quantizer, the int8 peer the benchmarks and tests compare with.

Fixtures stay in the conftest.py files; they call these.
"""
