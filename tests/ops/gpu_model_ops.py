"""The model-backed test op on its CUDA path, on a machine without a GPU.

Importing this module (Data-Juicer does, in the worker and in every Ray
process that unpickles the op) makes Data-Juicer see the Ray cluster's
logical GPUs as real ones: ``is_cuda_available`` answers True and
``ray_available_gpu_memories`` gives each logical GPU 16 GiB free, which is
what nvidia-smi would report. The rest (``num_gpus`` placement, actor-mode
scheduling, CUDA_VISIBLE_DEVICES per actor) is Ray's own, for real: start
Ray with ``ray start --head --num-gpus N``.
"""

from __future__ import annotations

import os
import time

import data_juicer.ops.base_op as base_op
import data_juicer.utils.ray_utils as ray_utils
import data_juicer.utils.resource_utils as resource_utils
from data_juicer.ops.base_op import OPERATORS, Mapper


def _logical_gpu_memories() -> list[int]:
    import ray

    return [16 * 1024] * int(ray.cluster_resources().get("GPU", 0))


ray_utils.ray_available_gpu_memories = _logical_gpu_memories
resource_utils.is_cuda_available = base_op.is_cuda_available = lambda: True


@OPERATORS.register_module("gpu_model_mapper")
class GpuModelMapper(Mapper):
    """Loads its "model" on first use (recording pid and CUDA_VISIBLE_DEVICES in ``loads_file``)."""

    _accelerator = "cuda"
    _batched_op = True

    def __init__(self, loads_file: str = "", load_secs: float = 0.5, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loads_file = loads_file
        self.load_secs = load_secs
        self._model = None

    def process_batched(self, samples):
        if self._model is None:
            time.sleep(self.load_secs)
            with open(self.loads_file, "a") as f:
                f.write(f"{os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
            self._model = {"scale": 2}
        samples["text_len"] = [len(t) * self._model["scale"] for t in samples[self.text_key]]
        return samples
