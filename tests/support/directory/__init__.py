"""The DirectoryStore contract (contract.py) and what it runs on (harness.py)."""
