"""Runtime pieces every service uses: gRPC server setup, addresses, logging."""
