"""Benchmarks: each compares ours with a baseline in the same run and prints the ratio."""
