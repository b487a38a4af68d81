"""The neutral package: what the server, the bridges and the client library all need.

It sits below every other layer (an import contract checks that it imports none of them, nor
gRPC): the wire audio codecs (:mod:`.pcm`) and asyncio cancellation that never swallows the
caller's own cancellation (:mod:`.aio`). The server imports it as ``voxgate.common``; the client
distribution carries the same files as ``voxgate_client._common``, so a client encodes exactly as
the server decodes and cancels its tasks the same way, without shipping the server.
"""
