"""Benchmarks: figures for the notes, printed and never asserted."""
