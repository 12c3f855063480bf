"""What both sides import, and what travels to the cluster with every job: the spec, the names both sides agree on
(:mod:`.contract`), provenance digests and seals, storage I/O and the supported versions.

Imports neither Airflow nor Ray at module level, nor a side (hooks, operators, triggers, the engine).
"""
