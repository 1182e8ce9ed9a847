"""A real CUDA model op for the device check (tests/device/check.py; not part of the package, not a test).

``cuda_model_mapper`` builds, on first use, a small byte-level transformer
deterministically (``torch.manual_seed(0)`` on the CPU, then moved to the
op's device: ``cuda`` where torch sees a GPU, else ``cpu``), records each
load as one JSON line in ``loads_file`` (pid, CUDA_VISIBLE_DEVICES,
ray.get_gpu_ids(), device name, load seconds, parameter count), and per batch
writes a float score per row into ``score_key``: the model's mean-pooled
output over the text's first ``max_bytes`` bytes, through a fixed linear head,
in float32 with TF32 off. Nothing here patches Data-Juicer's CUDA detection:
on the GPU machine Data-Juicer sees the real GPU and puts the op in actor mode
by itself. Loaded by Data-Juicer through ``custom_operator_paths``; pytest
never imports it (no ``test_`` prefix).
"""

from __future__ import annotations

import json
import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


def _build(d_model: int, layers: int, max_bytes: int):
    import torch
    from torch import nn

    torch.manual_seed(0)

    class ByteScorer(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(257, d_model, padding_idx=256)
            self.pos = nn.Parameter(torch.randn(max_bytes, d_model) * 0.02)
            layer = nn.TransformerEncoderLayer(
                d_model, nhead=max(1, d_model // 64), dim_feedforward=4 * d_model, dropout=0.0, batch_first=True
            )
            self.enc = nn.TransformerEncoder(layer, num_layers=layers, enable_nested_tensor=False)
            self.head = nn.Linear(d_model, 1)

        def forward(self, ids, pad):
            x = self.emb(ids) + self.pos[: ids.shape[1]]
            x = self.enc(x, src_key_padding_mask=pad)
            keep = (~pad).unsqueeze(-1).to(x.dtype)
            pooled = (x * keep).sum(1) / keep.sum(1).clamp(min=1.0)
            return self.head(pooled).squeeze(-1)

    return ByteScorer().eval()


@OPERATORS.register_module("cuda_model_mapper")
class CudaModelMapper(Mapper):
    """Scores each row with a small deterministic torch model, loaded once per process on first use."""

    _accelerator = "cuda"
    _batched_op = True

    def __init__(
        self,
        loads_file: str = "",
        d_model: int = 768,
        layers: int = 4,
        max_bytes: int = 128,
        score_key: str = "cuda_score",
        *args,
        **kwargs,
    ):
        super().__init__(*args, **kwargs)
        self.loads_file = loads_file
        self.d_model = d_model
        self.layers = layers
        self.max_bytes = max_bytes
        self.score_key = score_key
        self._model = None
        self._device = None

    def _load(self):
        import torch

        t0 = time.monotonic()
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cudnn.benchmark = False
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = _build(self.d_model, self.layers, self.max_bytes).to(device)
        if device == "cuda":
            torch.cuda.synchronize()
        secs = time.monotonic() - t0
        try:
            import ray

            gpu_ids = [str(g) for g in ray.get_gpu_ids()] if ray.is_initialized() else None
        except Exception as e:
            gpu_ids = f"error: {e!r}"
        record = {
            "pid": os.getpid(),
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "ray_gpu_ids": gpu_ids,
            "device": device,
            "device_name": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "load_secs": round(secs, 3),
            "params": sum(p.numel() for p in model.parameters()),
            "mem_allocated_mb": round(torch.cuda.memory_allocated() / 2**20, 1) if device == "cuda" else 0,
        }
        if self.loads_file:
            with open(self.loads_file, "a") as f:
                f.write(json.dumps(record) + "\n")
        self._device = device
        return model

    def process_batched(self, samples):
        import torch

        if self._model is None:
            self._model = self._load()
        texts = samples[self.text_key]
        n, m = len(texts), self.max_bytes
        ids = torch.full((n, m), 256, dtype=torch.long)
        for i, t in enumerate(texts):
            b = t.encode("utf-8")[:m] or b" "
            ids[i, : len(b)] = torch.tensor(list(b), dtype=torch.long)
        pad = ids == 256
        with torch.inference_mode():
            out = self._model(ids.to(self._device), pad.to(self._device)).float().cpu().tolist()
        samples[self.score_key] = [float(x) for x in out]
        return samples
