"""The router's half of the release (article 0x0FF-0x0FG): following and moving the
record the directory keeps (controller.py), freezing the manifest (manifest.py), the
promotion gates (gates.py) and the rollback's steps (rollback.py)."""
