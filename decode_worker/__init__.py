"""Decode worker: reservations, K/V receive, validate, publish, continuous batching."""
