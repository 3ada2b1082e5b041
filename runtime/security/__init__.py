"""Security of the control and data planes: mutual TLS (tls.py, pki.py) and transfer capabilities (capability.py)."""
