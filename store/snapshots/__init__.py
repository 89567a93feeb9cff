"""Point-in-time copies of a deployment's rows: the shard format, the manifest, where they are kept, taking and restoring."""
