"""The plugin's logger, named as LiveKit's plugins name theirs."""

import logging

logger = logging.getLogger("livekit.plugins.voxgate")
