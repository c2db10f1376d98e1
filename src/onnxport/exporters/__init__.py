"""Layer 2: the export strategy chain (dynamo, TorchScript, cond, script), control-flow rewrites and the
custom-op translation for the dynamo exporter."""
