"""What prepare is asked for: its own module, so that prepare.driver and prepare.existing import it without a cycle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from data_juicer_elastic.job.manifest import InputFile, Manifest, Policy, ShardSpec, ShardTable


@dataclass(frozen=True)
class PrepareRequest:
    dataset_path: str  # a JSONL file or a directory
    job_dir: str
    recipe_text: bytes  # saved verbatim as recipe.yaml; must be a YAML mapping
    policy: Policy
    media_keys: tuple[str, ...] = ("images", "audios", "videos")
    index_keys: tuple[str, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)

    def manifest(
        self,
        dataset_root: str,
        input_kind: str,
        recipe_sha: str,
        files: tuple[InputFile, ...],
        shards: list[ShardSpec],
        **schema: Any,
    ) -> Manifest:
        """The sealed manifest of what this request prepared (``schema``: ``columns`` or ``parquet``)."""
        return Manifest(
            dataset_path=dataset_root,
            input_kind=input_kind,
            files=files,
            recipe_sha256=recipe_sha,
            versions=dict(self.versions),
            policy=self.policy,
            media_keys=tuple(self.media_keys),
            index_keys=tuple(self.index_keys),
            shards=ShardTable.of(shards),
            total_rows=sum(s.rows for s in shards),
            total_bytes=sum(s.bytes for s in shards),
            created_at=time.time(),
            **schema,
        ).seal()
