"""Deduplication as stages over the same claims (docs/DEDUP.md): the parts that need neither Ray nor Data-Juicer."""
