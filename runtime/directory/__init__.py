"""The directory's contract on the shared floor: records, transaction states and
outcomes, the cost profile workers publish, the proto mapping and the gRPC client.
kv_directory/ is the service that implements it; everything else imports this."""
