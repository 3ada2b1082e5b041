"""Process metrics (metrics.py)."""
