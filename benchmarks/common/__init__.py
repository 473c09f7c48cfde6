"""Helpers shared by the benchmark suites: number formatting, JSONL records, page footers."""
