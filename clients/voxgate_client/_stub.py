"""The ``voxgate.v1.VoiceGateway`` methods on a grpc.aio channel, without generated gRPC code.

grpcio-tools stamps its own version into ``*_pb2_grpc.py`` and that file refuses to load on an
older grpcio, which would tie this client's grpcio floor to whichever tools generated it. The
service has five methods; binding them by path here keeps the client's only generated code the
message module (``_proto``), whose protobuf 5.29 gencode loads on protobuf 5.29 through 7.x.
"""

from __future__ import annotations

from typing import Any

import grpc

from ._proto import voxgate_pb2 as pb

__all__ = ["SERVICE", "VoiceGatewayStub"]

#: The fully qualified service name; method paths are ``/SERVICE/Method``.
SERVICE = "voxgate.v1.VoiceGateway"


class VoiceGatewayStub:
    """Callables for each RPC, as the generated stub would build them.

    Attributes are grpc.aio multi-callables (``Converse(metadata=...)`` returns a stream-stream
    call; ``Synthesize(request, metadata=...)`` a unary-stream call). They are typed ``Any``
    because grpc.aio ships no type information.
    """

    def __init__(self, channel: grpc.aio.Channel) -> None:
        def stream(name: str) -> Any:
            return channel.stream_stream(
                f"/{SERVICE}/{name}",
                request_serializer=pb.ConverseRequest.SerializeToString,
                response_deserializer=pb.ConverseResponse.FromString,
            )

        self.Converse: Any = stream("Converse")
        self.StreamingRecognize: Any = stream("StreamingRecognize")
        self.Synthesize: Any = channel.unary_stream(
            f"/{SERVICE}/Synthesize",
            request_serializer=pb.SynthesizeRequest.SerializeToString,
            response_deserializer=pb.SynthesizeResponse.FromString,
        )
        self.ListModels: Any = channel.unary_unary(
            f"/{SERVICE}/ListModels",
            request_serializer=pb.ListModelsRequest.SerializeToString,
            response_deserializer=pb.ListModelsResponse.FromString,
        )
        self.ListVoices: Any = channel.unary_unary(
            f"/{SERVICE}/ListVoices",
            request_serializer=pb.ListVoicesRequest.SerializeToString,
            response_deserializer=pb.ListVoicesResponse.FromString,
        )
