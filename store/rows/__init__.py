"""Rows as data, whatever holds them: the row codec, id hashing, id -> slot tables and id set operations."""
