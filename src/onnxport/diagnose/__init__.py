"""Layer 5: explanations. ``explain``: the diagnostics of a run, built from its records (loader, export attempts,
placement, branches, divergence); ``rootcause``: those diagnostics ranked, the root cause first; ``machine``: what
``onnxport doctor`` prints about this machine. Nothing is imported here, so ``onnxport doctor`` stays light."""
