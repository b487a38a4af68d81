"""voxgate's public protocol packages (generated code lives in ``voxgate.v1``)."""
