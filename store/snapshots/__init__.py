"""Point-in-time copies of a deployment's rows: shard format, manifest, storage, taking and restoring."""
