"""Diffusion models from diffusers folders (docs/diffusion.md): UNets, ControlNets, DiT transformers and
autoencoders, each with inputs made up from its config and run through the one pipeline."""

from onnxport.diffusion.component import Component, load
from onnxport.diffusion.inputs import Plan, plan

__all__ = ["Component", "Plan", "load", "plan"]
