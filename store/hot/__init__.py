"""The hot tier: a trainer's in-process copy of its hottest rows, written back to the store behind it."""
