"""What prepare is asked for: its own module, so that prepare.driver and prepare.existing import it without a cycle."""

from __future__ import annotations

from dataclasses import dataclass, field

from data_juicer_elastic.job.manifest import Policy


@dataclass(frozen=True)
class PrepareRequest:
    dataset_path: str  # a JSONL file or a directory
    job_dir: str
    recipe_text: bytes  # saved verbatim as recipe.yaml; must be a YAML mapping
    policy: Policy
    media_keys: tuple[str, ...] = ("images", "audios", "videos")
    index_keys: tuple[str, ...] = ()
    versions: dict[str, str] = field(default_factory=dict)
