"""Load generation and benchmarks for the sandbox service."""
