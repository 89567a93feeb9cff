"""Per-table row policies: which ids get a row (admission), which rows go (eviction), what the rest read."""
