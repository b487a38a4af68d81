"""SIP bridge: phone calls in over SIP/RTP (UDP), one gateway ``Converse`` stream per call."""

from __future__ import annotations

from voxgate.bridges.bots import Bot, BotFileError, EchoBot, RuleBot, SilentBot, load_bot
from voxgate.bridges.sip._bridge import BridgeConfig, ReferOutcome, SipBridge
from voxgate.bridges.sip.cli import add_sip_arguments, run_sip

__all__ = [
    "Bot",
    "BotFileError",
    "BridgeConfig",
    "EchoBot",
    "ReferOutcome",
    "RuleBot",
    "SilentBot",
    "SipBridge",
    "add_sip_arguments",
    "load_bot",
    "run_sip",
]
