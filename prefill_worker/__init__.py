"""Prefill worker: prompt compute with prefix reuse, K/V send to the reserved destination."""
