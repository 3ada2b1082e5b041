"""The router's half of the release (docs/design.md, The release): following and moving the
record the directory keeps (controller.py), freezing the manifest (manifest.py), the
promotion gates (gates.py) and the rollback's steps (rollback.py)."""
