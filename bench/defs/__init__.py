"""Benchmark definitions, one module per kernel family; each exports ``BENCHMARKS``."""
