"""Layer 0: errors, diagnostics, input specs, sample inputs, the typed stage records and ONNX file helpers.

Nothing here imports from the rest of onnxport (docs/architecture.md)."""
