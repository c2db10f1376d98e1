"""Layer 3: what proves an ONNX file: structural check, parity with PyTorch, branch coverage, localization."""
