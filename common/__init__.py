"""The neutral package: what the server, the bridges and the client library all need.

It sits below every other layer (an import contract checks that it imports none of them, nor
gRPC): the wire audio codecs (:mod:`.pcm`), asyncio cancellation that never swallows the
caller's own cancellation (:mod:`.aio`), and contract messages filled from events by field name
(:mod:`.messages`; each side passes in its own generated message, so no protobuf is imported
here). The server imports it as ``voxgate.common``; the client distribution carries the same
files as ``voxgate_client._common``, so a client encodes exactly as the server decodes, maps
events to messages the same way and cancels its tasks the same way, without shipping the server.
"""
