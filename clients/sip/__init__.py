"""SIP bridge: phone calls in over SIP/RTP (UDP), one gateway ``Converse`` stream per call."""

from __future__ import annotations

from clients.sip._bots import BotFileError, EchoBot, RuleBot, SilentBot, load_bot
from clients.sip._bridge import BridgeConfig, SipBridge
from clients.sip.base import Bot, BotFactory
from clients.sip.cli import add_sip_arguments, run_sip

__all__ = [
    "Bot",
    "BotFactory",
    "BotFileError",
    "BridgeConfig",
    "EchoBot",
    "RuleBot",
    "SilentBot",
    "SipBridge",
    "add_sip_arguments",
    "load_bot",
    "run_sip",
]
