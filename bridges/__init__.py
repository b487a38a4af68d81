"""The doors from a phone network into the gateway: the SIP bridge and the media-stream adapter.

They are clients of the gateway built on :mod:`voxgate_client` (they hold a call and hand it to
a bot over the bot contract), and they run beside the server as their own daemons; they live
apart from the client library so that ``pip install voxgate-client`` carries none of them.
"""
