"""The TextClassifier from the ONNX export tutorial: an embedding, a Transformer encoder and a linear head.

    onnxport convert examples/text_classifier.py:TextClassifier \
        --model-args '{"vocab_size": 30000, "embed_dim": 256, "num_classes": 10}' \
        -i 'input_ids:int64[batch,seq]' -d batch=1..64 -d seq=1..512 -o out/text_classifier
"""

import torch
import torch.nn as nn


class TextClassifier(nn.Module):
    def __init__(self, vocab_size: int = 30000, embed_dim: int = 256, num_classes: int = 10, num_layers: int = 4,
                 nhead: int = 8):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, embed_dim)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(embed_dim, nhead=nhead, batch_first=True),
            num_layers=num_layers,
            enable_nested_tensor=False,
        )
        self.classifier = nn.Linear(embed_dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.embed(x)
        x = self.encoder(x)
        x = x.mean(dim=1)  # global average pooling
        return self.classifier(x)
