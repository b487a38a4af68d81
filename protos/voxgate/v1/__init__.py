"""Generated Python code for the voxgate.v1 gRPC contract (see voxgate.proto)."""
