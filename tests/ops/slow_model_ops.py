"""A model-backed op for tests and benchmarks: its "model" loads slowly on first use, and each load is recorded.

``slow_model_mapper`` appends ``<pid>`` to ``loads_file`` every time an
instance loads its model (``load_secs`` of sleep, standing in for weights
being read), then tags each row with the length of its text. If
``die_file`` exists when a batch arrives, the op removes it and kills its own
process: an actor that dies mid-shard.
"""

from __future__ import annotations

import os
import time

from data_juicer.ops.base_op import OPERATORS, Mapper


@OPERATORS.register_module("slow_model_mapper")
class SlowModelMapper(Mapper):
    _batched_op = True

    def __init__(self, loads_file: str = "", load_secs: float = 0.5, die_file: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loads_file = loads_file
        self.load_secs = load_secs
        self.die_file = die_file
        self._model = None

    def _load(self) -> dict:
        time.sleep(self.load_secs)
        if self.loads_file:
            with open(self.loads_file, "a") as f:
                f.write(f"{os.getpid()} {os.environ.get('CUDA_VISIBLE_DEVICES', '')}\n")
        return {"scale": 1}

    def process_batched(self, samples):
        if self._model is None:
            self._model = self._load()
        if self.die_file and os.path.exists(self.die_file):
            os.unlink(self.die_file)
            os._exit(1)
        samples["text_len"] = [len(t) * self._model["scale"] for t in samples[self.text_key]]
        return samples
