"""One call as stages, each one concern, wired by :class:`voxgate.gateway.session.CallSession`.

Modelled on Pipecat's frame processors (each concern one processor, events flow one way) and
uvicorn's ``ServerState`` (one owner for what the tasks share). The session reads the client's
events and routes them; each stage holds its own state and is given, at construction, the
other stages it calls:

* :mod:`.ingress`: caller audio in: decode and resample, the rate limit and chunk checks, the
  call's pace (bulk or real time), in-band DTMF, the echo guard and the reference it hears;
* :mod:`.turn_taking`: the caller's turns (gateway/turns.py decides; this keeps their books);
* :mod:`.recognition`: finals, speculative finals, the language the interims learn;
* :mod:`.interims`: when an interim decode runs (:class:`~.interims.InterimPolicy`, pure) and
  the driver that runs it;
* :mod:`.barge_in`: the caller heard over a reply, and when that stops it (the policy itself
  is :mod:`voxgate.gateway.barge_in`);
* :mod:`.playback`: replies: synthesis, pacing, marks, stop and clear, the length cap.

:mod:`.options` holds the call's settings (:class:`~.options.CallConfig`). Nothing here knows
gRPC or protobuf.
"""

from __future__ import annotations
