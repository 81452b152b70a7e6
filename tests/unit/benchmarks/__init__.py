"""Unit tests for the benchmark scripts' pure helpers."""
