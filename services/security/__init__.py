"""Security of the control and data planes: transfer capabilities (capability.py)."""
