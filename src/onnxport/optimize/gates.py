"""The gates a variant's task metric must pass, for every model kind: one record, one place.

The plain path judges the worst-row cosine of the outputs (of the mean-pooled embedding for sentence encoders)
and, for classifiers, top-1 agreement over the case matrix; the decoder judges the lowest logit cosine over its
step cases and teacher-forced top-1 agreement (PyTorch's greedy tokens fed back, the variant's argmax compared
at each step). Both read :data:`GATES`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Gates:
    """The lowest cosine and top-1 agreement a quantized or reduced-precision variant may show."""

    cosine_min: float = 0.99
    top1_min: float = 0.95

    def to_dict(self) -> dict:
        return {"cosine_min": self.cosine_min, "top1_min": self.top1_min}


GATES = Gates()
COSINE_MIN = GATES.cosine_min
TOP1_MIN = GATES.top1_min
