"""The client's own generated ``voxgate.v1`` stubs (protobuf 5.29 gencode; see generate_stubs.sh).

The server keeps its stubs in ``voxgate.v1`` (protobuf 7 gencode). These are generated from the
same ``.proto`` with the same file name, so when both are imported in one process they resolve
to one descriptor and the same message classes.
"""
